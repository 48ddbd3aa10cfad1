"""Stage 1 of a bundle build: reading the project's items and annotations.

Which schemes give a target (schema_kind, target_schemas, by Potato's kinds),
the items of the data files (JSON array, object or lines, Potato's positional
ids), and every annotator's answers from <output_annotation_dir>/<user>/
user_state.json in both of Potato's encodings, label maps, spans and image
shapes alike, as Potato's `training/dataset.py` reads them.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from potato_queue.bounds import clean
from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError

# The public names, then what the other stages of the bundle use.
__all__ = ["TARGET_KINDS", "Answers", "Row", "count_annotations", "schema_kind", "scheme_scale", "target_schemas",
           "unencodable_items",
           "Annotations", "annotator_files", "answered_ids", "no_cycle_collection", "read_annotations", "read_items", "schema_names"]

# Potato's schema kinds (server_utils/iaa/dispatcher.py), by annotation_type.
_KIND_OF_TYPE = {atype: kind for kind, types in {
    "nominal": "radio select triage pairwise conjoint", "ordinal": "likert confidence",
    "continuous": "slider number vas", "multilabel": "multiselect hierarchical_multiselect card_sort",
    "matrix": "multirate constant_sum soft_label semantic_differential range_slider bws best_worst_scaling",
    "span": "span error_span event_annotation coreference extractive_qa span_link tree_annotation",
    "text": "textbox text_edit", "ranking": "ranking", "geometry": "image_annotation",
    "temporal": "audio_annotation video_annotation", "episode": "episode_annotation",
    "rollout": "rollout_evaluation", "caption": "region_caption", "grounding": "grounding_eval",
    "spatial": "spatial_annotation", "volume": "volume_annotation", "segments": "temporal_grounding tiered_annotation",
    "trace": "process_reward trajectory_eval tool_call_review failure_attribution gui_trajectory",
}.items() for atype in types.split()}

#: The kinds Potato turns into a target. The rest (free text, matrices, traces)
#: would give a meaningless label, so a bundle without named schemes skips them.
TARGET_KINDS = ("nominal", "multilabel", "ordinal", "continuous", "span", "geometry", "grounding")

Row = dict[str, Any]
Answers = dict[str, Any]  # {schema: value_map}, one annotator's or the agreed one for one item


def schema_kind(scheme: Mapping[str, Any]) -> str:
    """Potato's kind of one annotation scheme ("unsupported" when unknown)."""
    atype = str(scheme.get("annotation_type") or "").strip().lower()
    kind = _KIND_OF_TYPE.get(atype, "unsupported")
    if kind == "multilabel" and (scheme.get("max_choices") or scheme.get("max_selections")) == 1:
        return "nominal"  # capped at one choice, it stores one label
    if atype == "confidence" and scheme.get("scale_type") == "slider":
        return "continuous"
    if atype == "pairwise":  # one type name, three widgets that store different shapes
        mode = str(scheme.get("mode") or "binary").strip().lower()
        return {"scale": "continuous", "multi_dimension": "matrix"}.get(mode, "nominal")
    return kind


def _number(scheme: Mapping[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = scheme.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def scheme_scale(scheme: Mapping[str, Any]) -> dict[str, Any] | None:
    """A scale scheme's scale as Potato draws it (None for any other kind): an ordinal scheme's points in
    order (a labelled likert's label names, the values it stores; else 1..size), a continuous one's bounds
    and step (a slider's min_value/max_value, a number field's min/max)."""
    kind = schema_kind(scheme)
    if kind == "ordinal":
        labels = [str(x.get("name") if isinstance(x, Mapping) else x) for x in scheme.get("labels") or []]
        size = _number(scheme, "size", "scale_points")
        points: list[Any] = labels or ([i for i in range(1, int(size) + 1)] if size else [])
        return {"points": points} if points else None
    if kind == "continuous":
        bounds = {"min": _number(scheme, "min_value", "min"), "max": _number(scheme, "max_value", "max"),
                  "step": _number(scheme, "step")}
        return {k: v for k, v in bounds.items() if v is not None}
    return None


def target_schemas(config: ProjectConfig) -> list[str]:
    """The config's schemes that give a training target, in config order."""
    return [str(s["name"]) for s in config.annotation_schemes if s.get("name") and schema_kind(s) in TARGET_KINDS]


def schema_names(config: ProjectConfig, schemas: Sequence[str] | None) -> list[str]:
    names = list(schemas) if schemas is not None else target_schemas(config)
    unknown = [n for n in names if n not in config.schema_names()]
    if unknown or not names:
        raise PotatoQueueError(
            f"no annotation scheme named {', '.join(unknown)}" if unknown else "no annotation scheme gives a target",
            fix=f"name schemes of {config.config_path} ({', '.join(config.schema_names()) or 'none'}) whose kind "
            f"is one of {', '.join(TARGET_KINDS)}")
    return names


def _items_of_text(content: str, id_key: str) -> Iterator[tuple[str, Row]]:
    """(id, item) of one data file (JSON array, object or lines); no id gives Potato's positional one."""
    try:
        payload = json.loads(content)
    except json.JSONDecodeError:
        payload = None
    if isinstance(payload, (list, dict)):
        for position, item in enumerate(payload if isinstance(payload, list) else [payload], 1):
            if isinstance(item, dict):
                yield str(item.get(id_key, f"item_{position}")), item
        return
    for number, line in enumerate(content.splitlines(), 1):
        try:
            item = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue  # Potato skips lines that are not JSON (CSV rows, stray text)
        if isinstance(item, dict):
            yield str(item.get(id_key, f"item_{number}")), item


def read_items(config: ProjectConfig) -> dict[str, Row]:
    items: dict[str, Row] = {}
    for path in config.data_paths():
        if not path.is_file():
            raise PotatoQueueError(f"data file {path} does not exist, so the bundle would miss its items",
                                   fix=f"restore the file or correct data_files in {config.config_path}")
        items.update(_items_of_text(path.read_text(encoding="utf-8"), config.item_properties.id_key))
    return items


def unencodable_items(items: dict[str, Row]) -> list[str]:
    """Make every item writable as UTF-8 (a lone surrogate, `\\ud800` in a JSON data file, cannot be):
    the ids of the items that held one, now replaced with U+FFFD."""
    bad = []
    for iid, row in items.items():
        fixed = clean(row)
        if fixed != row:
            items[iid] = fixed
            bad.append(iid)
    return bad


@dataclass
class Annotations:
    """{(user, instance): answers}, and the annotators in first-seen order."""

    index: dict[tuple[str, str], Answers] = field(default_factory=dict)
    users: list[str] = field(default_factory=list)
    n_records: int = 0


def _label_maps(raw: Any) -> Answers:
    """Both encodings as {schema: {label: value}}: [[{schema, name}, value], ...] or the older dict."""
    if isinstance(raw, dict):
        return raw
    maps: Answers = {}
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, (list, tuple)) and len(entry) == 2:
            label, value = entry
            if isinstance(label, dict):
                maps.setdefault(label.get("schema", ""), {})[label.get("name", "")] = value
            else:
                maps.setdefault(str(label), {})[""] = value
    return maps


def _span_lists(raw: Any) -> dict[str, list[Any]]:
    """{schema: [span, ...]} from the list encoding ([span, value] pairs) or the older dict."""
    spans: dict[str, list[Any]] = {}
    for entry in raw if isinstance(raw, list) else []:
        span = entry[0] if isinstance(entry, (list, tuple)) and len(entry) == 2 else entry
        if isinstance(span, dict):
            spans.setdefault(span.get("schema", ""), []).append(span)
    for schema, found in (raw if isinstance(raw, dict) else {}).items():
        if isinstance(found, (list, dict)):
            spans[schema] = found if isinstance(found, list) else list(found.values())
    return spans


def _image_objects(maps: Answers, image_schemas: set[str]) -> dict[str, list[Any]]:
    """An image_annotation scheme keeps its shapes as a list (or its JSON text) in a label value."""
    found: dict[str, list[Any]] = {}
    for schema in image_schemas & set(maps):
        for value in maps[schema].values() if isinstance(maps[schema], dict) else []:
            try:
                value = json.loads(value) if isinstance(value, str) else value
            except json.JSONDecodeError:
                continue
            if isinstance(value, list):
                found[schema] = value
    return found


def _user_records(state: Mapping[str, Any], image_schemas: set[str]) -> Iterator[tuple[str, Answers]]:
    """(instance id, answers) for every instance one user state mentions."""
    labels = state.get("instance_id_to_label_to_value") or {}
    spans = state.get("instance_id_to_span_to_value") or {}
    for iid in {**dict.fromkeys(labels), **dict.fromkeys(spans)} if spans else labels:
        maps = _label_maps(labels.get(iid, {}))
        if not (spans or image_schemas):  # most projects: label maps alone (a large one's time is here)
            yield str(iid), maps
            continue
        answers = dict(maps)  # spans, then image shapes, replace a label map of the same scheme
        answers.update({s: {"_spans": found} for s, found in _span_lists(spans.get(iid, [])).items()})
        answers.update({s: {"_objects": found} for s, found in _image_objects(maps, image_schemas).items()})
        yield str(iid), answers


def _read_state(path: Path) -> Mapping[str, Any]:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PotatoQueueError(f"{path} cannot be read as JSON ({exc})",
                               fix="restore it from a backup, or move that annotator's folder aside") from None
    return state if isinstance(state, dict) else {}


def count_annotations(config: ProjectConfig, schemas: Sequence[str]) -> int:
    """How many (annotator, item) answers name one of `schemas`: auto-retrain's measure of new work."""
    wanted = set(schemas)
    return sum(1 for answers in read_annotations(config).index.values() if wanted & set(answers))


@contextlib.contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Reading a project makes millions of small dicts and lists and no reference cycles: Python's cycle
    collector, woken by every 700 of them, walks all the live ones each time (two thirds of a 100,000-item
    project's parse time). Paused while it reads, as it was before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def answered_ids(config: ProjectConfig) -> set[str]:
    """The items someone has answered: read_annotations' items without their answers (a file at a time, only
    the ids kept), what the insight leaves out of "what to label next"."""
    blobs = []
    with no_cycle_collection():
        for _, path in annotator_files(config):
            state = _read_state(path)
            # One string per file, so that nothing of the parsed file outlives it: the long-running server
            # gives its memory back (ids kept one by one would pin the parse's memory pages).
            blobs.append("\n".join(str(iid) for key in ("instance_id_to_label_to_value", "instance_id_to_span_to_value")
                                    for iid, raw in (state.get(key) or {}).items() if raw))
            del state
    return {iid for blob in blobs for iid in blob.split("\n") if iid}


def annotator_files(config: ProjectConfig) -> list[tuple[str, Path]]:
    """Each annotator's (folder name, user_state.json), the folders in sorted order (it decides ties); a folder
    without one (training/) is no annotator."""
    out = config.output_path
    return [(entry, out / entry / "user_state.json") for entry in (sorted(os.listdir(out)) if out.is_dir() else [])
            if (out / entry / "user_state.json").is_file()]


def read_annotations(config: ProjectConfig) -> Annotations:
    found = Annotations()
    image_schemas = {str(s.get("name")) for s in config.annotation_schemes
                     if s.get("annotation_type") == "image_annotation"}
    for entry, path in annotator_files(config):
        state = _read_state(path)
        user = str(state.get("user_id", entry))
        for iid, answers in _user_records(state, image_schemas):
            found.n_records += 1
            if user and iid and user not in found.users:
                found.users.append(user)  # counted even when every answer is empty, as Potato does
            if user and iid and answers:
                found.index[(user, iid)] = answers
    return found
