"""HTTP/1.1 client of the agent protocol, over TCP or a unix socket.

Standard library only, Python 3.8+: this file is copied to bare hosts. Each
thread keeps its own keep-alive connection (the event sender, the heartbeat
and the control long-poll run side by side). Connection errors are retried
with backoff; every request has a timeout, because a cut network can leave
a forwarded socket that accepts and then hangs (ENVIRONMENT.md).
"""

import hashlib
import http.client
import json
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import quote, unquote, urlsplit

__all__ = [
    "API_PREFIX",
    "ApiError",
    "Unreachable",
    "BundleError",
    "UnixHTTPConnection",
    "AgentClient",
    "open_connection",
    "file_sha256",
]

API_PREFIX = "/api/training/agent/v1"
DEFAULT_TIMEOUT_S = 30.0
BUNDLE_TRIES = 5
_CHUNK = 1024 * 1024
# Statuses that mean "a proxy or the server is restarting": worth retrying like a cut connection.
_RETRY_STATUSES = (502, 503, 504)


class ApiError(Exception):
    """The server answered with an error status; `detail` is its explanation."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__("HTTP {}: {}".format(status, detail))
        self.status = status
        self.detail = detail


class Unreachable(Exception):
    """No answer from the server for as long as the caller was willing to wait."""


class BundleError(Exception):
    """The bundle could not be downloaded whole, or is not the one the job names."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTPConnection through an AF_UNIX socket (an ssh-forwarded one, usually)."""

    def __init__(self, path: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        """Connect the AF_UNIX socket, with the same timeout as a TCP connect."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def open_connection(server: str, timeout: float = DEFAULT_TIMEOUT_S) -> http.client.HTTPConnection:
    """A connection to `http://host:port` or `unix:///path/to.sock`."""
    parts = urlsplit(server)
    if parts.scheme == "unix":
        return UnixHTTPConnection(unquote(parts.path), timeout=timeout)
    if parts.scheme == "http":
        return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname or "127.0.0.1", parts.port or 443, timeout=timeout)
    raise ValueError("server URL must be http://host:port or unix:///path, not {!r}".format(server))


def _detail(body: bytes) -> str:
    try:
        data = json.loads(body.decode("utf-8"))
        return str(data.get("detail", data)) if isinstance(data, dict) else str(data)
    except ValueError:
        return body.decode("utf-8", "replace")[:500]


class AgentClient:
    """The calls of docs/protocol.md for one run, with that run's token."""

    def __init__(self, server: str, run_id: str, token: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 give_up_s: float = 300.0, log: Optional[Callable[[str], None]] = None) -> None:
        open_connection(server).close()  # a bad URL fails here, not in a thread
        self.server = server
        self.run_id = run_id
        self.timeout_s = timeout_s
        self.give_up_s = give_up_s
        self._auth = "Bearer " + token  # kept only here; never logged
        self._local = threading.local()
        self._log = log or (lambda message: None)
        self.last_ok = time.monotonic()
        self.last_failure = 0.0

    def silence_s(self) -> float:
        """Seconds since the server last answered, once a call has failed since then (else 0).

        A quiet run is not a lost server: only a failed call starts the count,
        and it counts from the last answer (a cut network hangs a call for its
        whole timeout before it fails).
        """
        if self.last_failure <= self.last_ok:
            return 0.0
        return time.monotonic() - self.last_ok

    # -- transport ---------------------------------------------------------
    def _path(self, name: str, query: str = "") -> str:
        return "{}/runs/{}/{}{}".format(API_PREFIX, quote(self.run_id, safe=""), name, query)

    def _connection(self, timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, and whether it was used before (so may have gone stale)."""
        conn = getattr(self._local, "conn", None)
        reused = conn is not None
        if conn is None:
            conn = open_connection(self.server, timeout)
            conn.blocksize = _CHUNK
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, reused

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _open(self, method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None,
              timeout: Optional[float] = None) -> http.client.HTTPResponse:
        """Send one request; the response is unread. A stale keep-alive connection is retried at once."""
        all_headers = {"Authorization": self._auth}
        all_headers.update(headers or {})
        for attempt in (1, 2):
            conn, reused = self._connection(timeout or self.timeout_s)
            try:
                conn.request(method, path, body=body, headers=all_headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException):
                self._drop()
                self.last_failure = time.monotonic()
                # The server closes idle keep-alive connections: a fresh one deserves a try at once.
                if attempt == 2 or not reused or (body is not None and hasattr(body, "read")):
                    raise
                continue
            self.last_ok = time.monotonic()
            return response
        raise AssertionError("unreachable")

    def _exchange(self, method: str, path: str, body: Any, headers: Dict[str, str],
                  timeout: Optional[float]) -> Tuple[int, bytes]:
        try:
            response = self._open(method, path, body, headers, timeout)
            data = response.read()
        except (OSError, http.client.HTTPException):
            self._drop()
            self.last_failure = time.monotonic()
            raise
        if response.will_close:
            self._drop()
        return response.status, data

    def call(self, method: str, name: str, payload: Any = None, query: str = "",
             timeout: Optional[float] = None, give_up_s: Optional[float] = None,
             headers: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """A JSON call, retried with backoff on connection errors for up to give_up_s.

        `payload` is sent as JSON, or as is when it is bytes. ApiError for an
        error status (not retried: asking again gets the same answer), Unreachable
        when the server did not answer in time.
        """
        body = payload if isinstance(payload, bytes) or payload is None else json.dumps(payload).encode()
        sent_headers = {"Content-Type": "application/json"} if body is not None else {}
        sent_headers.update(headers or {})
        deadline = time.monotonic() + (self.give_up_s if give_up_s is None else give_up_s)
        delay, failures = 0.2, 0
        while True:
            try:
                status, data = self._exchange(method, self._path(name, query), body, sent_headers, timeout)
            except (OSError, http.client.HTTPException) as exc:
                problem = "{}: {}".format(type(exc).__name__, exc)
            else:
                if status < 400:
                    return json.loads(data.decode("utf-8")) if data else {}
                if status not in _RETRY_STATUSES:
                    raise ApiError(status, _detail(data))
                problem = "HTTP {}".format(status)
            failures += 1
            if failures == 1 or failures % 10 == 0:
                self._log("{} {}: {} (retrying)".format(method, name, problem))
            if time.monotonic() + delay > deadline:
                raise Unreachable("{} {}: no answer from {} ({})".format(method, name, self.server, problem))
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    # -- the protocol's calls ------------------------------------------------
    def job(self) -> Dict[str, Any]:
        """GET job: trainer, params, limits, grace, bundle size and sha256."""
        return self.call("GET", "job")

    def post_events(self, events: List[str], give_up_s: Optional[float] = None) -> bool:
        """Post events given as JSON text (relayed as the worker wrote them); True when told to stop."""
        body = ('{"events":[' + ",".join(events) + "]}").encode("utf-8")
        return bool(self.call("POST", "events", body, give_up_s=give_up_s).get("cancel"))

    def control(self, wait_s: float) -> bool:
        """Long-poll for a cancel; True when the run is to stop."""
        reply = self.call("GET", "control", query="?wait_s={:g}".format(wait_s), timeout=wait_s + 15,
                          give_up_s=0)
        return bool(reply.get("cancel"))

    def post_result(self, exit_code: int, artifact_uri: Optional[str], message: Optional[str],
                    give_up_s: Optional[float] = None) -> Dict[str, Any]:
        """POST result: the last call of a run; the reply carries the run's state."""
        payload = {"exit_code": exit_code, "artifact_uri": artifact_uri, "message": message}
        return self.call("POST", "result", payload, give_up_s=give_up_s)

    def upload_predictions(self, path: str, give_up_s: Optional[float] = None) -> Dict[str, Any]:
        """PUT predictions.jsonl, streamed from disk; retried from the start on connection errors."""
        size = os.path.getsize(path)
        headers = {"Content-Type": "application/x-ndjson", "Content-Length": str(size)}
        deadline = time.monotonic() + (self.give_up_s if give_up_s is None else give_up_s)
        delay = 0.5
        while True:
            try:
                with open(path, "rb") as fh:
                    status, data = self._exchange("PUT", self._path("predictions"), fh, headers, None)
            except (OSError, http.client.HTTPException) as exc:
                if time.monotonic() + delay > deadline:
                    raise Unreachable("PUT predictions: no answer from {} ({})".format(self.server, exc)) from exc
                self._log("PUT predictions: {} (retrying)".format(exc))
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if status == 409 and delay > 0.5:
                # An earlier try was stored but its answer was lost.
                return {"bytes": size, "lines": None}
            if status >= 400:
                raise ApiError(status, _detail(data))
            return json.loads(data.decode("utf-8"))

    def download_bundle(self, dest: str, size: int, sha256: str, tries: int = BUNDLE_TRIES) -> None:
        """bundle.tar.gz into `dest`, resuming a partial file with Range; BundleError unless whole and verified."""
        resumed = os.path.exists(dest) and os.path.getsize(dest) > 0
        self._download(dest, size, tries)
        digest = file_sha256(dest)
        if digest != sha256 and resumed:
            # The partial file we resumed may be another bundle's: one more go from the first byte.
            self._log("the resumed bundle does not match its sha256: downloading it again from the start")
            os.unlink(dest)
            self._download(dest, size, tries)
            digest = file_sha256(dest)
        if digest != sha256:
            os.unlink(dest)
            raise BundleError("the bundle's sha256 is {}, not {} as the job says: refusing it".format(digest, sha256))

    def _download(self, dest: str, size: int, tries: int) -> None:
        """Up to `tries` requests until `dest` holds `size` bytes, each resuming where the last stopped."""
        problem = "no try made"
        for attempt in range(1, tries + 1):
            have = os.path.getsize(dest) if os.path.exists(dest) else 0
            if have > size:
                os.unlink(dest)  # not a prefix of this bundle: start over
                have = 0
            if have == size:
                return
            if have:
                self._log("resuming the bundle download at byte {} of {}".format(have, size))
            try:
                self._fetch_bundle(dest, have)
            except (OSError, http.client.HTTPException) as exc:
                problem = "{}: {}".format(type(exc).__name__, exc)
                self._log("bundle download try {} of {} failed: {}".format(attempt, tries, problem))
                time.sleep(min(0.5 * 2 ** attempt, 5.0))
        have = os.path.getsize(dest) if os.path.exists(dest) else 0
        if have != size:
            raise BundleError("the bundle download failed {} times (last: {}); got {} of {} bytes".format(
                tries, problem, have, size))

    def _fetch_bundle(self, dest: str, offset: int) -> None:
        headers = {"Range": "bytes={}-".format(offset)} if offset else {}
        response = self._open("GET", self._path("bundle"), None, headers)
        try:
            if response.status == 416:
                os.unlink(dest)  # the server's bundle is shorter than what we hold: start over
                raise OSError("the server refused the range; starting over")
            if response.status >= 400:
                raise ApiError(response.status, _detail(response.read()))
            resumed = response.status == 206
            with open(dest, "ab" if resumed else "wb") as fh:
                chunk = response.read(_CHUNK)
                while chunk:
                    fh.write(chunk)
                    chunk = response.read(_CHUNK)
        except BaseException:
            self._drop()
            raise
        if response.will_close:
            self._drop()


def file_sha256(path: str) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()
