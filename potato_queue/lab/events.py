"""Training events for Potato's webhooks: which run moves are events, who gets them, and what they say.

A project's `webhooks` block is Potato's own (`webhooks: {enabled, endpoints: [{name, url, secret, events,
active}]}`): an endpoint lists the events it wants (`*` for all), Potato's annotation events and these
alike. The events are `training.run.queued`, `.started`, `.succeeded`, `.failed`, `.cancelled` (a run's
moves, told by the store as it makes them) and `.preempted` (the worker said its machine was taken back).
The payload has Potato's shape, `{event, timestamp, data}`; `data` names the run, its backend, trainer,
state, scores, duration, GPU-hours and its page. Pure: store/webhooks.py queues an event, and
processes/webhooks.py delivers it, signed and retried as Potato does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from potato_queue.config import ProjectConfig
from potato_queue.lab.usage import energy_kwh, gpu_hours
from potato_queue.run import RunState

__all__ = [
    "TRAINING_EVENTS",
    "PREEMPTED",
    "event_of_state",
    "Endpoint",
    "endpoints",
    "wants",
    "routing_lines",
    "payload",
    "page_url",
]

QUEUED = "training.run.queued"
STARTED = "training.run.started"
SUCCEEDED = "training.run.succeeded"
FAILED = "training.run.failed"
CANCELLED = "training.run.cancelled"
PREEMPTED = "training.run.preempted"
TRAINING_EVENTS = (QUEUED, STARTED, SUCCEEDED, FAILED, CANCELLED, PREEMPTED)
_OF_STATE = {
    RunState.QUEUED: QUEUED,
    RunState.RUNNING: STARTED,
    RunState.SUCCEEDED: SUCCEEDED,
    RunState.FAILED: FAILED,
    RunState.CANCELLED: CANCELLED,
}


def event_of_state(state: str) -> str | None:
    """The event a move into `state` is (None: starting and collecting are no event)."""
    try:
        return _OF_STATE.get(RunState(state))
    except ValueError:
        return None


@dataclass(frozen=True)
class Endpoint:
    """One endpoint of the project's webhooks block, as Potato reads it."""

    name: str
    url: str
    events: tuple[str, ...]
    active: bool = True
    secret: str = field(default="", repr=False)
    timeout_seconds: float = 10


def endpoints(config: ProjectConfig) -> list[Endpoint]:
    """The active endpoints with a URL, when the project's webhooks are enabled; [] otherwise."""
    block = (config.model_extra or {}).get("webhooks")
    if not isinstance(block, Mapping) or not block.get("enabled"):
        return []
    found = []
    for raw in block.get("endpoints") or []:
        if not isinstance(raw, Mapping) or not raw.get("url"):
            continue  # Potato skips an endpoint with no URL too
        events = raw.get("events") or []
        found.append(
            Endpoint(
                name=str(raw.get("name", "unnamed")),
                url=str(raw["url"]),
                events=tuple(str(e) for e in (events if isinstance(events, list) else [])),
                active=bool(raw.get("active", True)),
                secret=str(raw.get("secret") or ""),
                timeout_seconds=_seconds(raw.get("timeout_seconds")),
            )
        )
    return [endpoint for endpoint in found if endpoint.active]


def _seconds(value: Any) -> float:
    """An endpoint's timeout_seconds; Potato's 10 for one that is not a number (Potato's own block, which
    Potato checks, not us: a value it would take must not stop a run's events)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return 10.0
    return seconds if 0 < seconds < 3600 else 10.0


def wants(endpoint: Endpoint, event: str) -> bool:
    """Potato's rule: the event is listed, or `*` is."""
    return "*" in endpoint.events or event in endpoint.events


def routing_lines(config: ProjectConfig) -> list[str]:
    """What `validate` and `training check` say: which endpoint gets which training events."""
    found = endpoints(config)
    if not found:
        return []
    lines = []
    for endpoint in found:
        got = [event for event in TRAINING_EVENTS if wants(endpoint, event)]
        if not got:
            said = "no training event (it lists none of: " + ", ".join(TRAINING_EVENTS) + ")"
        else:
            said = "every training event (*)" if "*" in endpoint.events else ", ".join(got)
        unsigned = "" if endpoint.secret else "; unsigned: it has no secret"
        lines.append(f"webhook {endpoint.name!r} ({endpoint.url}) gets {said}{unsigned}")
    return lines


def page_url(server_url: str | None, run_id: str) -> str | None:
    """The run's page, where the server said it is reached."""
    return None if not server_url else f"{server_url.rstrip('/')}/admin/training/runs/{run_id}"


def _scores(held_out: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per scheme, the test split's numbers (val where a run has no test split)."""
    out = {}
    for schema, splits in held_out.items():
        split = (splits or {}).get("test") or (splits or {}).get("val") or {}
        numbers = {k: v for k, v in split.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if numbers:
            out[str(schema)] = numbers
    return out


def payload(
    event: str, record: Mapping[str, Any], *, server_url: str | None, now_iso: str, duration_s: float | None
) -> dict[str, Any]:
    """Potato's webhook payload shape for one training event of `record` (`duration_s`: start to end, once
    it ended)."""
    usage = record.get("gpu_usage")
    measured = isinstance(usage, Mapping) and bool(usage.get("gpus"))
    return {
        "event": event,
        "timestamp": now_iso,
        "data": {
            "run_id": record["run_id"],
            "backend": record.get("backend"),
            "trainer": record.get("trainer"),
            "schemas": list(record.get("schemas") or []),
            "state": record.get("state"),
            "trigger": record.get("trigger"),
            "scores": _scores(record.get("held_out") or {}),
            "duration_s": None if duration_s is None else round(duration_s, 3),
            "gpu_hours": round(gpu_hours(usage), 6) if measured else None,
            "energy_kwh": round(energy_kwh(usage), 6) if measured and usage.get("energy_wh") is not None else None,
            "error": record.get("error"),
            "url": page_url(server_url, str(record["run_id"])),
        },
    }
