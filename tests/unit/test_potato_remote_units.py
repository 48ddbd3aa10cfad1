"""potato-queue-remote's side of the key (potato_queue/potato_remote.py): where the admin key may be sent is
the admin's choice ($POTATO_QUEUE_URL in Potato's environment), never a run param's, and a redirect does not
carry it elsewhere, nor a proxy read it; the follower when Potato stops a run. Pure functions, and real
listeners on loopback."""

from __future__ import annotations

import http.server
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from potato.training.base import ProgressReporter, TrainerError

from potato_queue.potato_remote import DEFAULT_SERVER, Follower, QueueClient, server_for
from tests.potato_helpers import Recorder

pytestmark = pytest.mark.unit

KEY = {"POTATO_QUEUE_API_KEY": "the-admins-key"}


def test_the_server_is_the_admins_and_a_param_may_only_repeat_it() -> None:
    env = {"POTATO_QUEUE_URL": "http://127.0.0.1:8000/"}
    assert server_for(None, env) == "http://127.0.0.1:8000"
    assert server_for(None, {}) == DEFAULT_SERVER
    for same in ("http://127.0.0.1:8000", "HTTP://127.0.0.1:8000/", " http://127.0.0.1:8000 "):
        assert server_for(same, env) == "http://127.0.0.1:8000"
    assert server_for("https://queue.lab.example", {"POTATO_QUEUE_URL": "https://Queue.lab.example:443"})
    for other in (
        "http://127.0.0.1:8001",
        "https://127.0.0.1:8000",
        "http://attacker.example:8000",
        "http://127.0.0.1:8000/elsewhere",
    ):
        with pytest.raises(TrainerError) as refused:
            server_for(other, env)
        assert str(refused.value) == (
            f"params.server {other!r} is not this Potato's potato-queue server (http://127.0.0.1:8000, from "
            "$POTATO_QUEUE_URL): a run's params cannot choose where potato-queue's admin key is sent; leave server "
            "out of the params (the admin sets $POTATO_QUEUE_URL in Potato's environment)"
        )


def test_the_key_crosses_the_network_in_plain_http_only_when_the_admin_says_so() -> None:
    for local in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000", "http://127.0.0.2"):
        assert server_for(None, {"POTATO_QUEUE_URL": local}) == local
    assert server_for(None, {"POTATO_QUEUE_URL": "https://queue.lab.example"}) == "https://queue.lab.example"
    with pytest.raises(TrainerError) as refused:
        server_for(None, {"POTATO_QUEUE_URL": "http://queue.lab.example:8000"})
    assert str(refused.value) == (
        "potato-queue's server http://queue.lab.example:8000 is plain http on another machine, so its admin key "
        "would cross the network readable: give $POTATO_QUEUE_URL an https address (the shipped nginx), or set "
        "$POTATO_QUEUE_ALLOW_PLAIN_HTTP=1 in Potato's environment to send it anyway"
    )
    opted_in = {"POTATO_QUEUE_URL": "http://queue.lab.example:8000", "POTATO_QUEUE_ALLOW_PLAIN_HTTP": "1"}
    assert server_for(None, opted_in) == "http://queue.lab.example:8000"


def test_an_address_with_a_user_a_query_or_another_scheme_is_no_server() -> None:
    for bad in (
        "http://user:pw@127.0.0.1:8000",
        "http://127.0.0.1:8000/?x=1",
        "ftp://127.0.0.1",
        "127.0.0.1:8000",
        "http://127.0.0.1:99999",
    ):
        with pytest.raises(TrainerError, match="server address"):
            server_for(None, {"POTATO_QUEUE_URL": bad})


def test_without_the_key_in_potatos_environment_the_run_says_where_to_set_it() -> None:
    with pytest.raises(TrainerError, match="set POTATO_QUEUE_API_KEY \\(or POTATO_ADMIN_API_KEY\\) in the environment"):
        QueueClient.from_env(None, {"POTATO_QUEUE_URL": "http://127.0.0.1:8000"})


@pytest.fixture
def redirecting() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A server that redirects every request to a second one, which records what it gets."""
    got: list[dict[str, str]] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            got.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    elsewhere = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{elsewhere.server_address[1]}/x")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    first = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for server in (elsewhere, first):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{first.server_address[1]}", got
    for server in (elsewhere, first):
        server.shutdown()
        server.server_close()


def test_a_redirect_does_not_carry_the_key_elsewhere(redirecting: tuple[str, list[dict[str, str]]]) -> None:
    url, got = redirecting
    client = QueueClient.from_env(None, {**KEY, "POTATO_QUEUE_URL": url})
    with pytest.raises(TrainerError, match=f"potato-queue at {url} refused GET /runs/x: 307"):
        client.call("GET", "/runs/x")
    assert got == []


def test_an_http_proxy_in_potatos_environment_never_sees_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib sends even loopback requests through $http_proxy, in plain text; the client does not."""
    proxy, server = Recorder(), Recorder()
    try:
        for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        QueueClient.from_env(None, {**KEY, "POTATO_QUEUE_URL": server.url}).call("GET", "/runs")
    finally:
        proxy.close()
        server.close()
    assert (proxy.got, server.got) == ([], [("GET", "/admin/training/api/runs")])
    # https to another machine keeps its https proxy: it tunnels the encrypted request and sees no header.
    monkeypatch.setenv("https_proxy", "http://proxy.lab.example:3128")
    handlers = QueueClient("https://queue.lab.example", "k")._opener.handlers
    assert [h.proxies for h in handlers if isinstance(h, urllib.request.ProxyHandler)] == [
        {"https": "http://proxy.lab.example:3128"}
    ]


class _Stopped(ProgressReporter):
    """Potato's reporter once the user pressed Cancel in Potato."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def status(self, state: str, step: str = "") -> None:
        self.lines.append(step)

    def log(self, level: str, msg: str) -> None:
        self.lines.append(msg)

    def should_stop(self) -> bool:
        return True


def test_a_run_potato_stops_while_potato_queue_is_down_ends_at_once_saying_what_to_cancel() -> None:
    gone = Recorder()
    gone.close()  # nothing listens there now
    client = QueueClient.from_env(None, {**KEY, "POTATO_QUEUE_URL": gone.url})
    with pytest.raises(TrainerError) as stopped:
        Follower(client, "20260101T000000-aaaaaa", _Stopped(), None).follow()
    said = str(stopped.value)
    assert said.startswith(f"Potato stopped this run while potato-queue's server at {gone.url} cannot be reached"), said
    assert said.endswith(
        "potato-queue run 20260101T000000-aaaaaa may still be running there; cancel it once the "
        "server is back (potato-queue training cancel 20260101T000000-aaaaaa CONFIG)"
    ), said


def test_a_cancel_that_meets_the_runs_own_end_takes_that_end() -> None:
    """The run ended between Potato's Cancel and ours: potato-queue answers 409, and the run's end counts."""
    run = "/admin/training/api/runs/20260101T000000-aaaaaa"
    server = Recorder(
        {
            ("POST", f"{run}/cancel"): (409, b'{"detail": "Run ... is succeeded"}'),
            ("GET", run): (200, b'{"state": "succeeded"}'),
        }
    )
    try:
        client = QueueClient.from_env(None, {**KEY, "POTATO_QUEUE_URL": server.url})
        assert Follower(client, "20260101T000000-aaaaaa", _Stopped(), None).follow() == {"state": "succeeded"}
    finally:
        server.close()
