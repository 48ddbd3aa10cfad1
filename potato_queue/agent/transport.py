"""HTTP/1.1 to the server over TCP, TLS or a unix socket, with the bearer token.

Standard library only, Python 3.8+: this file is copied to bare hosts. The
transport knows the server and the bearer token, nothing about runs, so a
client of the backend-level calls (register, claim) can share it with the
per-run client. Each thread keeps its own keep-alive connection (the event
sender, the heartbeat and the control long-poll run side by side). Every
request has a timeout, because a cut network can leave a forwarded socket
that accepts and then hangs (seen with ssh's reverse forwards). A JSON call
is retried through the agent's one retry policy (backoff.py).
"""

import contextlib
import functools
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.request
from typing import Any, Callable, Dict, Iterator, Optional, Tuple
from urllib.parse import unquote, urlsplit

from potato_queue.agent.backoff import Backoff, problem_of, retry
from potato_queue.agent.errors import ApiError, Retryable, TlsError, Unreachable

__all__ = [
    "API_PREFIX",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_GIVE_UP_S",
    "CHUNK_BYTES",
    "RETRY_STATUSES",
    "ApiError",
    "Unreachable",
    "TlsError",
    "Retryable",
    "UnixHTTPConnection",
    "open_connection",
    "Transport",
    "call_timeout_s",
]

API_PREFIX = "/api/training/agent/v1"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_GIVE_UP_S = 300.0
CHUNK_BYTES = 1024 * 1024
# Statuses that mean "a proxy or the server is restarting": worth retrying like a cut connection.
RETRY_STATUSES = (502, 503, 504)

Log = Callable[[str], None]


def _no_log(message: str) -> None:
    pass


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


def _proxy_for(scheme: str, host: str) -> Optional[Tuple[str, int]]:
    """(host, port) of the proxy HTTP(S)_PROXY names for this server, None without one or under NO_PROXY."""
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    parts = urlsplit(proxy if "://" in proxy else "http://" + proxy)
    return parts.hostname or "127.0.0.1", parts.port or 3128


@functools.lru_cache(maxsize=8)
def _tls_context(ca_file: Optional[str]) -> ssl.SSLContext:
    """One context per CA file: loading the system's CAs for every new connection costs milliseconds."""
    return ssl.create_default_context(cafile=ca_file)


def open_connection(
    server: str, timeout: float = DEFAULT_TIMEOUT_S, ca_file: Optional[str] = None
) -> http.client.HTTPConnection:
    """A connection to `http://host:port`, `https://host:port` or `unix:///path/to.sock`.

    https verifies the server against the system's CAs, or only `ca_file`'s. A proxy named by
    HTTP_PROXY / HTTPS_PROXY (and not bypassed by NO_PROXY) is asked for a tunnel (CONNECT).
    """
    parts = urlsplit(server)
    if parts.scheme == "unix":
        return UnixHTTPConnection(unquote(parts.path), timeout=timeout)
    if parts.scheme not in ("http", "https"):
        raise ValueError(
            "server URL must be http://host:port, https://host:port or unix:///path, not {!r}".format(server)
        )
    host, port = parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
    proxy = _proxy_for(parts.scheme, host)
    target = proxy or (host, port)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(target[0], target[1], timeout=timeout, context=_tls_context(ca_file))  # type: http.client.HTTPConnection
    else:
        conn = http.client.HTTPConnection(target[0], target[1], timeout=timeout)
    if proxy is not None:
        conn.set_tunnel(host, port)
    return conn


def call_timeout_s(unreachable_s: float) -> float:
    """How long a run's call waits for its answer: DEFAULT_TIMEOUT_S, or less under a shorter AGT-7 window.

    A call hung on a silently cut network is no answer either: it must fail within the window, or the
    agent would learn it lost the server only a whole timeout later.
    """
    return min(DEFAULT_TIMEOUT_S, unreachable_s)


def tls_problem(server: str, exc: ssl.SSLCertVerificationError) -> TlsError:
    return TlsError(
        "the TLS certificate of {} could not be verified ({}); fix: give the agent the CA that signed it with "
        "--ca-file, or install that CA in the system's store".format(server, exc.verify_message or exc)
    )


def error_detail(body: bytes) -> str:
    """The server's explanation of an error status (FastAPI's `detail`), or the start of the body."""
    try:
        data = json.loads(body.decode("utf-8"))
        return str(data.get("detail", data)) if isinstance(data, dict) else str(data)
    except ValueError:
        return body.decode("utf-8", "replace")[:500]


def json_answer(status: int, body: bytes) -> Dict[str, Any]:
    """A reply as JSON; Retryable for 502/503/504, ApiError for any other error status."""
    if status < 400:
        return json.loads(body.decode("utf-8")) if body else {}
    if status in RETRY_STATUSES:
        raise Retryable("HTTP {}".format(status))
    raise ApiError(status, error_detail(body))


class Transport:
    """Requests to one server with one bearer token; paths are relative to API_PREFIX."""

    def __init__(
        self,
        server: str,
        token: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        give_up_s: float = DEFAULT_GIVE_UP_S,
        log: Optional[Log] = None,
        ca_file: Optional[str] = None,
    ) -> None:
        open_connection(server, ca_file=ca_file).close()  # a bad URL fails here, not in a thread
        self.server = server
        self.ca_file = ca_file
        self.timeout_s = timeout_s
        self.give_up_s = give_up_s
        self.log = log or _no_log
        self._auth = "Bearer " + token  # kept only here; never logged, never in a URL
        self._local = threading.local()
        self.last_ok = time.monotonic()
        self.last_failure = 0.0

    def __repr__(self) -> str:
        return "Transport({!r})".format(self.server)  # no token

    def silence_s(self) -> float:
        """Seconds since the server last answered, once a call has failed since then (else 0).

        A quiet run is not a lost server: only a failed call starts the count,
        and it counts from the last answer (a cut network hangs a call for its
        whole timeout before it fails).
        """
        if self.last_failure <= self.last_ok:
            return 0.0
        return time.monotonic() - self.last_ok

    def patience_s(self, give_up_s: Optional[float]) -> float:
        """How long a call may retry: give_up_s, or this transport's default when None."""
        return self.give_up_s if give_up_s is None else give_up_s

    def backoff(
        self,
        what: str,
        give_up_s: Optional[float],
        max_tries: Optional[int] = None,
        stop: Optional[threading.Event] = None,
    ) -> Backoff:
        """The retry policy for one call to this server; give_up_s None: no deadline."""
        return Backoff(what, self.log, give_up_s, max_tries, stop, target=self.server)

    # -- one connection per thread ---------------------------------------------
    def _connection(self, timeout_s: float) -> Tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, and whether it was used before (so may have gone stale)."""
        conn = getattr(self._local, "conn", None)
        reused = conn is not None
        if conn is None:
            conn = open_connection(self.server, timeout_s, self.ca_file)
            conn.blocksize = CHUNK_BYTES
            self._local.conn = conn
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn, reused

    def drop(self) -> None:
        """Close this thread's connection (after an error, or when the server said it closes it)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _failed(self) -> None:
        self.drop()
        self.last_failure = time.monotonic()

    # -- requests ----------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Optional[Dict[str, str]] = None,
        timeout_s: Optional[float] = None,
    ) -> http.client.HTTPResponse:
        """Send one request; the response is unread. A stale keep-alive connection is retried at once."""
        all_headers = {"Authorization": self._auth}
        all_headers.update(headers or {})
        for attempt in (1, 2):
            conn, reused = self._connection(timeout_s or self.timeout_s)
            try:
                conn.request(method, API_PREFIX + "/" + path, body=body, headers=all_headers)
                response = conn.getresponse()
            except ssl.SSLCertVerificationError as exc:
                self._failed()
                raise tls_problem(self.server, exc) from None
            except (OSError, http.client.HTTPException):
                self._failed()
                # The server closes idle keep-alive connections: a fresh one deserves a try at once
                # (not a stream: its first bytes may be gone).
                if attempt == 2 or not reused or hasattr(body, "read"):
                    raise
                continue
            self.last_ok = time.monotonic()
            return response
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def reading(self, response: http.client.HTTPResponse) -> Iterator[http.client.HTTPResponse]:
        """A response of request() to read in the with-block; the connection is kept only when it was read whole."""
        try:
            yield response
        except (OSError, http.client.HTTPException):
            self._failed()
            raise
        except BaseException:
            self.drop()
            raise
        if response.will_close or not response.isclosed():
            self.drop()

    def whole(self, response: http.client.HTTPResponse) -> Tuple[int, bytes]:
        """A response of request(), read whole: (status, body). Connection errors are raised as they come."""
        with self.reading(response) as read:
            return read.status, read.read()

    def call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        query: str = "",
        timeout_s: Optional[float] = None,
        give_up_s: Optional[float] = None,
        headers: Optional[Dict[str, str]] = None,
        what: Optional[str] = None,
    ) -> Dict[str, Any]:
        """A JSON call, retried by the policy for up to give_up_s (this transport's default when None).

        `payload` is sent as JSON, or as is when it is bytes. ApiError for an
        error status other than 502/503/504 (asking again gets the same answer),
        Unreachable when the server did not answer in time.
        """
        body = payload if isinstance(payload, bytes) or payload is None else json.dumps(payload).encode()
        sent_headers = {"Content-Type": "application/json"} if body is not None else {}
        sent_headers.update(headers or {})

        def attempt() -> Dict[str, Any]:
            try:
                status, data = self.whole(self.request(method, path + query, body, sent_headers, timeout_s))
            except (OSError, http.client.HTTPException) as exc:
                raise Retryable(problem_of(exc)) from None
            return json_answer(status, data)

        return retry(attempt, self.backoff(what or "{} {}".format(method, path), self.patience_s(give_up_s)))
