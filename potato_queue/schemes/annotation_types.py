"""Every annotation type Potato 2.12.1 has: its kind by Potato's rule, what its answer stores, and whether a run
trains it (and if not, why), in one table.

The kind is Potato's own (`potato.server_utils.iaa.dispatcher.classify_schema`: its `_KIND_BY_TYPE`, and the
three rules that read the config: a multi-label type capped at one choice is nominal, a confidence slider is
continuous, a pairwise scheme's kind follows its `mode`); tests/unit/test_schema_types.py holds this table
equal to Potato's for every type it registers. The stored shape is what Potato's page writes into
user_state.json (`[[{"schema": S, "name": NAME}, VALUE], ...]`, spans apart). A type is trained only where its
answer is one a trainer learns from the item: a label, a set of labels, a point on a scale, a number, labelled
spans. The rest are refused by `validate`, the API, the command line and the page, with the type, its kind
and the reason: a run never reports a score over a target it did not understand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ROW_OF",
    "SchemaType",
    "with_rows",
    "SCHEMA_TYPES",
    "SCHEME_NAME",
    "kind_of_type",
    "pair_key",
    "pairwise_mode",
    "refusal",
    "refusal_text",
    "stored_field",
    "stored_under",
]

#: In `SchemaType.field`: the answer is stored under the scheme's own name.
SCHEME_NAME = "$scheme"


@dataclass(frozen=True)
class SchemaType:
    """One annotation type: Potato's kind, what an answer stores, the field its answer is the value of (where
    the stored name is fixed, not the label), and why no run trains it (None: trained)."""

    kind: str
    stored: str
    field: str | None = None
    refused: str | None = None


_JSON_BLOB = "one JSON document under the scheme's name"
_BLOB = "a structure (JSON), not a label of the item"
_TRACE = "a verdict per step of an agent's trace, not a label of the item"
_SURVEY = "a survey measure of the annotator, not a label of the item"

SCHEMA_TYPES: dict[str, SchemaType] = {
    # Trained: a label, a set, a scale point, a number, spans.
    "radio": SchemaType("nominal", "the label (name and value)"),
    "select": SchemaType("nominal", 'the label under "select-one"', field="select-one"),
    "triage": SchemaType("nominal", 'accept, reject or skip under "decision"', field="decision"),
    "multiselect": SchemaType("multilabel", "each ticked label (name and value)"),
    "hierarchical_multiselect": SchemaType(
        "multilabel", 'the ticked nodes, comma-joined, under "selected_labels"', field="selected_labels"
    ),
    "likert": SchemaType("ordinal", 'the point "1".."size" (name and value), or the label where labels are set'),
    "confidence": SchemaType("ordinal", 'the level "1".."scale_points"; a slider: a number under "confidence_level"'),
    "slider": SchemaType("continuous", 'a number under "slider"'),
    "number": SchemaType("continuous", 'a number under "number"'),
    "vas": SchemaType("continuous", "a decimal number under the scheme's name", field=SCHEME_NAME),
    "pairwise": SchemaType(
        "nominal",
        'binary: A, B or tie under "selection" (a preference between the item\'s two texts: a reward model); '
        'scale: a number under "scale_value"; multi_dimension: A/B/tie per dimension',
    ),
    "span": SchemaType("span", "labelled character spans (instance_id_to_span_to_value)"),
    # Refused: Potato's kind alone does not make a target.
    "conjoint": SchemaType(
        "nominal",
        "the chosen profile's number under the scheme's name",
        refused="its answer picks one of the profiles the item lists (a choice model), not a label of the item",
    ),
    "card_sort": SchemaType(
        "multilabel",
        "the cards sorted into groups (JSON) under the scheme's name",
        refused="its answer sorts the item's cards into groups, not labels of the item",
    ),
    "multirate": SchemaType(
        "matrix",
        "one rating (a label of `labels`) per row of `options`",
        refused="its answer is a rating per row (a matrix): each row trains as a scheme of its own, "
        "named <scheme>:<row>",
    ),
    "constant_sum": SchemaType("matrix", "points per category", refused="its answer is a split of points (a matrix)"),
    "soft_label": SchemaType(
        "matrix", "a share per label", refused="its answer is a distribution over labels (a matrix)"
    ),
    "semantic_differential": SchemaType(
        "matrix", 'a point per "left__right" pair', refused="its answer is a rating per adjective pair (a matrix)"
    ),
    "range_slider": SchemaType(
        "matrix", 'two numbers under "range_low" and "range_high"', refused="its answer is a range (two numbers)"
    ),
    "bws": SchemaType(
        "matrix", "the best and worst of a tuple, by position", refused="its answer ranks a tuple of items"
    ),
    "best_worst_scaling": SchemaType("matrix", "(Potato's other name for bws)", refused="its answer ranks a tuple"),
    "ranking": SchemaType(
        "ranking", 'the labels in ranked order, comma-joined, under "rank_order"', refused="its answer is an order"
    ),
    "error_span": SchemaType("span", _JSON_BLOB, refused="its spans are stored as a JSON document of errors"),
    "extractive_qa": SchemaType("span", _JSON_BLOB, refused="its answer is an answer span to a question (JSON)"),
    "event_annotation": SchemaType("span", "events with their argument spans", refused="its answer is events"),
    "coreference": SchemaType("span", "chains of linked spans", refused="its answer is coreference chains"),
    "span_link": SchemaType("span", "links between spans", refused="its answer is links between spans"),
    "tree_annotation": SchemaType(
        "span", "a path and node annotations (JSON)", refused="its answer is a path through a conversation tree"
    ),
    "text": SchemaType("unsupported", "free text", refused="its answer is free text"),
    "textbox": SchemaType("text", "free text", refused="its answer is free text"),
    "text_edit": SchemaType("text", "an edited text (JSON)", refused="its answer is an edited text"),
    "image_annotation": SchemaType("geometry", 'shapes (JSON) under "_data"', refused="its answer is shapes"),
    "grounding_eval": SchemaType("grounding", 'regions (JSON) under "_data"', refused="its answer is regions"),
    "region_caption": SchemaType("caption", "captions per region (JSON)", refused="its answer is free text"),
    "spatial_annotation": SchemaType("spatial", "3D objects (JSON)", refused="its answer is 3D objects"),
    "volume_annotation": SchemaType("volume", "3D masks (JSON)", refused="its answer is 3D masks"),
    "audio_annotation": SchemaType("temporal", "labelled time segments (JSON)", refused="its answer is segments"),
    "video_annotation": SchemaType("temporal", "labelled time segments (JSON)", refused="its answer is segments"),
    "temporal_grounding": SchemaType("segments", "time segments (JSON)", refused="its answer is segments"),
    "tiered_annotation": SchemaType("segments", "segments per tier (JSON)", refused="its answer is segments"),
    "episode_annotation": SchemaType("episode", "phases, outcome, reward (JSON)", refused=_BLOB),
    "rollout_evaluation": SchemaType("rollout", "break-points and a preference (JSON)", refused=_BLOB),
    "process_reward": SchemaType("trace", _JSON_BLOB, refused=_TRACE),
    "trajectory_eval": SchemaType("trace", _JSON_BLOB, refused=_TRACE),
    "tool_call_review": SchemaType("trace", _JSON_BLOB, refused=_TRACE),
    "failure_attribution": SchemaType("trace", _JSON_BLOB, refused=_TRACE),
    "gui_trajectory": SchemaType("trace", _JSON_BLOB, refused=_TRACE),
    "pure_display": SchemaType("unsupported", "nothing (it only shows content)", refused="it stores no answer"),
    "video": SchemaType("unsupported", "nothing (a player)", refused="it stores no answer"),
    "rubric_eval": SchemaType(
        "unsupported", "a point per criterion", refused="its answer is a rating per criterion (Potato: unsupported)"
    ),
    "cloze": SchemaType("unsupported", "typed text per blank", refused="its answer is free text"),
    "list_experiment": SchemaType("unsupported", "a count", refused=_SURVEY),
    "randomized_response": SchemaType("unsupported", "Yes or No", refused=_SURVEY),
    "price_list": SchemaType("unsupported", _JSON_BLOB, refused=_SURVEY),
    "bdm": SchemaType("unsupported", _JSON_BLOB, refused=_SURVEY),
    "belief_elicitation": SchemaType("unsupported", _JSON_BLOB, refused=_SURVEY),
    "listening_test": SchemaType("unsupported", _JSON_BLOB, refused=_BLOB),
    "spectrogram_annotation": SchemaType("unsupported", 'boxes (JSON) under "_data"', refused=_BLOB),
    "viewer_selection": SchemaType("unsupported", _JSON_BLOB, refused=_BLOB),
    "geo_annotation": SchemaType("unsupported", "map features (JSON)", refused=_BLOB),
    "free_list": SchemaType("unsupported", _JSON_BLOB, refused=_SURVEY),
    "triad_test": SchemaType("unsupported", _JSON_BLOB, refused=_BLOB),
    "ego_network": SchemaType("unsupported", _JSON_BLOB, refused=_SURVEY),
    "interlinear_gloss": SchemaType("unsupported", _JSON_BLOB, refused=_BLOB),
    "multi_document_event": SchemaType("unsupported", _JSON_BLOB, refused=_BLOB),
    "consensus_tracking": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
    "context_attribution": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
    "agent_scorecard": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
    "handoff_review": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
    "agent_interaction_graph": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
    "voice_interaction": SchemaType("unsupported", _JSON_BLOB, refused=_BLOB),
    "multimodal_reasoning": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
    "speech_transcript": SchemaType("unsupported", _JSON_BLOB, refused=_BLOB),
    "tool_contention": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
    "emergent_behavior": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
    "table_grid": SchemaType("unsupported", _JSON_BLOB, refused=_BLOB),
    "trajectory_edit": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
    "code_review": SchemaType("unsupported", _JSON_BLOB, refused=_TRACE),
}

# The pairwise widgets: (kind, the field its answer is stored under, why it is refused).
_PAIRWISE = {
    "binary": ("nominal", "selection", None),
    "scale": ("continuous", "scale_value", None),
    "multi_dimension": ("matrix", None, "its answer is a preference per dimension (a matrix)"),
}


#: A multirate row's own scheme (with_rows) says which scheme and row it is under this key.
ROW_OF = "row_of"


def _row_names(scheme: Mapping[str, Any]) -> list[str]:
    """A multirate's rows as Potato stores them: a string option is its own name, a dict option its `name`."""
    rows: list[str] = []
    options = scheme.get("options")
    for option in options if isinstance(options, list) else []:
        name = option.get("name") if isinstance(option, Mapping) else option
        if name is not None and str(name):
            rows.append(str(name))
    return rows


def with_rows(schemes: list[Any]) -> list[Any]:
    """The config's schemes, each multirate followed by one scheme per row: a labelled likert named
    `<scheme>:<row>` over the multirate's `labels` (its rating scale), marked ROW_OF. A run trains those (a
    multirate's answer is a rating per row, stored as the row's name and the rating)."""
    out = []
    for scheme in schemes:
        out.append(scheme)
        if not isinstance(scheme, Mapping) or _type(scheme) != "multirate" or not scheme.get("name"):
            continue
        labels = scheme.get("labels")
        if not isinstance(labels, list):
            continue  # a multirate without its rating scale: validate says what is wrong with it
        for row in _row_names(scheme):
            out.append(
                {
                    "annotation_type": "likert",
                    "name": f"{scheme['name']}:{row}",
                    "description": f"{scheme.get('description') or scheme['name']}: {row}",
                    "labels": list(labels),
                    ROW_OF: {"scheme": str(scheme["name"]), "row": row},
                }
            )
    return out


def _type(scheme: Mapping[str, Any]) -> str:
    return str(scheme.get("annotation_type") or "").strip().lower()


def pairwise_mode(scheme: Mapping[str, Any]) -> str | None:
    """A pairwise scheme's widget (binary, scale, multi_dimension: Potato's default binary); None for others."""
    if _type(scheme) != "pairwise":
        return None
    return str(scheme.get("mode") or "binary").strip().lower()


def _pairwise(scheme: Mapping[str, Any]) -> tuple[str, str | None, str | None] | None:
    """A pairwise scheme's (kind, stored field, refusal) by its widget (an unknown mode is binary's); None for
    any other scheme."""
    mode = pairwise_mode(scheme)
    return None if mode is None else _PAIRWISE.get(mode, _PAIRWISE["binary"])


def pair_key(scheme: Mapping[str, Any]) -> str | None:
    """The item field a pairwise scheme compares (its `items_key`, Potato's default `text`), else None."""
    return str(scheme.get("items_key") or "text") if pairwise_mode(scheme) else None


def kind_of_type(scheme: Mapping[str, Any]) -> str:
    """Potato's kind of one scheme, by classify_schema's rules ("unsupported" for a type Potato lacks)."""
    atype = _type(scheme)
    found = SCHEMA_TYPES.get(atype)
    kind = found.kind if found is not None else "unsupported"
    if kind == "multilabel" and (scheme.get("max_choices") or scheme.get("max_selections")) == 1:
        return "nominal"  # capped at one choice, it stores one label
    if atype == "confidence" and scheme.get("scale_type") == "slider":
        return "continuous"
    pairwise = _pairwise(scheme)  # one type name, three widgets that store different shapes
    return pairwise[0] if pairwise is not None else kind


def stored_field(scheme: Mapping[str, Any]) -> str | None:
    """The fixed name a scheme stores its answer under, where the answer is that name's value (a pairwise
    "selection", a select's "select-one", a vas's own name, a multirate row's row name); None where the
    stored name is the label."""
    row_of = scheme.get(ROW_OF)
    if isinstance(row_of, Mapping):
        return str(row_of.get("row"))
    pairwise = _pairwise(scheme)
    if pairwise is not None:
        return pairwise[1]
    found = SCHEMA_TYPES.get(_type(scheme))
    field = found.field if found is not None else None
    return str(scheme.get("name")) if field == SCHEME_NAME else field


def refusal(scheme: Mapping[str, Any]) -> str | None:
    """Why no run trains this scheme, in words (None: it is trained)."""
    atype = _type(scheme)
    pairwise = _pairwise(scheme)
    if pairwise is not None:
        return pairwise[2]
    found = SCHEMA_TYPES.get(atype)
    if found is None:
        return f"Potato 2.12 has no annotation type {atype!r}" if atype else "it has no annotation_type"
    return found.refused


def stored_under(scheme: Mapping[str, Any]) -> str:
    """The scheme whose answers hold this one's (a multirate row's: its multirate; any other: itself)."""
    row_of = scheme.get(ROW_OF)
    return str(row_of.get("scheme")) if isinstance(row_of, Mapping) else str(scheme.get("name"))


def refusal_text(scheme: Mapping[str, Any]) -> str | None:
    """The one wording of a refused scheme, for validate, the API, the command line and the page: its name,
    type, Potato's kind and why (None: it is trained)."""
    why = refusal(scheme)
    if why is None:
        return None
    return (
        f"Scheme '{scheme.get('name')}' is {_type(scheme) or 'untyped'} (Potato's kind: {kind_of_type(scheme)}), "
        f"which no trainer trains: {why}"
    )
