"""What a value from outside may look like before it is stored: depth, size, finite, encodable.

Anything stored is served back (GET /runs, the job an agent fetches, the
events list), so a value that cannot be served must not get in: JSON
nested hundreds deep (the encoder's recursion limit turns every later read
into a 500), numbers like 1e400 (JSON has no Infinity), and lone surrogates
(`"\\ud800"` parses, and then cannot be written as UTF-8).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_PARAMS_BYTES",
    "MAX_METRIC_NAME_CHARS",
    "MAX_METRIC_TEXT_CHARS",
    "MAX_METRICS_PER_RUN",
    "MAX_LIVE_TEXT_CHARS",
    "depth_of",
    "too_deep",
    "clean",
    "clean_flat",
    "json_size",
    "shortened",
]

MAX_DEPTH = 20
MAX_PARAMS_BYTES = 64 * 1024
# What a run's record keeps of its agent's events (runs/ingest.py). The record is read by every listing
# (GET /runs, the Training page's stream, twice a second), so what a token holder puts there is bounded:
# a metric is a number or a short text under a short `<split>/<name>`, and a run has at most so many names
# (a trainer logs a handful per split; a name per step is a bug, and would grow the record for ever).
MAX_METRIC_NAME_CHARS = 200
MAX_METRIC_TEXT_CHARS = 200
MAX_METRICS_PER_RUN = 1000
# Step, error and progress text: one line of the runs table; longer is cut, saying how much was cut.
MAX_LIVE_TEXT_CHARS = 1000
_SURROGATE = re.compile("[\ud800-\udfff]")


def depth_of(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep lists and objects nest in `value` (a scalar is 0); counting stops past `limit`."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            depth += 1
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def too_deep(value: Any, what: str, limit: int = MAX_DEPTH) -> str | None:
    """The problem, when `value` nests deeper than `limit`."""
    depth = depth_of(value, limit)
    return (
        f"{what} nests {depth if depth <= limit else f'more than {limit}'} levels deep; at most {limit} are accepted"
        if depth > limit
        else None
    )


def _scalar(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf", "nan": readable, and valid JSON
    if isinstance(value, str) and _SURROGATE.search(value):
        return _SURROGATE.sub("\ufffd", value)
    return value


_PLAIN = (int, bool, type(None))


def clean_flat(value: dict[str, Any]) -> dict[str, Any] | None:
    """`value` itself when it is one level of plain, servable scalars (what nearly every event is),
    else None (then too_deep() and clean() decide). The hot path of an events batch: no walk, no copy."""
    for key, item in value.items():
        if not key.isascii() and _SURROGATE.search(key):
            return None  # a key is text too: a lone surrogate there is as unservable as in a value
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                return None
        elif isinstance(item, float):
            if not math.isfinite(item):
                return None
        elif not isinstance(item, _PLAIN):
            return None
    return value


def clean(value: Any) -> Any:
    """`value` with non-finite numbers as text and lone surrogates replaced (call after too_deep)."""
    if isinstance(value, dict):
        return {_scalar(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return _scalar(value)


def json_size(value: Any) -> int:
    """Bytes of `value` as compact JSON."""
    return len(json.dumps(value, separators=(",", ":"), default=str).encode("utf-8", "replace"))


def shortened(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how many more there were (unchanged when within it)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"
