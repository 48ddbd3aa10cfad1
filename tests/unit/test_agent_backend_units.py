"""Pure parts of the agent backend: the register text, proxies, the download's progress, the claim's wake-ups."""

from __future__ import annotations

import asyncio
import io

import pytest

from potato_queue.agent.progress import MIN_LOGGED_BYTES, Progress
from potato_queue.agent.transport import _proxy_for, open_connection
from potato_queue.cli.agents import AGENT_PYZ_PATH, register_text
from potato_queue.executors.agent import no_agent_error

pytestmark = pytest.mark.unit


def test_register_prints_the_token_once_and_the_commands_for_the_training_machine() -> None:
    text = register_text("lab", "TOKEN123", "https://annotate.example.org", "ab" * 32)
    assert text.count("TOKEN123") == 3  # shown once, then in the two ways to start the agent
    assert "export POTATO_TRAINING_TOKEN=TOKEN123" in text
    assert "potato-queue training agent --server https://annotate.example.org --backend lab" in text
    assert (
        f"curl -fsSo agent.pyz https://annotate.example.org{AGENT_PYZ_PATH} && echo '{'ab' * 32}  agent.pyz' | "
        "sha256sum -c -"
    ) in text, "the one-line install checks the file it runs"
    assert "--token TOKEN123" not in text and "--token=" not in text
    assert "plain http" not in text


def test_register_without_a_known_url_says_what_to_put_in_and_warns_of_plain_http() -> None:
    text = register_text("lab", "T", None, "cd" * 32)
    assert "--server http://<this-server>:8000" in text and "Replace <this-server>" in text
    assert "This server speaks plain http: the token and the runs' data cross the network in clear" in text
    assert "plain http" not in register_text("lab", "T", "http://127.0.0.1:8000", "cd" * 32), "this machine only"


def test_the_queue_timeout_message_names_the_fix() -> None:
    assert no_agent_error("lab", 3600) == (
        "No agent on lab asked for work within queue_timeout_s (3600 s); fix: start one on the training machine "
        "(potato-queue training agent --server URL --backend lab), and see when one last asked with: "
        "potato-queue training check lab CONFIG"
    )


def test_proxies_come_from_the_environment_and_no_proxy_bypasses_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("https_proxy", "http://proxy.example.org:3128")
    monkeypatch.setenv("no_proxy", "internal.example.org")
    assert _proxy_for("https", "annotate.example.org") == ("proxy.example.org", 3128)
    assert _proxy_for("https", "internal.example.org") is None
    conn = open_connection("https://annotate.example.org:8443")
    assert (conn.host, conn.port) == ("proxy.example.org", 3128)
    assert (conn._tunnel_host, conn._tunnel_port) == ("annotate.example.org", 8443)  # CONNECT through it


def test_no_proxy_set_means_a_direct_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    conn = open_connection("http://10.0.0.1:8000")
    assert (conn.host, conn.port, conn._tunnel_host) == ("10.0.0.1", 8000, None)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_quarter_lines_in_a_log() -> None:
    lines: list[str] = []
    total = 4 * MIN_LOGGED_BYTES
    logged = Progress("bundle", total, lines.append, stream=io.StringIO())
    for done in range(0, total + 1, MIN_LOGGED_BYTES // 4):
        logged.update(done)
    assert lines == ["bundle: 25% (8 of 32 MB)", "bundle: 50% (16 of 32 MB)", "bundle: 75% (24 of 32 MB)"]
    tty = _Tty()
    bar = Progress("bundle", total, lines.append, stream=tty)
    bar.update(total)
    bar.finish()
    assert tty.getvalue() == "\rbundle [" + "#" * 30 + "] 100% 32/32 MB\n"


def test_a_small_download_shows_no_progress() -> None:
    lines: list[str] = []
    tty = _Tty()
    small = Progress("bundle", MIN_LOGGED_BYTES - 1, lines.append, stream=tty)
    small.update(MIN_LOGGED_BYTES - 1)
    small.finish()
    assert lines == [] and tty.getvalue() == ""


def test_an_offer_wakes_the_claim_waiting_longest_and_a_register_wakes_all() -> None:
    from potato_queue.server.claims import ClaimWakeups

    async def scenario() -> tuple[list[bool], list[bool]]:
        wakeups = ClaimWakeups(store=None)  # type: ignore[arg-type]
        wakeups._ready = asyncio.Event()
        wakeups._ready.set()
        wakeups._task = asyncio.get_running_loop().create_future()  # stands for the listener: not done
        line = [await wakeups.waiter("lab") for _ in range(3)]
        wakeups.wake("lab")
        one = [future.done() for _, future in line]
        wakeups.wake("lab", everyone=True)
        return one, [future.done() for _, future in line]

    assert asyncio.run(scenario()) == ([True, False, False], [True, True, True])


def test_an_idle_claim_waits_without_redis_only_while_nothing_can_have_been_offered() -> None:
    """ClaimWakeups' fast path (P7): a claim may skip Redis only after an empty look with the same token, no
    offer heard since, and the token accepted within AGENT_TOKEN_TRUST_S; a register forgets the token."""
    from potato_queue.server.claims import ClaimWakeups
    from potato_queue.store.tokens import AGENT_TOKEN_TRUST_S

    wakeups = ClaimWakeups(store=None)  # type: ignore[arg-type]  # the pure bookkeeping only
    assert not wakeups.nothing_offered("lab", "d1", 0.0), "nothing is known before the first look"
    mark = wakeups.heard("lab")
    wakeups.looked("lab", "d1", mark, empty=True, now_s=0.0)
    assert wakeups.nothing_offered("lab", "d1", 1.0)
    assert not wakeups.nothing_offered("lab", "d2", 1.0), "another token is asked about"
    assert not wakeups.nothing_offered("lab", "d1", AGENT_TOKEN_TRUST_S), "the token is asked about again in time"
    assert not wakeups.nothing_offered("other", "d1", 1.0)
    wakeups.wake("lab")  # an offer
    assert not wakeups.nothing_offered("lab", "d1", 1.0), "an offer heard: the next claim looks"
    # An offer heard while a look was in flight: its empty answer may predate the offer.
    mark = wakeups.heard("lab")
    wakeups.wake("lab")
    wakeups.looked("lab", "d1", mark, empty=True, now_s=2.0)
    assert not wakeups.nothing_offered("lab", "d1", 2.5)
    wakeups.looked("lab", "d1", wakeups.heard("lab"), empty=True, now_s=3.0)
    assert wakeups.nothing_offered("lab", "d1", 3.5)
    wakeups.wake("lab", everyone=True)  # a register: the old token must be refused by Redis
    wakeups.looked("lab", "d1", wakeups.heard("lab"), empty=True, now_s=4.0)
    wakeups.wake("lab", everyone=True)
    assert not wakeups.nothing_offered("lab", "d1", 4.5)


def test_the_claim_door_takes_only_a_well_formed_claim_and_leaves_the_rest_to_the_route() -> None:
    from potato_queue.server.claim_door import _claimed_backend, _wait_s

    def scope(path: str, method: str = "POST", query: bytes = b"") -> dict[str, object]:
        return {"type": "http", "method": method, "path": path, "query_string": query}

    prefix = "/api/training/agent/v1/backends"
    assert _claimed_backend(scope(f"{prefix}/lab/claim")) == "lab"
    assert _claimed_backend(scope(f"{prefix}/lab/claim", method="GET")) is None
    assert _claimed_backend(scope(f"{prefix}//claim")) is None
    assert _claimed_backend(scope(f"{prefix}/lab/claim/x")) is None
    assert _claimed_backend(scope(f"{prefix}/lab/other")) is None
    assert _claimed_backend({"type": "lifespan"}) is None, "startup and shutdown pass through (no path)"
    assert _wait_s(scope("", query=b"")) == 25.0, "the route's default"
    assert _wait_s(scope("", query=b"wait_s=90")) == 90.0
    assert _wait_s(scope("", query=b"wait_s=1e9")) == 100.0, "capped as the route caps it"
    for bad in (b"wait_s=-1", b"wait_s=soon", b"wait_s=nan", b"wait_s=inf"):
        assert _wait_s(scope("", query=bad)) is None, bad


def test_the_server_collects_garbage_on_its_schedule_and_python_never_starts_a_full_pass() -> None:
    """P7: Python's own full pass came when a run started and held the claim taking it for a second. The server's
    schedule must still free what only a full pass can: a reference cycle that reached the old generation."""
    import gc
    import time
    import weakref

    from potato_queue.processes.server import collect_on_schedule

    class Node:
        me: object = None

    saved = gc.get_threshold()
    stop = collect_on_schedule(young_every_s=0.02, full_every_s=1.0)
    try:
        assert gc.get_threshold()[:2] == saved[:2] and gc.get_threshold()[2] >= 2**31 - 1
        node = Node()
        node.me = node
        freed = weakref.ref(node)
        gc.collect(1)  # it survives the young passes: now in the old generation
        del node
        time.sleep(0.1)
        assert freed() is not None, "a young pass does not walk the old generation"
        deadline = time.monotonic() + 5
        while freed() is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert freed() is None, "the scheduled full pass freed the cycle"
    finally:
        stop.set()
        gc.set_threshold(*saved)
        gc.unfreeze()
