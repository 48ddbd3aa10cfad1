"""Stage 1 of a bundle build, the items' half: the project's schemes and items (annotations.py reads the rest).

Which schemes give a target (schema_kind, target_schemas, by Potato's kinds),
a scale scheme's points or bounds, and the items of the data files (JSON
array, object or lines, Potato's positional ids), as Potato's
`training/dataset.py` reads them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from potato_queue.bounds import clean
from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError

# The public names, then what the other stages of the bundle use.
__all__ = [
    "TARGET_KINDS",
    "Answers",
    "Row",
    "schema_kind",
    "scheme_scale",
    "target_schemas",
    "read_items",
    "schema_names",
]

# Potato's schema kinds (server_utils/iaa/dispatcher.py), by annotation_type.
_KIND_OF_TYPE = {
    atype: kind
    for kind, types in {
        "nominal": "radio select triage pairwise conjoint",
        "ordinal": "likert confidence",
        "continuous": "slider number vas",
        "multilabel": "multiselect hierarchical_multiselect card_sort",
        "matrix": "multirate constant_sum soft_label semantic_differential range_slider bws best_worst_scaling",
        "span": "span error_span event_annotation coreference extractive_qa span_link tree_annotation",
        "text": "textbox text_edit",
        "ranking": "ranking",
        "geometry": "image_annotation",
        "temporal": "audio_annotation video_annotation",
        "episode": "episode_annotation",
        "rollout": "rollout_evaluation",
        "caption": "region_caption",
        "grounding": "grounding_eval",
        "spatial": "spatial_annotation",
        "volume": "volume_annotation",
        "segments": "temporal_grounding tiered_annotation",
        "trace": "process_reward trajectory_eval tool_call_review failure_attribution gui_trajectory",
    }.items()
    for atype in types.split()
}

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
        bounds = {
            "min": _number(scheme, "min_value", "min"),
            "max": _number(scheme, "max_value", "max"),
            "step": _number(scheme, "step"),
        }
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
            f"is one of {', '.join(TARGET_KINDS)}",
        )
    return names


class _Decoder(json.JSONDecoder):
    """json's own decoder that notes a non-finite number (NaN, Infinity, or a number too large for a float):
    what, with a lone surrogate's escape, makes an item unwritable as strict JSON or UTF-8."""

    def __init__(self) -> None:
        self.unclean = False
        super().__init__(parse_float=self._float, parse_constant=self._constant)

    def _float(self, text: str) -> float:
        value = float(text)
        self.unclean = self.unclean or not math.isfinite(value)
        return value

    def _constant(self, text: str) -> float:
        self.unclean = True
        return float(text)


def _items_of_text(content: str, id_key: str, decoder: json.JSONDecoder) -> Iterator[tuple[str, Row]]:
    """(id, item) of one data file (JSON array, object or lines); no id gives Potato's positional one."""
    try:
        payload = decoder.decode(content)
    except json.JSONDecodeError:
        payload = None
    if isinstance(payload, (list, dict)):
        for position, item in enumerate(payload if isinstance(payload, list) else [payload], 1):
            if isinstance(item, dict):
                yield str(item.get(id_key, f"item_{position}")), item
        return
    for number, line in enumerate(content.splitlines(), 1):
        try:
            item = decoder.decode(line) if line.strip() else None
        except json.JSONDecodeError:
            continue  # Potato skips lines that are not JSON (CSV rows, stray text)
        if isinstance(item, dict):
            yield str(item.get(id_key, f"item_{number}")), item


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def read_items(config: ProjectConfig, cleaned: list[str] | None = None) -> dict[str, Row]:
    """{id: item} of every data file. With `cleaned`, items made writable as UTF-8 and strict JSON (a lone
    surrogate, `\\ud800` in a JSON data file, replaced with U+FFFD; a non-finite number as text), their ids
    added to it: only a file that holds one is walked item by item."""
    items: dict[str, Row] = {}
    for path in config.data_paths():
        if not path.is_file():
            raise PotatoQueueError(
                f"data file {path} does not exist, so the bundle would miss its items",
                fix=f"restore the file or correct data_files in {config.config_path}",
            )
        content, decoder = path.read_text(encoding="utf-8"), _Decoder()
        found = dict(_items_of_text(content, config.item_properties.id_key, decoder))
        if cleaned is not None and (decoder.unclean or _SURROGATE_ESCAPE.search(content)):
            cleaned.extend(_clean_items(found))
        items.update(found)
    return items


def _clean_items(items: dict[str, Row]) -> list[str]:
    bad = []
    for iid, row in items.items():
        fixed = clean(row)
        if fixed != row:
            items[iid] = fixed
            bad.append(iid)
    return bad
