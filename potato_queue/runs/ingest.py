"""Events from a worker (relayed by its agent) into the run's record.

One batch is one append to events.jsonl, one Redis pipeline for the live
state (step, progress, metrics, error, result, heartbeat) and one append to
run.log for the lines an admin reads. Nothing here loops over Redis per
event: a chatty trainer sends thousands of events a second.

What the record keeps of an event is bounded (potato_queue/bounds.py), since
every listing reads the record: step, error and progress text is cut, and a
metric event whose name or value is out of bounds is left out (of
events.jsonl too) and named in run.log. The batch's other events count as
ever: the agent drops a batch the server refuses, so refusing the batch for
one event would cost all the others.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from potato_queue.bounds import (
    MAX_LIVE_TEXT_CHARS,
    MAX_METRIC_NAME_CHARS,
    MAX_METRIC_TEXT_CHARS,
    MAX_METRICS_PER_RUN,
    shortened,
)
from potato_queue.lab.events import PREEMPTED
from potato_queue.lab.usage import usage_of, within_run
from potato_queue.store import RunStore
from potato_queue.store.records import epoch_of

__all__ = [
    "ingest_events",
    "summarize",
    "metric_name",
    "metric_problem",
    "environment_of",
    "LOGGED_LEVELS",
    "MAX_PACKAGES",
    "MAX_GPUS",
]

# Log events at these levels reach run.log; debug/info stay in events.jsonl.
LOGGED_LEVELS = frozenset({"warning", "warn", "error", "critical", "stderr", "stdout"})
_SHOWN_CHARS = 60  # of a refused metric's name, in run.log
_INT64 = 2**63
_METRIC_FIX = f"fix: report a metric as a number, or as text of at most {MAX_METRIC_TEXT_CHARS} characters"
_NUMBER_FIX = "fix: report an integer this large as a float"
_NAME_FIX = "fix: a shorter split or name"
_MANY_FIX = "fix: report fewer distinct names (a metric's step goes in the event's step field, not in its name)"


def ingest_events(store: RunStore, run_id: str, events: list[dict[str, Any]]) -> None:
    """Record a batch of events; an empty batch is only a heartbeat."""
    paths = store.paths(run_id)
    kept, problems = _within_bounds(events)
    if kept:
        text = "".join(json.dumps(e, separators=(",", ":"), ensure_ascii=False) + "\n" for e in kept)
        with open(paths.events, "a", encoding="utf-8") as fh:
            fh.write(text)
    live, metrics, lines = summarize(kept)
    if "gpu_usage" in live:
        _usage_within_run(store, run_id, live, lines)
    for name in store.in_flight.record_batch(run_id, live, metrics):
        problems.append(
            f"metric {_shown(name)}: the run has {MAX_METRICS_PER_RUN} metric names already, the most "
            f"a run keeps (their values still update); {_MANY_FIX}"
        )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        lines.append(f"warning: {len(problems)} metric event(s) of a batch were not recorded: {problems[0]}{more}")
    if lines:
        store.log(run_id, *lines)
    if any(event.get("event") == "status" and event.get("state") == "preempted" for event in kept):
        # The worker says its machine was taken back (it checkpointed; a requeued job resumes): an event. The
        # batch is recorded already: a record that cannot be read now costs the event, not the batch's retry.
        try:
            store.webhooks.tell(PREEMPTED, store.get(run_id))
        except (KeyError, OSError, ValueError):
            pass


def _usage_within_run(store: RunStore, run_id: str, live: dict[str, str], lines: list[str]) -> None:
    """The usage event's figures bounded by what the run could use since it started (lab/usage.within_run)."""
    try:
        started_s = epoch_of(store.read(run_id).get("started_at"))
    except (KeyError, OSError, ValueError, TypeError):
        started_s = None
    now_s = store.clock.now_s()
    usage, refused = within_run(json.loads(live["gpu_usage"]), now_s - (now_s if started_s is None else started_s))
    live["gpu_usage"] = json.dumps(usage)
    if refused:
        lines.append(f"warning: the agent's GPU use was refused in part: {'; '.join(refused)}")


def metric_name(event: dict[str, Any]) -> str:
    """The name a metric event's value is kept under: `<split>/<name>`."""
    return f"{event.get('split')}/{event.get('name')}"


def metric_problem(name: str, value: Any) -> str | None:
    """Why a metric cannot be kept in the run's record (what was wrong, the value, the fix), or None."""
    if len(name) > MAX_METRIC_NAME_CHARS:
        return (
            f"metric {_shown(name)}: its name is {len(name)} characters long, over the {MAX_METRIC_NAME_CHARS} "
            f"kept; {_NAME_FIX}"
        )
    if value is None or isinstance(value, (bool, float)):
        return None
    if isinstance(value, int):
        return (
            None
            if -_INT64 <= value < _INT64
            else f"metric {_shown(name)}: its value is an integer beyond 64 bits; {_NUMBER_FIX}"
        )
    if isinstance(value, str):
        return (
            None
            if len(value) <= MAX_METRIC_TEXT_CHARS
            else f"metric {_shown(name)}: its value is text of {len(value)} characters; {_METRIC_FIX}"
        )
    kind = "a list" if isinstance(value, list) else "an object"
    return f"metric {_shown(name)}: its value is {kind}; {_METRIC_FIX}"


def _shown(name: str) -> str:
    return f"'{shortened(name, _SHOWN_CHARS)}'"


def _within_bounds(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the events to record, the problems of the metric events left out)."""
    kept: list[dict[str, Any]] = []
    problems: list[str] = []
    for event in events:
        problem = metric_problem(metric_name(event), event.get("value")) if event.get("event") == "metric" else None
        if problem is None:
            kept.append(event)
        else:
            problems.append(problem)
    return kept, problems


def summarize(events: Iterable[dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """(live hash fields as text, metrics to merge, run.log lines) of a batch; later events win."""
    live: dict[str, str] = {}
    metrics: dict[str, Any] = {}
    lines: list[str] = []
    for event in events:
        kind = event.get("event")
        if kind == "metric":
            metrics[metric_name(event)] = _finite(event.get("value"))
        elif kind == "progress":
            live["progress"] = _progress(event)
        elif kind == "status":
            _status(event, live, lines)
        elif kind == "log":
            _log_line(event, lines)
        elif kind == "error":
            _error(event, live, lines)
        elif kind == "usage":
            live["gpu_usage"] = json.dumps(usage_of(event))
        elif kind == "result":
            # What the record takes from it; the whole event stays in events.jsonl.
            version = event.get("model_version")
            live["result"] = json.dumps(
                {
                    "model_version": None if version is None else _text(version),
                    "environment": environment_of(event.get("environment")),
                }
            )
    return live, metrics, lines


# The worker's environment (worker/environment.py), as a hostile worker may send it: known fields, bounded.
ENVIRONMENT_TEXT = ("host", "python", "platform", "code_sha256", "cuda", "driver", "cuda_visible_devices")
MAX_PACKAGES, MAX_GPUS = 32, 64


def environment_of(raw: Any) -> dict[str, Any] | None:
    """The result event's `environment`, cut to its known fields and sizes (None when it sent none)."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {name: _text(raw[name]) if raw.get(name) is not None else None for name in ENVIRONMENT_TEXT}
    packages, gpus = raw.get("packages"), raw.get("gpus")
    packages = packages if isinstance(packages, dict) else {}
    out["packages"] = {_text(k): _text(v) for k, v in list(packages.items())[:MAX_PACKAGES]}
    out["gpus"] = [_text(g) for g in (gpus if isinstance(gpus, list) else [])[:MAX_GPUS]]
    return out


def _text(value: Any) -> str:
    return shortened(str(value), MAX_LIVE_TEXT_CHARS)


def _progress(event: dict[str, Any]) -> str:
    phase = event.get("phase")
    numbers = {k: _number(event.get(k)) for k in ("current", "total", "eta_s")}
    return json.dumps({"phase": None if phase is None else _text(phase), **numbers})


def _number(value: Any) -> float | int | None:
    # A progress bar's numbers; anything else (text, lists, integers past 64 bits, inf) is no position.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value if -_INT64 <= value < _INT64 else None


def _status(event: dict[str, Any], live: dict[str, str], lines: list[str]) -> None:
    if event.get("state"):
        live["worker_state"] = _text(event["state"])  # `pending`: queued in a scheduler (supervise waits)
    step = event.get("step")
    if step:
        live["step"] = _text(step)
        lines.append(f"step: {live['step']}")


def _log_line(event: dict[str, Any], lines: list[str]) -> None:
    level = str(event.get("level", "info")).lower()
    if level in LOGGED_LEVELS:
        lines.append(f"[{level}] {event.get('msg', '')}")


def _error(event: dict[str, Any], live: dict[str, str], lines: list[str]) -> None:
    message = str(event.get("message") or event.get("code") or "error")
    hint = event.get("install_hint")
    text = _text(f"{message} (fix: {hint})" if hint else message)
    live["error"] = text
    lines.append(f"error: {text}")


def _finite(value: Any) -> Any:
    # JSON has no NaN or Infinity; keep them readable as text.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
