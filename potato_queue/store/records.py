"""How a run's record is written: timestamps, run.log's lines, atomic JSON, and a folder that takes no writes.

What a run is (its states, its moves, its record's fields) is run.py's; the run
store (run_store.py) keeps records with these helpers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.errors import PotatoQueueError
from potato_queue.wire.files import write_atomic
from potato_queue.wire.text import one_line

__all__ = [
    "LIVE_JSON",
    "FOLDER_FIX",
    "RunFolderError",
    "RunMovedOn",
    "record_lock",
    "write_json_atomic",
    "utc_now",
    "utc_of",
    "epoch_of",
    "log_text",
    "as_text",
    "created_ms",
    "folder_error",
]

LIVE_JSON = ("progress", "result", "pending_record", "gpu_usage")
FOLDER_FIX = (
    "make the project's output folder writable again (free space, permissions); the run's record is written then"
)


def utc_of(epoch_s: float) -> str:
    """An instant as run.json writes it: UTC, milliseconds, `Z`."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_of(text: str | None) -> float | None:
    """An instant run.json wrote (utc_of's text) as epoch seconds; None for none."""
    return None if not text else datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def utc_now(clock: Clock = REAL_CLOCK) -> str:
    return utc_of(clock.now_s())


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


def created_ms(record: Mapping[str, Any]) -> float:
    return float(epoch_of(record["created_at"]) or 0.0) * 1000


class RunFolderError(PotatoQueueError):
    """A run's folder cannot be written (disk full, read-only): its record is held in Redis meanwhile."""


def folder_error(folder: Any, exc: OSError) -> str:
    return f"The run's folder {folder} cannot be written: {exc.strerror or exc}"


class RunMovedOn(PotatoQueueError):
    """A step of a run found its record moved on meanwhile (a sweep or a cancel ended it): nothing was written."""


@contextlib.contextmanager
def record_lock(folder: Any) -> Iterator[None]:
    """Held while a run's record is checked against its state and written: a slow step of the run and a
    sweep that ends it, in two threads or two processes, then write run.json (and Potato's row) one after
    the other, never the older over the newer. A folder that cannot be opened is written without it (the
    write then says why)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # the lock goes with it
