"""The per-run calls of the agent protocol (docs/protocol.md), over a Transport.

Standard library only, Python 3.8+: this file is copied to bare hosts. The
transport carries the server, the token, the connections and the one retry
policy; this client only knows which run it speaks for and what each call
means (a 409 after a lost answer, a bundle resumed with Range).
"""

import hashlib
import http.client
import os
import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import quote

from potato_queue.agent.transport import (
    API_PREFIX,
    CHUNK_BYTES,
    DEFAULT_GIVE_UP_S,
    DEFAULT_TIMEOUT_S,
    RETRY_STATUSES,
    ApiError,
    Retryable,
    Transport,
    UnixHTTPConnection,
    Unreachable,
    error_detail,
    json_answer,
    open_connection,
    problem_of,
    retry,
)

MAX_MESSAGE_CHARS = 4000

__all__ = [
    "API_PREFIX",
    "ApiError",
    "Unreachable",
    "BundleError",
    "UnixHTTPConnection",
    "RunClient",
    "AgentClient",
    "open_connection",
    "file_sha256",
]

BUNDLE_TRIES = 5


class BundleError(Exception):
    """The bundle could not be downloaded whole, or is not the one the job names."""


class RunClient:
    """The calls of docs/protocol.md for one run, with that run's token (held by the transport)."""

    def __init__(self, transport: Transport, run_id: str) -> None:
        self.transport = transport
        self.run_id = run_id
        self._log = transport.log

    @property
    def server(self) -> str:
        """The server's URL (for messages)."""
        return self.transport.server

    def silence_s(self) -> float:
        """Seconds without an answer once a call has failed (AGT-7); see Transport.silence_s."""
        return self.transport.silence_s()

    def _path(self, name: str) -> str:
        return "runs/{}/{}".format(quote(self.run_id, safe=""), name)

    def job(self) -> Dict[str, Any]:
        """GET job: trainer, params, limits, grace, bundle size and sha256."""
        return self.transport.call("GET", self._path("job"), what="GET job")

    def post_events(self, events: List[str], give_up_s: Optional[float] = None) -> bool:
        """Post events given as JSON text (relayed as the worker wrote them); True when told to stop."""
        body = ('{"events":[' + ",".join(events) + "]}").encode("utf-8")
        reply = self.transport.call("POST", self._path("events"), body, give_up_s=give_up_s, what="POST events")
        return bool(reply.get("cancel"))

    def control(self, wait_s: float) -> bool:
        """One long-poll for a cancel (no retry: the caller's loop retries); True when the run is to stop."""
        reply = self.transport.call("GET", self._path("control"), query="?wait_s={:g}".format(wait_s),
                                    timeout_s=wait_s + 15, give_up_s=0, what="GET control")
        return bool(reply.get("cancel"))

    def post_result(self, exit_code: int, artifact_uri: Optional[str], message: Optional[str],
                    give_up_s: Optional[float] = None) -> Dict[str, Any]:
        """POST result: the last call of a run; the reply carries the run's state."""
        # The server takes a message of at most 8000 characters; the start says the most.
        payload = {"exit_code": exit_code, "artifact_uri": artifact_uri,
                   "message": message[:MAX_MESSAGE_CHARS] if message else message}
        try:
            return self.transport.call("POST", self._path("result"), payload, give_up_s=give_up_s, what="POST result")
        except ApiError as exc:
            if exc.status != 409:
                raise
            # One result per run: a retry whose first try was stored (its answer lost) is told so.
            return {"state": "already reported"}

    def upload_predictions(self, path: str, give_up_s: Optional[float] = None) -> Dict[str, Any]:
        """PUT predictions.jsonl, streamed from disk; each try starts from the first byte."""
        size = os.path.getsize(path)
        headers = {"Content-Type": "application/x-ndjson", "Content-Length": str(size)}
        policy = self.transport.backoff("PUT predictions", self.transport.patience_s(give_up_s))

        def attempt() -> Dict[str, Any]:
            try:
                with open(path, "rb") as fh:
                    status, data = self.transport.exchange("PUT", self._path("predictions"), fh, headers)
            except (OSError, http.client.HTTPException) as exc:
                raise Retryable(problem_of(exc)) from None
            if status == 409 and policy.failures:
                # An earlier try was stored but its answer was lost.
                return {"bytes": size, "lines": None}
            return json_answer(status, data)

        return retry(attempt, policy)

    # -- the bundle ---------------------------------------------------------------
    def download_bundle(self, dest: str, size: int, sha256: str, tries: int = BUNDLE_TRIES,
                        progress: Optional[Callable[[int], None]] = None) -> None:
        """bundle.tar.gz into `dest`, resuming a partial file with Range; BundleError unless whole and verified.
        `progress(bytes held)` is called as bytes arrive."""
        resumed = os.path.exists(dest) and os.path.getsize(dest) > 0
        digest = self._download(dest, size, tries, progress)
        if digest != sha256 and resumed:
            # The partial file we resumed may be another bundle's: one more go from the first byte.
            self._log("the resumed bundle does not match its sha256: downloading it again from the start")
            os.unlink(dest)
            digest = self._download(dest, size, tries, progress)
        if digest != sha256:
            os.unlink(dest)
            raise BundleError("the bundle's sha256 is {}, not {} as the job says: refusing it".format(digest, sha256))

    def _download(self, dest: str, size: int, tries: int, progress: Optional[Callable[[int], None]]) -> str:
        """Up to `tries` requests until `dest` holds `size` bytes, each resuming where the last stopped;
        the file's sha256, computed as the bytes arrive (a second pass over a 1 GB file costs a second)."""
        policy = self.transport.backoff("GET bundle", None, max_tries=tries)
        hashed = _Hashed(dest)

        def attempt() -> None:
            have = _size_of(dest)
            if have > size:
                os.unlink(dest)  # not a prefix of this bundle: start over
                have = 0
            if have == size:
                return
            if have:
                self._log("resuming the bundle download at byte {} of {}".format(have, size))
            self._fetch_bundle(dest, have, hashed, progress or _no_progress)
            if _size_of(dest) != size:
                raise Retryable("the download ended at byte {} of {}".format(_size_of(dest), size))

        try:
            retry(attempt, policy)
        except Unreachable:
            raise BundleError("the bundle download failed {} times (last: {}); got {} of {} bytes".format(
                policy.failures, policy.problem, _size_of(dest), size)) from None
        return hashed.hexdigest()

    def _fetch_bundle(self, dest: str, offset: int, hashed: "_Hashed", progress: Callable[[int], None]) -> None:
        """One GET from byte `offset`, appended to (206) or replacing (200) `dest`."""
        headers = {"Range": "bytes={}-".format(offset)} if offset else {}
        try:
            with self.transport.stream("GET", self._path("bundle"), None, headers) as response:
                if response.status == 416:
                    os.unlink(dest)  # the server's bundle is shorter than what we hold: start over
                    raise Retryable("the server refused the range; starting over")
                if response.status in RETRY_STATUSES:
                    raise Retryable("HTTP {}".format(response.status))
                if response.status >= 400:
                    raise ApiError(response.status, error_detail(response.read()))
                hashed.start(response.status == 206)
                with open(dest, "ab" if response.status == 206 else "wb") as fh:
                    sink = _Sink(fh, hashed)
                    held = offset if response.status == 206 else 0
                    try:
                        buffer = sink.take()
                        got = response.readinto(buffer)
                        while got:
                            sink.put(buffer, got)
                            held += got
                            progress(held)
                            buffer = sink.take()
                            got = response.readinto(buffer)
                    finally:
                        sink.close()
        except (OSError, http.client.HTTPException) as exc:
            raise Retryable(problem_of(exc)) from None


class _Sink:
    """Writes the blocks the reader hands it in one thread and hashes them in another, so that reading
    the next block from the socket, writing this one and hashing it overlap (file writes and hashlib
    release the GIL; sha256 alone is ~1 GB/s of one core). A block is reused once both are done with
    it. A write that failed is raised by close()."""

    def __init__(self, fh: Any, hashed: "_Hashed", buffers: int = 4) -> None:
        self.fh, self.hashed = fh, hashed
        self.free = queue.Queue()  # type: queue.Queue[memoryview]
        for _ in range(buffers):
            self.free.put(memoryview(bytearray(CHUNK_BYTES)))
        self.error = None  # type: Optional[OSError]
        self._pending = {}  # type: Dict[int, int]
        self._lock = threading.Lock()
        self._lines = []  # type: List[queue.Queue[Optional[Tuple[memoryview, int]]]]
        self._threads = []  # type: List[threading.Thread]
        for work, name in ((self._write, "bundle-writer"), (self._hash, "bundle-hasher")):
            line = queue.Queue()  # type: queue.Queue[Optional[Tuple[memoryview, int]]]
            self._lines.append(line)
            self._threads.append(threading.Thread(target=self._drain, args=(line, work), name=name, daemon=True))
            self._threads[-1].start()

    def _write(self, block: memoryview) -> None:
        if self.error is None:
            try:
                self.fh.write(block)
            except OSError as exc:
                self.error = exc

    def _hash(self, block: memoryview) -> None:
        self.hashed.update(block)

    def _drain(self, line: "queue.Queue[Optional[Tuple[memoryview, int]]]",
               work: Callable[[memoryview], None]) -> None:
        while True:
            item = line.get()
            if item is None:
                return
            block, size = item
            work(block[:size])
            with self._lock:
                self._pending[id(block)] -= 1
                done = self._pending[id(block)] == 0
            if done:
                self.free.put(block)

    def take(self) -> memoryview:
        return self.free.get()

    def put(self, block: memoryview, size: int) -> None:
        with self._lock:
            self._pending[id(block)] = len(self._lines)
        for line in self._lines:
            line.put((block, size))

    def close(self) -> None:
        for line in self._lines:
            line.put(None)
        for thread in self._threads:
            thread.join()
        if self.error is not None:
            raise self.error


class _Hashed:
    """The sha256 of a file being downloaded, kept as bytes are appended; re-read from disk when a try
    appends to a file whose bytes were not all seen (a partial file from before, a write that failed)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.digest = hashlib.sha256()
        self.count = 0

    def start(self, appending: bool) -> None:
        if not appending:
            self.digest, self.count = hashlib.sha256(), 0
        elif self.count != _size_of(self.path):
            self.digest, self.count = hashlib.sha256(), 0
            with open(self.path, "rb") as fh:
                for block in iter(lambda: fh.read(CHUNK_BYTES), b""):
                    self.update(block)

    def update(self, data: "bytes | memoryview") -> None:
        self.digest.update(data)
        self.count += len(data)

    def hexdigest(self) -> str:
        if self.count != _size_of(self.path):
            self.start(appending=True)  # nothing was downloaded by this call (the file was whole already)
        return self.digest.hexdigest()


def _no_progress(_held: int) -> None:
    pass


def _size_of(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def AgentClient(server: str, run_id: str, token: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                give_up_s: float = DEFAULT_GIVE_UP_S, log: Optional[Callable[[str], None]] = None) -> RunClient:
    """A RunClient over a transport of its own (the shape callers of the old AgentClient expect)."""
    return RunClient(Transport(server, token, timeout_s, give_up_s, log), run_id)


def file_sha256(path: str) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()
