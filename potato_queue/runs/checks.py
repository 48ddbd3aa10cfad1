"""What a prediction's value may be, by its scheme's kind: checked before anything is stored or scored.

A run's host sends its predictions; Potato's store keeps them and its page pre-fills from them, so a value
outside what the scheme can hold is refused here, naming the value (runs/gate.py says which prediction):

- a continuous scheme's (a slider, a number, a vas): a finite number inside the scale's bounds;
- an ordinal scheme's (a likert): one of its points (a labelled likert's label names, else 1..size);
- a set (a multiselect): each of the scheme's labels at most once;
- spans: integer offsets, 0 <= start < end <= the item's text length, a label of the scheme, each span
  once, at most MAX_SPANS_PER_ITEM of them (100,000 copies of one span made an annotator's page stall).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_SPANS_PER_ITEM", "value_problem"]

#: The most spans (or set entries) one prediction for one item may hold, the gate's cap before any other check
#: (docs/potato-prelabels.md).
MAX_SPANS_PER_ITEM = 1000


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _continuous(label: Any, scale: Mapping[str, Any]) -> str | None:
    value = _number(label)
    if value is None:
        return f"value {label!r} is not a finite number"
    low, high = _number(scale.get("min")), _number(scale.get("max"))
    if (low is not None and value < low) or (high is not None and value > high):
        return f"value {label!r} is outside the scale's {scale.get('min')}..{scale.get('max')}"
    return None


def _ordinal(label: Any, scale: Mapping[str, Any]) -> str | None:
    points = scale.get("points") or []
    if not points:
        return None
    named = {str(p) for p in points if isinstance(p, str)}
    numbered = {float(p) for p in points if _number(p) is not None}
    if (isinstance(label, str) and label in named) or (_number(label) is not None and float(label) in numbered):
        return None
    return f"value {label!r} is not one of the scale's points ({', '.join(map(str, points))})"


def _a_set(label: Any, labels: set[str]) -> str | None:
    given = label if isinstance(label, list) else [label]
    if len(given) != len({str(x) for x in given}):
        return "a label is given twice in the set"
    if labels and len(given) > len(labels):
        return f"{len(given)} labels, and the schema has {len(labels)}"
    return None


def _span_problem(entry: Any, labels: set[str], text_length: int | None) -> str | None:
    if not isinstance(entry, dict):
        return f"span {entry!r} is not an object"
    start, end = entry.get("start"), entry.get("end")
    if not (isinstance(start, int) and isinstance(end, int)) or isinstance(start, bool) or isinstance(end, bool):
        return f"span offsets {start!r}..{end!r} are not whole numbers"
    limit = text_length if text_length is not None else end
    if not 0 <= start < end <= limit:
        return f"span {start}..{end} is not inside the item's text (0..{text_length})"
    label = entry.get("label")
    if labels and label not in labels:
        return f"span label {label!r} is not one of the schema's labels ({', '.join(sorted(labels))})"
    return None


def _spans(payload: Any, labels: set[str], text_length: int | None) -> str | None:
    entries = payload if isinstance(payload, list) else [payload]  # their number the gate capped already
    seen = set()
    for entry in entries:
        problem = _span_problem(entry, labels, text_length)
        if problem is not None:
            return problem
        key = (entry["start"], entry["end"], entry.get("label"))
        if key in seen:
            return f"span {entry['start']}..{entry['end']} {entry.get('label')!r} is given twice"
        seen.add(key)
    return None


def value_problem(
    kind: str,
    label: Any,
    payload: Any,
    labels: set[str],
    scale: Mapping[str, Any] | None,
    text_length: int | None,
) -> str | None:
    """Why a prediction's value cannot be one of its scheme's answers (None: it can). `label` is the
    prediction's label (gate.label_of), `payload` its payload, `scale` the bundle's scale of the scheme."""
    if kind == "continuous":
        return _continuous(label, scale or {})
    if kind == "ordinal":
        return _ordinal(label, scale or {})
    if kind == "multilabel":
        return _a_set(label, labels)
    if kind == "span":
        return _spans(payload, labels, text_length)
    return None
