"""Events from a worker (relayed by its agent) into the run's record.

One batch is one append to events.jsonl, one Redis pipeline for the live
state (step, progress, metrics, error, result, heartbeat) and one append to
run.log for the lines an admin reads. Nothing here loops over Redis per
event: a chatty trainer sends thousands of events a second.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from potato_queue.store import RunStore

__all__ = ["ingest_events", "summarize", "LOGGED_LEVELS"]

# Log events at these levels reach run.log; debug/info stay in events.jsonl.
LOGGED_LEVELS = frozenset({"warning", "warn", "error", "critical", "stderr", "stdout"})


def ingest_events(store: RunStore, run_id: str, events: list[dict[str, Any]]) -> None:
    """Record a batch of events; an empty batch is only a heartbeat."""
    paths = store.paths(run_id)
    if events:
        text = "".join(json.dumps(e, separators=(",", ":"), ensure_ascii=False) + "\n" for e in events)
        with open(paths.events, "a", encoding="utf-8") as fh:
            fh.write(text)
    live, metrics, lines = summarize(events)
    store.record_batch(run_id, live, {k: _finite(v) for k, v in metrics.items()})
    if lines:
        store.log(run_id, *lines)


def summarize(events: Iterable[dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """(live hash fields as text, metrics to merge, run.log lines) of a batch; later events win."""
    live: dict[str, str] = {}
    metrics: dict[str, Any] = {}
    lines: list[str] = []
    for event in events:
        kind = event.get("event")
        if kind == "metric":
            metrics[f"{event.get('split')}/{event.get('name')}"] = event.get("value")
        elif kind == "progress":
            live["progress"] = json.dumps({k: event.get(k) for k in ("phase", "current", "total", "eta_s")})
        elif kind == "status":
            _status(event, live, lines)
        elif kind == "log":
            _log_line(event, lines)
        elif kind == "error":
            _error(event, live, lines)
        elif kind == "result":
            live["result"] = json.dumps({k: v for k, v in event.items() if k not in ("v", "event", "t")})
    return live, metrics, lines


def _status(event: dict[str, Any], live: dict[str, str], lines: list[str]) -> None:
    if event.get("state"):
        live["worker_state"] = str(event["state"])  # `pending`: queued in a scheduler (supervise waits)
    step = event.get("step")
    if step:
        live["step"] = str(step)
        lines.append(f"step: {step}")


def _log_line(event: dict[str, Any], lines: list[str]) -> None:
    level = str(event.get("level", "info")).lower()
    if level in LOGGED_LEVELS:
        lines.append(f"[{level}] {event.get('msg', '')}")


def _error(event: dict[str, Any], live: dict[str, str], lines: list[str]) -> None:
    message = str(event.get("message") or event.get("code") or "error")
    hint = event.get("install_hint")
    text = f"{message} (fix: {hint})" if hint else message
    live["error"] = text
    lines.append(f"error: {text}")


def _finite(value: Any) -> Any:
    # Redis' cjson refuses NaN and Infinity; keep them readable as text.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
