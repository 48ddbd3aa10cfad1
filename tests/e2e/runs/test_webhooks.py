"""Training events through the project's webhooks (issue 38), as Potato sends its own: real HTTP receivers on
127.0.0.1 check each delivery's signature with Potato's own verify_signature; an endpoint that answers 500
once gets Potato's retry; one that never answers holds up neither the run nor the other endpoints. The
server, the executor (which delivers), Redis and the worker are real."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from potato_queue.runs.ingest import ingest_events
from potato_queue.store import RunStore
from potato_queue.validate import load_checked
from tests.conftest import run_cli
from tests.lifecycle_helpers import TERMINAL, Services, held_run, make_project, started, wait_until

SECRET = "whsec-lab-3f9a"


class Receiver:
    """An HTTP endpoint that keeps every delivery; `fail_first` answers 500 to its first one."""

    def __init__(self, fail_first: int = 0) -> None:
        self.deliveries: list[dict[str, Any]] = []
        self.failures_left = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                failing = receiver.failures_left > 0
                receiver.failures_left -= 1
                receiver.deliveries.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                        "answered": 500 if failing else 200,
                    }
                )
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, answered: int = 200) -> list[str]:
        return [json.loads(d["body"])["event"] for d in list(self.deliveries) if d["answered"] == answered]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Hung:
    """An endpoint that takes the connection and never answers (a dead service behind a live port)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


def webhooks_block(ok: Receiver, flaky: Receiver, hung: Hung) -> dict[str, Any]:
    return {
        "enabled": True,
        "endpoints": [
            {
                "name": "lab-bot",
                "url": ok.url,
                "secret": SECRET,
                "events": [
                    "training.run.queued",
                    "training.run.started",
                    "training.run.succeeded",
                    "training.run.cancelled",
                ],
            },
            {"name": "flaky", "url": flaky.url, "secret": "whsec-flaky", "events": ["training.run.succeeded"]},
            {"name": "hung", "url": hung.url, "secret": "whsec-hung", "events": ["*"]},
            {"name": "annotations", "url": ok.url + "/annotations", "events": ["annotation.created"]},
        ],
    }


@pytest.fixture
def hooked(tmp_path: Path, redis_server_url: str) -> Iterator[tuple[Services, Receiver, Receiver, Hung]]:
    ok, flaky, hung = Receiver(), Receiver(fail_first=1), Hung()

    def add_webhooks(config: Path) -> None:
        data = yaml.safe_load(config.read_text())
        data["webhooks"] = webhooks_block(ok, flaky, hung)
        config.write_text(yaml.safe_dump(data, sort_keys=False))

    try:
        with started(tmp_path, redis_server_url, prepare=add_webhooks) as svc:
            yield svc, ok, flaky, hung
    finally:
        for endpoint in (ok, flaky, hung):
            endpoint.close()


def verified(delivery: dict[str, Any], secret: str) -> bool:
    from potato.webhooks.signing import verify_signature  # Potato's own check of what it signs

    headers = delivery["headers"]
    return verify_signature(
        secret, headers["webhook-id"], headers["webhook-timestamp"], delivery["body"], headers["webhook-signature"]
    )


def test_a_runs_events_reach_the_endpoints_that_want_them_signed_as_potato_signs(
    hooked: tuple[Services, Receiver, Receiver, Hung],
) -> None:
    svc, ok, flaky, hung = hooked
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
    run = svc.wait_for(run_id, TERMINAL, 60)
    assert run["state"] == "succeeded", run
    # The run did not wait on the endpoint that never answers: its delivery is still hanging.
    assert hung.held, "the hung endpoint was tried"
    wait_until(lambda: "training.run.succeeded" in ok.events(), 60, "the succeeded event at lab-bot")
    assert ok.events() == ["training.run.queued", "training.run.started", "training.run.succeeded"]
    assert all(verified(d, SECRET) for d in ok.deliveries)
    succeeded = json.loads(ok.deliveries[-1]["body"])
    data = succeeded["data"]
    assert (data["run_id"], data["backend"], data["trainer"], data["state"]) == (
        run_id,
        "local",
        "majority-baseline",
        "succeeded",
    )
    assert data["scores"]["sentiment"]["accuracy"] == run["held_out"]["sentiment"]["test"]["accuracy"]
    assert data["duration_s"] > 0 and data["url"] == f"{svc.url}/admin/training/runs/{run_id}"
    assert data["gpu_hours"] is None, "a CPU-only run has no GPU-hours, not zero"
    assert succeeded["timestamp"].endswith("Z") and set(succeeded) == {"event", "timestamp", "data"}
    # The endpoint that failed once is tried again (Potato's schedule: 5 s), with the same delivery id.
    wait_until(lambda: flaky.events() == ["training.run.succeeded"], 30, "flaky's retried delivery")
    first, retried = flaky.deliveries
    assert (first["answered"], retried["answered"]) == (500, 200)
    assert first["headers"]["webhook-id"] == retried["headers"]["webhook-id"]
    assert verified(retried, "whsec-flaky") and not verified(retried, SECRET)
    assert {d["path"] for d in ok.deliveries} == {"/hook"}, "the endpoint that wants annotation events only got none"
    # A cancel is an event too.
    held = held_run(svc)
    wait_until(lambda: svc.api("GET", f"/runs/{held}")[1]["state"] == "running", 30, "the held run running")
    svc.api("POST", f"/runs/{held}/cancel")
    wait_until(lambda: "training.run.cancelled" in ok.events(), 30, "the cancelled event")
    assert json.loads(ok.deliveries[-1]["body"])["data"]["run_id"] == held


def test_validate_and_check_say_which_endpoint_gets_which_training_events(
    tmp_path: Path,
) -> None:
    ok, flaky, hung = Receiver(), Receiver(), Hung()
    try:
        config = make_project(tmp_path)
        data = yaml.safe_load(config.read_text())
        data["webhooks"] = webhooks_block(ok, flaky, hung)
        data["webhooks"]["endpoints"][1].pop("secret")
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        for command in (("validate", config), ("training", "check", "local", config)):
            out = run_cli(*command).stdout
            assert (
                f"webhook 'lab-bot' ({ok.url}) gets training.run.queued, training.run.started, "
                "training.run.succeeded, training.run.cancelled"
            ) in out, out
            assert f"webhook 'flaky' ({flaky.url}) gets training.run.succeeded; unsigned: it has no secret" in out
            assert f"webhook 'hung' ({hung.url}) gets every training event (*)" in out
            assert "webhook 'annotations'" in out and "gets no training event (it lists none of:" in out
    finally:
        for endpoint in (ok, flaky, hung):
            endpoint.close()


@pytest.mark.unit
def test_a_worker_that_says_it_was_preempted_is_a_preempted_event(tmp_path: Path, redis_server_url: str) -> None:
    config = make_project(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["webhooks"] = {"enabled": True, "endpoints": [{"name": "ops", "url": "http://127.0.0.1:9/", "events": ["*"]}]}
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    store = RunStore(load_checked(config), redis.Redis.from_url(redis_server_url))
    record = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    ingest_events(
        store, record["run_id"], [{"v": 1, "event": "status", "state": "preempted", "step": "stopped on SIGUSR1"}]
    )
    queued, preempted = store.webhooks.next(1), store.webhooks.next(1)
    assert queued is not None and queued[0] == "training.run.queued"
    assert preempted is not None and preempted[0] == "training.run.preempted"
    assert preempted[1]["data"]["run_id"] == record["run_id"] and store.webhooks.waiting() == 0


@pytest.mark.unit
def test_without_potato_the_events_are_signed_and_retried_the_same_way() -> None:
    """The fallback sender (a project whose server has no Potato installed): Potato's verify_signature
    accepts what it signs, and an endpoint that answers 500 gets the delivery again, same id, 5 s later."""
    from potato_queue.lab.events import Endpoint
    from potato_queue.processes.webhooks import StandardWebhookSender

    flaky = Receiver(fail_first=1)
    try:
        sender = StandardWebhookSender(Endpoint("ops", flaky.url, ("*",), secret=SECRET))
        sender.emit("training.run.failed", {"event": "training.run.failed", "timestamp": "t", "data": {"run_id": "r"}})
        wait_until(lambda: flaky.events() == ["training.run.failed"], 30, "the retried delivery")
        first, retried = flaky.deliveries
        assert first["headers"]["webhook-id"] == retried["headers"]["webhook-id"]
        assert verified(first, SECRET) and verified(retried, SECRET)
    finally:
        flaky.close()


class Redirecting:
    """An endpoint that answers every POST with a 302 to another address (`target`), which counts what it gets."""

    def __init__(self) -> None:
        self.target = Receiver()
        self.got: list[str] = []
        target, got = self.target, self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                got.append("POST")
                self.send_response(302)
                self.send_header("Location", target.url + "/internal-admin")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                got.append("GET")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.target.close()


class Trickler:
    """An endpoint that reads the request, then sends its status line a byte every 0.2 s (each read answered
    well within any per-read timeout); `cut_after` is how many bytes it had sent when the sender hung up."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.cut_after: list[int] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        conn.recv(65536)
        answer = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 400 + b"\r\n\r\n"
        sent = 0
        for byte in answer:
            try:
                conn.sendall(bytes([byte]))
                sent += 1
                if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    break  # the sender closed its side
            except BlockingIOError:
                pass
            except OSError:
                break
            time.sleep(0.2)
        self.cut_after.append(sent)
        conn.close()

    def close(self) -> None:
        self.listener.close()


def _endpoint(url: str, name: str) -> Any:
    from potato_queue.lab.events import Endpoint

    return Endpoint(name, url, ("*",), secret=SECRET, timeout_seconds=1)


@pytest.mark.unit
@pytest.mark.parametrize("with_potato", [True, False], ids=["potato's queue", "without potato"])
def test_a_delivery_follows_no_redirect_and_ends_at_the_endpoints_timeout(tmp_path: Path, with_potato: bool) -> None:
    """Issue 51: Potato's own sender turns a 302 into a GET to wherever the endpoint points, and gives an endpoint
    that trickles its answer as long as it likes. Here the 302 is a failed try (the address it points to gets
    nothing) and the trickler is hung up on at the endpoint's timeout_seconds (1 s), long before its 400 bytes."""
    from potato_queue.processes.webhooks import StandardWebhookSender, sender_for

    redirecting, trickler = Redirecting(), Trickler()
    try:
        config = load_checked(make_project(tmp_path))
        for position, endpoint in enumerate([_endpoint(redirecting.url, "moved"), _endpoint(trickler.url, "slow")]):
            sender = sender_for(config, endpoint, position) if with_potato else StandardWebhookSender(endpoint)
            assert isinstance(sender, StandardWebhookSender) != with_potato
            sender.emit("training.run.failed", {"event": "training.run.failed", "data": {"run_id": "r"}})
        wait_until(lambda: redirecting.got and trickler.cut_after, 30, "both tries")
        assert redirecting.got == ["POST"] and redirecting.target.deliveries == []
        assert trickler.cut_after[0] < 30, trickler.cut_after  # 0.2 s a byte: cut within 6 s, not 80
    finally:
        redirecting.close()
        trickler.close()
