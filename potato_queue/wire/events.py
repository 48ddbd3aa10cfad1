"""The worker's event protocol (v1): one JSON object a line on stdout.

Every event is ``{"v": 1, "event": KIND, "t": <epoch seconds>, ...}``:

- ``status {state, step}``
- ``progress {phase, current, total, eta_s}``
- ``metric {split, name, value, step}``
- ``log {level, msg}``
- ``artifact {path, bytes}``
- ``result {status: "success", model_version, metrics, label_order, notes,
  predictions_file, n_predictions}``
- ``error {code, message, install_hint}``
- ``usage {gpus, gpu_seconds, energy_wh, mean_utilization_pct, peak_memory_mb, samples, sample_s}``, or
  ``usage {gpus: [], why}`` for a run the agent measured no GPU of: the agent's, never the worker's
  (agent/gpu_watch.py; sent every minute and at the run's end)

Progress is throttled (at most ~4 lines a second) the way Potato does it, but
a throttled progress line is held back rather than dropped: it is written
before the next event of any kind, or by :meth:`Reporter.flush`, so the last
position of every phase always reaches the reader.
"""

import json
import math
import sys
import threading
import time
from typing import IO, Any, Callable, Dict, Optional

__all__ = [
    "PROTOCOL_VERSION",
    "EVENT_TYPES",
    "AGENT_EVENTS",
    "PROGRESS_INTERVAL_S",
    "make_event",
    "parse_line",
    "Reporter",
    "ErrorsOnly",
]

PROTOCOL_VERSION = 1
EVENT_TYPES = ("status", "progress", "metric", "log", "artifact", "result", "error", "usage")
# Sent by the agent alone: a worker's line of one of these kinds is relayed as a line of its stdout.
AGENT_EVENTS = ("usage",)
PROGRESS_INTERVAL_S = 0.25


def make_event(kind: str, **fields: Any) -> Dict[str, Any]:
    """One protocol event as a dict; raises ValueError for an unknown kind."""
    if kind not in EVENT_TYPES:
        raise ValueError("unknown event type %r (expected one of %s)" % (kind, ", ".join(EVENT_TYPES)))
    payload: Dict[str, Any] = {"v": PROTOCOL_VERSION, "event": kind, "t": round(time.time(), 3)}
    payload.update(fields)
    return payload


def parse_line(line: str) -> Optional[Dict[str, Any]]:
    """The event on one stdout line, or None when the line is not an event."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        payload = json.loads(text)
    except ValueError:
        return None
    if not isinstance(payload, dict) or payload.get("event") not in EVENT_TYPES:
        return None
    return payload


def _finite(value: Any) -> Optional[float]:
    """A JSON-safe number: NaN and infinities become None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class Reporter:
    """Writes protocol events to a stream (stdout by default), thread-safely."""

    def __init__(
        self,
        stream: Optional[IO[str]] = None,
        should_stop: Optional[Callable[[], bool]] = None,
        min_progress_interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._should_stop = should_stop or (lambda: False)
        self._interval = min_progress_interval_s
        self._lock = threading.RLock()
        self._last_progress_at = 0.0
        self._last_phase: Optional[str] = None
        self._pending: Optional[Dict[str, Any]] = None
        self._broken = False

    @property
    def stream(self) -> IO[str]:
        """Where the events go (a data-parallel run's rank 0 writes into it too: ranks.py)."""
        return self._stream

    # -- writing ---------------------------------------------------------

    def _write(self, payload: Dict[str, Any]) -> None:
        if self._broken:
            return
        line = json.dumps(payload, ensure_ascii=False, default=str)
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            # The reader is gone (closed pipe); the run's outcome is the exit code now.
            self._broken = True

    def emit(self, kind: str, **fields: Any) -> Dict[str, Any]:
        """Write one event (after any held-back progress line) and return it."""
        payload = make_event(kind, **fields)
        with self._lock:
            self._flush_pending()
            self._write(payload)
        return payload

    def _flush_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._write(pending)

    def flush(self) -> None:
        """Write a held-back progress line, if any."""
        with self._lock:
            self._flush_pending()

    # -- the event kinds -------------------------------------------------

    def status(self, state: str, step: str = "") -> None:
        """Coarse lifecycle: ``running``, ``evaluating``, ``cancelled``."""
        self.emit("status", state=state, step=step)

    def progress(self, phase: str, current: int, total: int, eta_s: Optional[float] = None) -> None:
        """Position within a phase; throttled, never losing the latest one."""
        eta = None if eta_s is None else _finite(round(float(eta_s), 1))
        payload = make_event("progress", phase=phase, current=int(current), total=int(total), eta_s=eta)
        with self._lock:
            now = time.monotonic()
            final = total > 0 and current >= total
            new_phase = phase != self._last_phase
            if final or new_phase or now - self._last_progress_at >= self._interval:
                if self._pending is not None and self._pending["phase"] != phase:
                    self._flush_pending()  # the old phase's last position
                self._pending = None
                self._write(payload)
                self._last_progress_at = now
                self._last_phase = phase
            else:
                self._pending = payload

    def metric(self, split: str, name: str, value: float, step: int = 0) -> None:
        """One measurement (NaN/inf are sent as null)."""
        self.emit("metric", split=split, name=name, value=_finite(value), step=int(step))

    def log(self, level: str, msg: str) -> None:
        """A human-readable line (levels: debug, info, warning, error)."""
        self.emit("log", level=level, msg=str(msg))

    def artifact(self, path: str, size: Optional[int]) -> None:
        """A file the run produced, relative to the workdir."""
        self.emit("artifact", path=path, bytes=size)

    def result(self, **fields: Any) -> None:
        """The success event; ``status`` is always ``"success"``."""
        fields.pop("status", None)
        self.emit("result", status="success", **fields)

    def error(self, code: str, message: str, install_hint: str = "") -> None:
        """The failure event."""
        self.emit("error", code=code, message=message, install_hint=install_hint)

    def should_stop(self) -> bool:
        """Whether the run was asked to stop."""
        return bool(self._should_stop())


class ErrorsOnly(Reporter):
    """A data-parallel rank's reporter, rank 0 excepted: it says nothing but an error (which its parent
    worker names in the run's error when that rank ends the run; ranks.py)."""

    def _write(self, payload: Dict[str, Any]) -> None:
        if payload.get("event") == "error":
            super()._write(payload)
