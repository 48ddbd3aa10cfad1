"""What a run's record is made of: its states, timestamps, log lines, and the views of it.

The run store (store.py) reads and writes records; this module says what they
look like, so the store's own module is about keeping them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from potato_queue.errors import PotatoQueueError
from potato_queue.worker.files import write_atomic
from potato_queue.worker.text import one_line

__all__ = ["STATES", "FINAL_STATES", "IN_FLIGHT", "FOLDER_FIX", "RunView", "RunFolderError", "write_json_atomic",
           "utc_now", "utc_of", "epoch_of", "log_text", "as_text"]

STATES = ("queued", "starting", "running", "collecting", "succeeded", "failed", "cancelled")
FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
IN_FLIGHT = ("starting", "running", "collecting")
_ALLOWED_FROM = {
    "starting": ("queued",),
    # A pull backend's run stays queued until its agent claims it (AGT-4), then runs.
    "running": ("starting", "queued"),
    "collecting": ("starting", "running"),
    "succeeded": ("collecting",),
    "failed": ("queued", "starting", "running", "collecting"),
    "cancelled": ("queued", "starting", "running", "collecting"),
    "queued": ("queued",),
}
_LIVE_JSON = ("progress", "metrics", "result", "pending_record")
FOLDER_FIX = "make the project's output folder writable again (free space, permissions); the run's record is written then"


def utc_of(epoch_s: float) -> str:
    """An instant as run.json writes it: UTC, milliseconds, `Z`."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_of(text: str | None) -> float | None:
    """An instant run.json wrote (utc_of's text) as epoch seconds; None for none."""
    return None if not text else datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def utc_now() -> str:
    return utc_of(time.time())


def log_text(lines: list[str]) -> str:
    """run.log's line format, the only place it is defined: UTC stamp, one line per entry, its
    control characters escaped (a message cannot forge a line of its own)."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return "".join(f"{stamp} {one_line(line)}\n" for line in lines)


def write_json_atomic(path: Any, data: Any) -> None:
    """A JSON file, written so a reader sees the old or the new, never half."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def as_text(value: Any) -> Any:
    """A value Redis gave as bytes, as text (anything else as it is)."""
    return value.decode() if isinstance(value, bytes) else value


def _created_ms(record: dict[str, Any]) -> float:
    return float(epoch_of(record["created_at"]) or 0.0) * 1000


class RunFolderError(PotatoQueueError):
    """A run's folder cannot be written (disk full, read-only): its record is held in Redis meanwhile."""


def _folder_error(folder: Any, exc: OSError) -> str:
    return f"The run's folder {folder} cannot be written: {exc.strerror or exc}"


@dataclass(frozen=True)
class RunView:
    """What the supervising executor looks at every tick, read in one round trip."""

    exit_code: int | None  # the agent's result, once posted
    artifact_uri: str | None
    message: str | None
    heartbeat_at: float | None  # the agent's last contact (epoch s); None before its first
    cancel_requested: bool
    disk_error: str | None = None  # a write for the run failed: the run cannot go on
    state: str | None = None
    # The agent says the worker waits in a batch scheduler's queue (status `pending`): the run is waiting.
    pending_step: str | None = None
