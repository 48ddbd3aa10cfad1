"""The agent's transport and its one retry policy, against a real HTTP server that misbehaves on cue.

The server is http.server on 127.0.0.1 (real sockets, real keep-alive), its
answers scripted per request; the end-to-end protocol lives in
test_agent_protocol.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from potato_queue.agent import backoff as backoff_module
from potato_queue.agent.backoff import Backoff, retry
from potato_queue.agent.client import BundleDownloadError, RunClient
from potato_queue.agent.launchers.base import LaunchError
from potato_queue.agent.launchers.process import ProcessLauncher, scan_processes, worker_env
from potato_queue.agent.relay import control_loop
from potato_queue.agent.transport import (
    API_PREFIX,
    DEFAULT_TIMEOUT_S,
    ApiError,
    Retryable,
    Transport,
    Unreachable,
    call_timeout_s,
)

pytestmark = pytest.mark.unit

TOKEN = "s3cret-token-value"
# A handler step: (handler, body read) -> None; it writes the whole answer (or none).
Step = Callable[["Handler", bytes], None]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

    def _serve(self) -> None:
        server: Scripted = self.server  # type: ignore[assignment]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        server.seen.append((self.command, self.path, dict(self.headers), body))
        step = server.script.pop(0) if server.script else answer(200, {})
        step(self, body)

    do_GET = do_POST = do_PUT = _serve

    def log_message(self, format: str, *args: object) -> None:
        pass


class Scripted(ThreadingHTTPServer):
    daemon_threads = True
    script: list[Step]
    seen: list[tuple[str, str, dict[str, str], bytes]]


def answer(status: int, data: object, close: bool = False) -> Step:
    def step(handler: Handler, _body: bytes) -> None:
        raw = json.dumps(data).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)
        handler.close_connection = close  # closed without saying so: the next reuse finds it stale

    return step


def hang_up(handler: Handler, _body: bytes) -> None:
    handler.close_connection = True  # read the request, answer nothing: "the answer was lost"


def bundle_bytes(data: bytes, cut_at: int | None = None) -> Step:
    def step(handler: Handler, _body: bytes) -> None:
        start = int(handler.headers.get("Range", "bytes=0-")[6:-1] or 0)
        handler.send_response(206 if start else 200)
        handler.send_header("Content-Length", str(len(data) - start))
        handler.end_headers()
        handler.wfile.write(data[start:cut_at] if cut_at else data[start:])
        handler.close_connection = cut_at is not None

    return step


@pytest.fixture
def server() -> Iterator[Scripted]:
    httpd = Scripted(("127.0.0.1", 0), Handler)
    httpd.script, httpd.seen = [], []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def url_of(httpd: Scripted) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def make_client(httpd: Scripted, logs: list[str], give_up_s: float = 5.0) -> RunClient:
    return RunClient(Transport(url_of(httpd), TOKEN, timeout_s=5, give_up_s=give_up_s, log=logs.append), "r-1")


# -- the policy ---------------------------------------------------------------------
def test_backoff_doubles_from_0_2_to_5_s_and_logs_the_first_and_every_10th(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr(backoff_module.time, "sleep", waits.append)
    logs: list[str] = []
    policy = Backoff("GET job", logs.append)
    for n in range(20):
        assert policy.failed(f"problem {n + 1}")
    assert waits[:6] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0] and set(waits[6:]) == {5.0}
    assert [line.split(": ")[1].split(";")[0] for line in logs] == ["problem 1", "problem 10", "problem 20"]
    policy.succeeded()
    policy.failed("again")
    assert waits[-1] == 0.2 and len(logs) == 4


def test_backoff_gives_up_at_its_deadline_its_tries_or_its_stop() -> None:
    assert not Backoff("x", give_up_s=0).failed("gone")
    tries = Backoff("x", max_tries=2)
    assert tries.failed("one") and not tries.failed("two")
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    assert not Backoff("x", stop=stop).failed("stopped")
    assert time.monotonic() - started < 0.1
    attempts: list[int] = []

    def attempt() -> None:
        attempts.append(1)
        raise Retryable("HTTP 503")

    with pytest.raises(Unreachable, match=r"x: no answer from the server \(HTTP 503\)"):
        retry(attempt, Backoff("x", max_tries=3))
    assert len(attempts) == 3


# -- JSON calls ---------------------------------------------------------------------------
def test_503_is_retried_other_errors_are_raised_at_once(server: Scripted) -> None:
    logs: list[str] = []
    client = make_client(server, logs)
    server.script = [answer(503, {}), answer(502, {}), answer(200, {"trainer": "fake"})]
    assert client.job() == {"trainer": "fake"}
    assert len(server.seen) == 3 and len(logs) == 1 and "HTTP 503" in logs[0]
    server.script = [answer(404, {"detail": "no such run"})]
    with pytest.raises(ApiError, match="no such run") as raised:
        client.job()
    assert raised.value.status == 404 and len(server.seen) == 4
    method, path, headers, _ = server.seen[0]
    assert (method, path) == ("GET", API_PREFIX + "/runs/r-1/job")
    assert headers["Authorization"] == "Bearer " + TOKEN
    assert all(TOKEN not in line for line in logs)


def test_no_server_is_unreachable_after_give_up_s_and_counts_as_silence() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    logs: list[str] = []
    client = RunClient(Transport(f"http://127.0.0.1:{port}", TOKEN, give_up_s=2.0, log=logs.append), "r-1")
    assert client.silence_s() == 0.0
    started = time.monotonic()
    with pytest.raises(Unreachable, match=f"GET job: no answer from http://127.0.0.1:{port}"):
        client.job()
    assert 1.0 < time.monotonic() - started < 4, "tries after 0.2, 0.4 and 0.8 s; 1.6 s more would pass 2 s"
    assert client.silence_s() > 1.0
    assert all(TOKEN not in line for line in logs) and TOKEN not in repr(client.transport)


def test_a_call_hung_on_a_cut_network_fails_within_a_short_unreachable_window() -> None:
    """A server that takes the connection and never answers (a silently cut network): under --unreachable-s 1
    the call gives up within that second, not after DEFAULT_TIMEOUT_S, so the agent stops its worker in time."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel accepts; nobody reads or answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        client = RunClient(Transport(url, TOKEN, call_timeout_s(1.0), give_up_s=0.5), "r-1")
        started = time.monotonic()
        with pytest.raises(Unreachable):
            client.post_events(['{"v":1}'])
        assert time.monotonic() - started < DEFAULT_TIMEOUT_S / 2, "the call waited out the default timeout"
        assert client.silence_s() >= 1.0
    assert call_timeout_s(300.0) == DEFAULT_TIMEOUT_S, "the usual window keeps the usual timeout"


def test_a_stale_keep_alive_connection_is_retried_at_once(server: Scripted) -> None:
    logs: list[str] = []
    client = make_client(server, logs)
    server.script = [answer(200, {"cancel": False}, close=True), answer(200, {"cancel": True})]
    assert client.post_events(['{"v":1}']) is False
    time.sleep(0.1)
    assert client.post_events([]) is True
    assert logs == [] and client.silence_s() == 0.0
    assert json.loads(server.seen[0][3]) == {"events": [{"v": 1}]}


def test_the_control_loop_backs_off_and_ends_on_cancel(server: Scripted) -> None:
    logs: list[str] = []
    client = make_client(server, logs)
    server.script = [
        answer(500, {"detail": "boom"}),
        answer(503, {}),
        answer(200, {"cancel": False}),
        answer(200, {"cancel": True}),
    ]
    cancelled = threading.Event()
    control_loop(client, threading.Event(), cancelled.set, logs.append, wait_s=0.1)
    assert cancelled.is_set() and len(server.seen) == 4
    assert len(logs) == 1 and logs[0].startswith("control: HTTP 500: boom")


# -- predictions and the bundle -----------------------------------------------------------------
def test_a_409_after_a_lost_answer_counts_as_stored(server: Scripted, tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    path.write_bytes(b'{"instance_id": "1"}\n' * 10)
    client = make_client(server, [])
    server.script = [hang_up, answer(409, {"detail": "already stored"})]
    assert client.upload_predictions(str(path)) == {"bytes": path.stat().st_size, "lines": None}
    assert [body for _, _, _, body in server.seen] == [path.read_bytes()] * 2, "each try sends the whole file"
    server.script = [answer(409, {"detail": "already stored"})]
    with pytest.raises(ApiError):
        client.upload_predictions(str(path))  # a first try's 409 is the server's answer


def test_a_cut_bundle_download_resumes_with_range(server: Scripted, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    logs: list[str] = []
    client = make_client(server, logs)
    server.script = [bundle_bytes(data, cut_at=100_000), bundle_bytes(data)]
    dest = tmp_path / "bundle.tar.gz"
    client.download_bundle(str(dest), len(data), hashlib.sha256(data).hexdigest())
    assert dest.read_bytes() == data
    assert server.seen[1][2]["Range"] == "bytes=100000-"
    assert "resuming the bundle download at byte 100000 of 300000" in logs


def whole_bundle(data: bytes) -> Step:
    """A server that ignores Range: 200 and every byte, whatever was asked."""

    def step(handler: Handler, _body: bytes) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return step


@pytest.mark.parametrize("third", ["resumed", "ignores-range"])
def test_a_bundle_cut_twice_is_whole_and_verified(third: str, server: Scripted, tmp_path: Path) -> None:
    """Past the hasher's 4 MiB reads, cuts at odd bytes: the hash follows the file through every try,
    and a server that answers 200 to a Range request starts the file and its hash over."""
    data = os.urandom(13_000_003)
    client = make_client(server, [])
    last = bundle_bytes(data) if third == "resumed" else whole_bundle(data)
    server.script = [bundle_bytes(data, cut_at=5_000_001), bundle_bytes(data, cut_at=9_437_185), last]
    dest = tmp_path / "bundle.tar.gz"
    client.download_bundle(str(dest), len(data), hashlib.sha256(data).hexdigest())
    assert dest.read_bytes() == data
    assert [seen[2].get("Range") for seen in server.seen] == [None, "bytes=5000001-", "bytes=9437185-"]


def test_a_bundle_that_differs_after_a_resume_is_refused(server: Scripted, tmp_path: Path) -> None:
    data = os.urandom(6_000_000)
    other = data[:3_000_000] + os.urandom(3_000_000)
    client = make_client(server, [])
    server.script = [bundle_bytes(data, cut_at=3_000_000), bundle_bytes(other)]
    with pytest.raises(BundleDownloadError, match="refusing it"):
        client.download_bundle(str(tmp_path / "bundle.tar.gz"), len(data), hashlib.sha256(data).hexdigest())
    assert not (tmp_path / "bundle.tar.gz").exists()


def test_the_bundle_gets_five_tries(server: Scripted, tmp_path: Path) -> None:
    client = make_client(server, [])
    server.script = [answer(503, {})] * 6
    with pytest.raises(BundleDownloadError, match=r"failed 5 times \(last: HTTP 503\); got 0 of 10 bytes"):
        client.download_bundle(str(tmp_path / "bundle.tar.gz"), 10, "0" * 64)
    assert len(server.seen) == 5


# -- the local launcher and /proc ---------------------------------------------------------------
def test_a_missing_python_is_a_launch_error(tmp_path: Path) -> None:
    launcher = ProcessLauncher(str(tmp_path / "no-python"), worker_env())
    launcher.prestart()  # fails quietly: start() reports it
    with pytest.raises(LaunchError, match="no-python was not found on") as raised:
        launcher.start(str(tmp_path / "spec.json"), str(tmp_path))
    assert raised.value.error_code == "python_not_found" and "python" in (raised.value.install_hint or "")
    launcher.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc here")
def test_scan_processes_sees_this_process() -> None:
    me = next(p for p in scan_processes() if p.pid == os.getpid())
    assert (me.pgid, me.sid, me.cmdline) == (os.getpgrp(), os.getsid(0), b"")
    assert me.state in "RS" and me.rss_mb > 1
    mine = next(p for p in scan_processes(with_cmdline=True) if p.pid == os.getpid())
    assert mine.cmdline == Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
