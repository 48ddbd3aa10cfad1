"""Stage 1 of a bundle build, the items' half: the project's schemes and items (annotations.py reads the rest).

Which schemes give a target (schema_kind, target_schemas, by Potato's kinds),
a scale scheme's points or bounds, and the items of the data files (every
format Potato's server reads: data_files.py), as Potato's
`training/dataset.py` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from potato_queue.bounds import clean
from potato_queue.bundle.data_files import DataFile, DataFileError, UncleanDecoder, data_files, file_items
from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.schemes import kind_of_type, pairwise_mode, refusal, refusal_text

# The public names, then what the other stages of the bundle use.
__all__ = [
    "Answers",
    "Row",
    "schema_kind",
    "scheme_scale",
    "target_schemas",
    "read_items",
    "schema_names",
]

Row = dict[str, Any]
Answers = dict[str, Any]  # {schema: value_map}, one annotator's or the agreed one for one item


def schema_kind(scheme: Mapping[str, Any]) -> str:
    """Potato's kind of one annotation scheme ("unsupported" when unknown): schemes/annotation_types.py's table."""
    return kind_of_type(scheme)


def _number(scheme: Mapping[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = scheme.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


# Where Potato draws a continuous scheme with bounds or a step the config leaves out: its widget's defaults
# (a slider's step 1; a vas 0..100 in steps of 10**-precision; a confidence slider 0..100 by 1; a pairwise
# scale -3..3 by 1). A number field has none.
_SCALE_DEFAULTS = {
    "slider": {"step": 1},
    "vas": {"min": 0, "max": 100},
    "confidence": {"min": 0, "max": 100, "step": 1},
    "pairwise": {"min": -3, "max": 3, "step": 1},
}


def _ordinal_points(scheme: Mapping[str, Any]) -> list[Any]:
    labels = [str(x.get("name") if isinstance(x, Mapping) else x) for x in scheme.get("labels") or []]
    if str(scheme.get("annotation_type") or "").strip().lower() == "confidence":
        # Its labels are captions: it stores the level "1".."N", N the larger of scale_points (5) and the captions.
        return list(range(1, max(int(_number(scheme, "scale_points") or 5), len(labels)) + 1))
    size = _number(scheme, "size", "scale_points")
    return labels or ([i for i in range(1, int(size) + 1)] if size else [])


def scheme_scale(scheme: Mapping[str, Any]) -> dict[str, Any] | None:
    """A scale scheme's scale as Potato draws it (None for any other kind): an ordinal scheme's points in
    order (a labelled likert's label names, the values it stores; else 1..size; a confidence's levels), a
    continuous one's bounds and step (a slider's min_value/max_value, a number field's min/max, a pairwise
    scale's scale: block), with the widget's defaults where the config sets none."""
    kind = schema_kind(scheme)
    if kind == "ordinal":
        points = _ordinal_points(scheme)
        return {"points": points} if points else None
    if kind == "continuous":
        atype = str(scheme.get("annotation_type") or "").strip().lower()
        nested = scheme.get("scale") if pairwise_mode(scheme) == "scale" else None
        source = nested if isinstance(nested, Mapping) else scheme  # a pairwise scale's bounds are under scale:
        bounds: dict[str, Any] = dict(_SCALE_DEFAULTS.get(atype, {}))
        if atype == "vas":
            precision = _number(scheme, "precision")
            bounds["step"] = 10 ** -int(1 if precision is None else precision)
        found = {
            "min": _number(source, "min_value", "min"),
            "max": _number(source, "max_value", "max"),
            "step": _number(source, "step"),
        }
        bounds.update({k: v for k, v in found.items() if v is not None})
        return bounds
    return None


def target_schemas(config: ProjectConfig) -> list[str]:
    """The config's schemes a run trains (schemes/annotation_types.py: a type whose answer is a target), in config order."""
    return [str(s["name"]) for s in config.annotation_schemes if s.get("name") and refusal(s) is None]


def schema_names(config: ProjectConfig, schemas: Sequence[str] | None) -> list[str]:
    names = list(schemas) if schemas is not None else target_schemas(config)
    unknown = [n for n in names if n not in config.schema_names()]
    trained = target_schemas(config)
    if unknown or not names:
        raise PotatoQueueError(
            f"no annotation scheme named {', '.join(unknown)}" if unknown else "no annotation scheme gives a target",
            fix=f"name schemes of {config.config_path} that a run trains ({', '.join(trained) or 'none'}; "
            "docs/trainers.md has every annotation type and whether it is trained)",
        )
    by_name = {str(s.get("name")): s for s in config.annotation_schemes}
    refused = next((text for n in names if (text := refusal_text(by_name[n]))), None)
    if refused:
        raise PotatoQueueError(
            refused, fix=f"leave it out of the run (schemes a run trains: {', '.join(trained) or 'none'})"
        )
    return names


def read_items(config: ProjectConfig, cleaned: list[str] | None = None) -> dict[str, Row]:
    """{id: item} of every data file, read as Potato reads them (data_files.py; an id on two items refused).
    With `cleaned`, items made writable as UTF-8 and strict JSON (a lone surrogate, `\\ud800` in a JSON data
    file, replaced with U+FFFD; a non-finite number as text), their ids added to it: only a JSON file that
    holds one is walked item by item."""
    items: dict[str, Row] = {}
    props = config.item_properties
    for data_file in data_files(config.data_files, config.task_path):
        decoder = UncleanDecoder()
        found: dict[str, Row] = {}
        for iid, item in file_items(data_file, props.id_key, props.text_key, decoder):
            if iid in found or iid in items:
                raise _used_twice(config, iid, data_file)
            found[iid] = item
        if cleaned is not None and decoder.unclean:
            cleaned.extend(_clean_items(found))
        items.update(found)
    return items


def _used_twice(config: ProjectConfig, iid: str, data_file: DataFile) -> DataFileError:
    """Potato's refusal of an id on two items, naming both (the files read again: it is rare)."""
    props, places = config.item_properties, []
    for each in data_files(config.data_files, config.task_path):
        numbered = enumerate(file_items(each, props.id_key, props.text_key, UncleanDecoder()), 1)
        places += [f"{each.path} item {number}" for number, (other, _) in numbered if other == iid]
        if len(places) >= 2 or each == data_file:
            break
    return DataFileError(
        f"two items have the id {iid!r}: {' and '.join(places[:2])}, and Potato refuses ids used twice",
        fix="ids must be unique across every data file: give one of them another id",
    )


def _clean_items(items: dict[str, Row]) -> list[str]:
    bad = []
    for iid, row in items.items():
        fixed = clean(row)
        if fixed != row:
            items[iid] = fixed
            bad.append(iid)
    return bad
