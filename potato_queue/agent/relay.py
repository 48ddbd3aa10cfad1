"""Worker output to the server: readers, the batching sender, heartbeat and control.

Standard library only, Python 3.8+. Each job has its own thread so none can
starve another: a worker that floods stdout only fills the queue (which
then blocks its pipe: back-pressure), while the heartbeat and the control
long-poll keep their own connections and their own pace. Each loop makes
single tries and retries them through the agent's one policy (backoff.py's Backoff),
for ever: AGT-7 (the runner watching silence_s) decides when the server is lost.
"""

import json
import os
import queue
import re
import threading
import time
from typing import IO, Any, Callable, Iterator, List, Optional

from potato_queue.agent.backoff import Backoff
from potato_queue.agent.client import RunClient
from potato_queue.agent.transport import ApiError, Unreachable
from potato_queue.wire.events import AGENT_EVENTS, PROTOCOL_VERSION

__all__ = [
    "make_event",
    "stdout_event",
    "EventRelay",
    "read_stdout",
    "read_stderr",
    "heartbeat_loop",
    "control_loop",
    "MAX_BATCH",
    "FLUSH_S",
]

MAX_BATCH = 500
FLUSH_S = 0.1
MAX_QUEUED = 100000
MAX_LINE = 8000  # characters of one stderr line kept (a progress bar can be endless)
_LINE_BREAK = re.compile(rb"[\r\n]")

Log = Callable[[str], None]


def make_event(kind: str, **fields: Any) -> str:
    """An event of the agent's own, as JSON text."""
    event = {"v": PROTOCOL_VERSION, "event": kind, "t": round(time.time(), 3)}
    event.update(fields)
    return json.dumps(event, separators=(",", ":"))


def stdout_event(raw: bytes) -> Optional[str]:
    """The JSON text to relay for one stdout line (None for a blank line).

    A well-formed event goes on byte for byte (no re-encoding: the cheap path
    a chatty trainer takes); any other line becomes `log {level: "stdout"}`.
    """
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            event = json.loads(text)
        except ValueError:
            event = None
        if isinstance(event, dict) and isinstance(event.get("event"), str) and event["event"] not in AGENT_EVENTS:
            if "v" in event and "t" in event:
                return text
            event.setdefault("v", PROTOCOL_VERSION)
            event.setdefault("t", round(time.time(), 3))
            return json.dumps(event, separators=(",", ":"))
    return make_event("log", level="stdout", msg=text[:MAX_LINE])


_WAKE = ""  # queued by close() to wake the sender; never sent


class EventRelay:
    """A queue of events and the thread that posts them in order, in batches."""

    def __init__(self, client: RunClient, on_cancel: Callable[[], None], log: Log) -> None:
        self.client = client
        self.on_cancel = on_cancel
        self.log = log
        self.queue = queue.Queue(maxsize=MAX_QUEUED)  # type: queue.Queue[str]
        self._closing = threading.Event()
        self._abandoned = threading.Event()
        self._policy = Backoff("events", log, stop=self._abandoned)
        self._thread = threading.Thread(target=self._send_loop, name="events", daemon=True)

    def start(self) -> None:
        """Start the sender thread."""
        self._thread.start()

    def put(self, text: Optional[str]) -> None:
        """Queue one event given as JSON text (None is skipped); blocks while the queue is full."""
        if text is not None:
            self.queue.put(text)

    def emit(self, kind: str, **fields: Any) -> None:
        """Queue an event of the agent's own."""
        self.put(make_event(kind, **fields))

    def close(self, timeout_s: float) -> bool:
        """Send what is queued, then stop; False when that took longer than timeout_s."""
        self._closing.set()
        self.queue.put(_WAKE)  # the sender may be waiting on an empty queue
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._abandoned.set()
            return False
        return True

    def _next_batch(self) -> List[str]:
        try:
            first = self.queue.get_nowait() if self._closing.is_set() else self.queue.get(timeout=FLUSH_S)
        except queue.Empty:
            return []
        batch = [first]
        deadline = time.monotonic() + FLUSH_S
        while len(batch) < MAX_BATCH:
            # Once closing, send what is there now: nothing more is coming.
            left = 0.0 if self._closing.is_set() else deadline - time.monotonic()
            try:
                batch.append(self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait())
            except queue.Empty:
                break
        return [text for text in batch if text is not _WAKE]

    def _send_loop(self) -> None:
        while not self._abandoned.is_set():
            batch = self._next_batch()
            if batch:
                self._post(batch)
            elif self._closing.is_set() and self.queue.empty():
                return

    def _post(self, batch: List[str]) -> None:
        """Post one batch; keep trying while the server is away (AGT-7 decides when to give up)."""
        while True:
            try:
                cancel = self.client.post_events(batch, give_up_s=0)
            except Unreachable as exc:
                if not self._policy.failed(str(exc)):
                    return  # abandoned by close()
                continue
            except ApiError as exc:
                # Asking again gets the same answer: drop the batch rather than block the run.
                self.log("the server refused {} events: {}".format(len(batch), exc))
                _stop_if_run_over(exc, self.on_cancel, self.log)
                return
            self._policy.succeeded()
            if cancel:
                self.on_cancel()
            return


def _split_lines(fd: int) -> Iterator[bytes]:
    r"""Lines ended by \n or \r (progress bars redraw with \r), each at most MAX_LINE bytes."""
    pending = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        parts = _LINE_BREAK.split(pending + chunk)
        pending = parts.pop()
        for part in parts:
            yield part
        if len(pending) > MAX_LINE:
            yield pending
            pending = b""
    if pending:
        yield pending


def read_stdout(stream: IO[bytes], relay: EventRelay) -> None:
    """The worker's events, in order."""
    with stream:
        for raw in stream:
            relay.put(stdout_event(raw))


def read_stderr(stream: IO[bytes], relay: EventRelay) -> None:
    """Each stderr line as `log {level: "stderr"}`."""
    with stream:
        for raw in _split_lines(stream.fileno()):
            text = raw.decode("utf-8", "replace").rstrip()
            if text.strip():
                relay.emit("log", level="stderr", msg=text[:MAX_LINE])


def _stop_if_run_over(exc: ApiError, on_cancel: Callable[[], None], log: Log) -> bool:
    """A 401 means the server no longer accepts the run's token: the run has ended there (its token
    is revoked with its end), so its worker must stop too. True when that was the case."""
    if exc.status != 401:
        return False
    log("the server no longer accepts this run's token (the run has ended there): stopping the worker")
    on_cancel()
    return True


def heartbeat_loop(
    client: RunClient, interval_s: float, stop: threading.Event, on_cancel: Callable[[], None], log: Log
) -> None:
    """An empty batch every interval_s on its own connection, whatever the worker does.

    A failed beat is tried again after the policy's delay, not a whole interval later.
    """
    policy = Backoff("heartbeat", log, stop=stop)
    pause_s = interval_s
    while not stop.wait(pause_s):
        try:
            cancel = client.post_events([], give_up_s=0)
        except (Unreachable, ApiError) as exc:
            if isinstance(exc, ApiError) and _stop_if_run_over(exc, on_cancel, log):
                return
            if not policy.failed(str(exc)):
                return
            pause_s = 0.0  # the policy has waited already
            continue
        policy.succeeded()
        pause_s = interval_s
        if cancel:
            on_cancel()


def control_loop(
    client: RunClient, stop: threading.Event, on_cancel: Callable[[], None], log: Log, wait_s: float = 25.0
) -> None:
    """Long-poll /control so that a cancel arrives within a fraction of a second."""
    policy = Backoff("control", log, stop=stop)
    while not stop.is_set():
        try:
            cancel = client.control(wait_s)
        except (Unreachable, ApiError) as exc:
            if isinstance(exc, ApiError) and _stop_if_run_over(exc, on_cancel, log):
                return
            if not policy.failed(str(exc)):
                return
            continue
        policy.succeeded()
        if cancel:
            on_cancel()
            return
