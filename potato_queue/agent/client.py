"""The per-run calls of the agent protocol (docs/protocol.md), over a Transport.

Standard library only, Python 3.8+: this file is copied to bare hosts. The
transport carries the server, the token, the connections and the one retry
policy; this client only knows which run it speaks for and what each call
means (a 409 after a lost answer, a bundle resumed with Range).
"""

import hashlib
import http.client
import mmap
import os
import threading
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import quote

from potato_queue.agent.backoff import problem_of, retry
from potato_queue.agent.errors import BundleDownloadError
from potato_queue.agent.transport import (
    API_PREFIX,
    DEFAULT_GIVE_UP_S,
    DEFAULT_TIMEOUT_S,
    RETRY_STATUSES,
    ApiError,
    Retryable,
    Transport,
    Unreachable,
    error_detail,
    json_answer,
)
from potato_queue.wire.files import file_sha256

MAX_MESSAGE_CHARS = 4000

__all__ = [
    "API_PREFIX",
    "ApiError",
    "Unreachable",
    "BundleDownloadError",
    "RunClient",
    "AgentClient",
    "file_sha256",
]

BUNDLE_TRIES = 5


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
        reply = self.transport.call(
            "GET",
            self._path("control"),
            query="?wait_s={:g}".format(wait_s),
            timeout_s=wait_s + 15,
            give_up_s=0,
            what="GET control",
        )
        return bool(reply.get("cancel"))

    def post_result(
        self, exit_code: int, artifact_uri: Optional[str], message: Optional[str], give_up_s: Optional[float] = None
    ) -> Dict[str, Any]:
        """POST result: the last call of a run; the reply carries the run's state."""
        # The server takes a message of at most 8000 characters; the start says the most.
        payload = {
            "exit_code": exit_code,
            "artifact_uri": artifact_uri,
            "message": message[:MAX_MESSAGE_CHARS] if message else message,
        }
        try:
            return self.transport.call("POST", self._path("result"), payload, give_up_s=give_up_s, what="POST result")
        except ApiError as exc:
            if exc.status != 409:
                raise
            # One result per run: a retry whose first try was stored (its answer lost) is told so.
            return {"state": "already reported"}

    def upload_predictions(self, path: str, give_up_s: Optional[float] = None) -> Dict[str, Any]:
        """PUT predictions.jsonl, streamed from disk; each try starts from the first byte."""
        return self._upload("predictions", path, "application/x-ndjson", give_up_s)

    def upload_model(self, path: str, give_up_s: Optional[float] = None) -> Dict[str, Any]:
        """PUT the model files as agent/model_files.py packed them, streamed from disk."""
        return self._upload("model", path, "application/octet-stream", give_up_s)

    def _upload(self, route: str, path: str, content_type: str, give_up_s: Optional[float]) -> Dict[str, Any]:
        size = os.path.getsize(path)
        headers = {"Content-Type": content_type, "Content-Length": str(size)}
        policy = self.transport.backoff("PUT " + route, self.transport.patience_s(give_up_s))

        def attempt() -> Dict[str, Any]:
            try:
                with open(path, "rb") as fh:
                    status, data = self.transport.whole(self.transport.request("PUT", self._path(route), fh, headers))
            except (OSError, http.client.HTTPException) as exc:
                raise Retryable(problem_of(exc)) from None
            if status == 409 and policy.failures:
                # An earlier try was stored but its answer was lost.
                return {"bytes": size, "lines": None}
            return json_answer(status, data)

        return retry(attempt, policy)

    # -- the bundle ---------------------------------------------------------------
    def download_bundle(
        self,
        dest: str,
        size: int,
        sha256: str,
        tries: int = BUNDLE_TRIES,
        progress: Optional[Callable[[int], None]] = None,
    ) -> None:
        """bundle.tar.gz into `dest`, resuming a partial file with Range; BundleDownloadError unless whole and verified.
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
            raise BundleDownloadError(
                "the bundle's sha256 is {}, not {} as the job says: refusing it".format(digest, sha256)
            )

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
            raise BundleDownloadError(
                "the bundle download failed {} times (last: {}); got {} of {} bytes".format(
                    policy.failures, policy.problem, _size_of(dest), size
                )
            ) from None
        return hashed.hexdigest()

    def _fetch_bundle(self, dest: str, offset: int, hashed: "_Hashed", progress: Callable[[int], None]) -> None:
        """One GET from byte `offset`, appended to (206) or replacing (200) `dest`."""
        headers = {"Range": "bytes={}-".format(offset)} if offset else {}
        try:
            with self.transport.reading(self.transport.request("GET", self._path("bundle"), None, headers)) as response:
                if response.status == 416:
                    os.unlink(dest)  # the server's bundle is shorter than what we hold: start over
                    raise Retryable("the server refused the range; starting over")
                if response.status in RETRY_STATUSES:
                    raise Retryable("HTTP {}".format(response.status))
                if response.status >= 400:
                    raise ApiError(response.status, error_detail(response.read()))
                held = offset if response.status == 206 else 0
                with open(dest, "ab" if held else "wb", buffering=0) as fh, _Follower(hashed, dest, held) as follower:
                    block = memoryview(bytearray(BLOCK_BYTES))
                    got = response.readinto(block)
                    while got:
                        _write_all(fh, block[:got])
                        held += got
                        follower.written(held)
                        progress(held)
                        got = response.readinto(block)
                    follower.written(held, last=True)
        except (OSError, http.client.HTTPException) as exc:
            raise Retryable(problem_of(exc)) from None


# The bytes just received are written while still in this core's cache, and hashed from the page cache
# by another thread in large mapped reads: handing each block to a writer and a hasher thread instead
# cost 2-3x the CPU in lock hand-offs and cold copies. Writes are 32 KiB, as curl's are about: the
# kernel backs a large write with large page-cache folios, whose fresh memory cost a VM twice the
# kernel time of small ones (docs/decisions.md, P4).
BLOCK_BYTES = 256 * 1024
WRITE_BYTES = 32 * 1024
HASH_READ_BYTES = 4 * 1024 * 1024


def _write_all(fh: Any, data: memoryview) -> None:
    """All of `data` into an unbuffered file, WRITE_BYTES at a time (a write may take only part)."""
    at = 0
    while at < len(data):
        at += fh.write(data[at : at + WRITE_BYTES])


class _Follower:
    """A thread that hashes `path` as it grows, reading behind the writer. What it hashes is what the
    file holds, so a resumed file's old bytes are hashed (again, when `hashed` did not see them) while
    the rest downloads. Leaving the `with` waits until every byte written was hashed."""

    def __init__(self, hashed: "_Hashed", path: str, held: int) -> None:
        if hashed.count > held or not held:
            hashed.reset()  # a file started over, or one whose bytes this download did not all see
        self.hashed, self.path = hashed, path
        self._ready = held  # bytes on disk that may be hashed
        self._published = held
        self._done = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._follow, name="bundle-hasher", daemon=True)

    def __enter__(self) -> "_Follower":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._done = True
            self._cond.notify()
        self._thread.join()

    def written(self, held: int, last: bool = False) -> None:
        """`held` bytes are in the (unbuffered) file; the hasher is woken every HASH_READ_BYTES and at
        the end."""
        if held - self._published < HASH_READ_BYTES and not last:
            return
        with self._cond:
            self._ready = self._published = held
            self._cond.notify()

    def _follow(self) -> None:
        try:
            with open(self.path, "rb", buffering=0) as fh:
                while self._hash_ready(fh.fileno()):
                    pass
        except (OSError, ValueError):
            pass  # the hash is short of the file; hexdigest() reads it again

    def _hash_ready(self, fd: int) -> bool:
        """Hashes what is ready; False once the writer is done and everything is hashed."""
        with self._cond:
            while self._ready <= self.hashed.count and not self._done:
                self._cond.wait()
            ready, done = self._ready, self._done
        while self.hashed.count < ready:
            _hash_mapped(self.hashed, fd, min(HASH_READ_BYTES, ready - self.hashed.count))
        return not (done and self.hashed.count >= ready)


def _hash_mapped(hashed: "_Hashed", fd: int, size: int) -> None:
    """Hashes `size` bytes of the file from byte hashed.count, mapped from the page cache rather than
    copied out of it (a read's copy was a tenth of the download's CPU)."""
    start = hashed.count - hashed.count % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(fd, hashed.count + size - start, access=mmap.ACCESS_READ, offset=start) as mapped:
        view = memoryview(mapped)
        try:
            hashed.update(view[hashed.count - start :])
        finally:
            view.release()


class _Hashed:
    """The sha256 of the first `count` bytes of a file being downloaded, kept across tries."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.digest = hashlib.sha256()
        self.count = 0

    def reset(self) -> None:
        self.digest, self.count = hashlib.sha256(), 0

    def update(self, data: "bytes | memoryview") -> None:
        self.digest.update(data)
        self.count += len(data)

    def hexdigest(self) -> str:
        if self.count != _size_of(self.path):
            # Not every byte was seen (the file was whole already, or the hasher could not read it).
            return file_sha256(self.path)
        return self.digest.hexdigest()


def _no_progress(_held: int) -> None:
    pass


def _size_of(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def AgentClient(
    server: str,
    run_id: str,
    token: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    give_up_s: float = DEFAULT_GIVE_UP_S,
    log: Optional[Callable[[str], None]] = None,
) -> RunClient:
    """A RunClient over a transport of its own (the shape callers of the old AgentClient expect)."""
    return RunClient(Transport(server, token, timeout_s, give_up_s, log), run_id)
