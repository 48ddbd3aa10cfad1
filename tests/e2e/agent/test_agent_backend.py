"""The agent backend, for real: the training machine is a network namespace behind a one-way firewall.

The server listens on the host side of a veth pair; `potato-queue training
agent` (or the served agent.pyz on a bare Python 3.8) runs inside the
namespace, whose nft table drops every new inbound connection and counts
them: the server can never open a connection to the agent, and the tests
check it never tried. A silent network cut is an nft table that drops
everything both ways (tests/netns.py). Everything else is real: Redis, the
server, the executor, the agent and the worker.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import ssl
import string
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from potato_queue.store.keys import project_predictions_path
from tests.agent_helpers import AGENT, BACKEND, PYTHON38, Agent, lab, nat_host, register
from tests.conftest import ROOT
from tests.lifecycle_helpers import (
    TERMINAL,
    Services,
    alive_cmd,
    held_run,
    make_project,
    run_paths,
    started,
    wait_until,
)
from tests.netns import NatHost
from tests.nginx import tls_files


@pytest.fixture
def nat() -> Iterator[NatHost]:
    with nat_host() as host:
        yield host


@pytest.fixture
def behind_nat(tmp_path: Path, redis_server_url: str, nat: NatHost) -> Iterator[Services]:
    with started(tmp_path, redis_server_url, host=nat.host_ip, **lab(heartbeat_timeout_s=60)) as svc:
        yield svc


def _server_connections(svc: Services) -> dict[str, tuple[int, int]]:
    """The server's open connections as the kernel has them (`ss`), by peer ("address:port"): the bytes that came
    in on it that the server has not read yet (Recv-Q), and all the bytes it received on it."""
    port = urllib.parse.urlsplit(svc.url).port
    out = subprocess.run(
        ["ss", "-Htni", "state", "established", "sport", "=", f":{port}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    found: dict[str, tuple[int, int]] = {}
    peer = ""
    for line in out.splitlines():
        if line[:1].isspace():  # the tcp_info of the connection on the line before
            received = re.search(r"\bbytes_received:(\d+)", line)
            found[peer] = (found[peer][0], int(received.group(1)) if received else 0)
        elif line.strip():
            unread, _, _, peer = line.split()[:4]
            found[peer] = (int(unread), 0)
    return found


def _claims_read_from(svc: Services, host: str) -> int:
    """Connections from `host` whose request the server has read, every byte that came (an agent's first request
    is its claim: read, it waits in the claim's long-poll)."""
    return sum(
        1
        for peer, (unread, received) in _server_connections(svc).items()
        if peer.rsplit(":", 1)[0] == host and received and not unread
    )


def _all_read(svc: Services) -> bool:
    """The server has read every byte that came in on its connections."""
    return not any(unread for unread, _ in _server_connections(svc).values())


def _wait(condition: Callable[[], Any], timeout_s: float, what: str, context: Callable[[], Any]) -> None:
    """wait_until, with `context()` (an agent's output, the server's logs: read when it fails) in its message."""
    try:
        wait_until(condition, timeout_s, what)
    except AssertionError as failed:
        raise AssertionError(f"{failed}: {context()}") from None


def _on_sent(sent: threading.Event) -> dict[str, Any]:
    """httpx request extensions that set `sent` once the whole request is written (then it waits for the answer)."""

    def trace(event: str, info: Any) -> None:
        if event == "http11.send_request_body.complete":
            sent.set()

    return {"trace": trace}


def test_an_agent_behind_nat_runs_a_run_and_keeps_the_model_there(behind_nat: Services, nat: NatHost) -> None:
    svc = behind_nat
    agent = Agent(nat, svc, register(svc), "--once")
    run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 120)
    assert run["state"] == "succeeded", (run, agent.output())
    assert agent.wait() == 0
    host, folder = run["artifact_uri"].split(":", 1)
    assert host == socket.gethostname() and folder.startswith(str(agent.workdir))
    assert any(Path(folder).iterdir()), "the model files stay on the training machine"
    assert run["held_out"]["sentiment"]["test"]["n"] > 0
    assert project_predictions_path(svc.project_config).exists()
    assert nat.refused_inbound() == 0, "something tried to connect into the machine behind NAT"


def test_a_run_waits_queued_for_an_agent_and_fails_after_queue_timeout(tmp_path: Path, redis_server_url: str) -> None:
    with started(tmp_path, redis_server_url, **lab(queue_timeout_s=3)) as svc:
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
        wait_until(
            lambda: svc.api("GET", f"/runs/{run_id}")[1]["step"] == f"waiting for an agent on {BACKEND}",
            30,
            "the offer",
        )
        assert svc.api("GET", f"/runs/{run_id}")[1]["state"] == "queued"
        run = svc.wait_for(run_id, TERMINAL, 30)
    assert run["state"] == "failed"
    assert run["error"].startswith(f"No agent on {BACKEND} asked for work within queue_timeout_s (3 s)")
    assert f"potato-queue training check {BACKEND}" in run["error"]


def test_an_agent_that_reports_its_job_pending_then_dies_fails_for_silence_and_the_run_behind_runs(
    tmp_path: Path, redis_server_url: str
) -> None:
    """A login-node agent claims, says its SLURM job is PENDING, then its node reboots: the pending status
    once made the run immune to every clock, and the local run behind it stayed queued for good."""
    import httpx

    prefix = "/api/training/agent/v1"
    with started(tmp_path, redis_server_url, **lab(heartbeat_timeout_s=3)) as svc:
        token = register(svc)
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        behind = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="local")
        with httpx.Client(base_url=svc.url, timeout=40) as http:
            claim = http.post(
                f"{prefix}/backends/{BACKEND}/claim",
                params={"wait_s": 20},
                json={"host": "login-1"},
                headers={"Authorization": f"Bearer {token}"},
            ).json()
            assert claim["run_id"] == run_id, claim
            pending = {"event": "status", "state": "pending", "step": "SLURM job 7: PENDING (Priority)"}
            assert http.post(
                f"{prefix}/runs/{run_id}/events",
                json={"events": [pending]},
                headers={"Authorization": f"Bearer {claim['token']}"},
            ).is_success
        run = svc.wait_for(run_id, TERMINAL, 30)
        assert (run["state"], run["error"]) == ("failed", f"No word from the agent on {BACKEND} for 3 seconds"), run
        assert svc.wait_for(behind, TERMINAL, 120)["state"] == "succeeded", "the run behind it ran"


def test_a_queued_agent_run_cancels_at_once_and_the_next_run_goes(tmp_path: Path, redis_server_url: str) -> None:
    with started(tmp_path, redis_server_url, **lab()) as svc:
        waiting = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
        after = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="local")
        wait_until(
            lambda: svc.api("GET", f"/runs/{waiting}")[1]["step"] == f"waiting for an agent on {BACKEND}",
            30,
            "the offer",
        )  # the slot is the waiting run's now
        assert svc.api("GET", f"/runs/{after}")[1]["state"] == "queued", "one run at a time, whatever the backend"
        assert svc.api("POST", f"/runs/{waiting}/cancel")[0] == 200
        assert svc.wait_for(waiting, TERMINAL, 10)["state"] == "cancelled"
        assert svc.wait_for(after, TERMINAL, 60)["state"] == "succeeded"


def test_two_agents_one_run_exactly_one_claims_it(behind_nat: Services, nat: NatHost) -> None:
    svc = behind_nat
    token = register(svc)
    agents = [Agent(nat, svc, token, "--once", name=f"agent{i}") for i in range(2)]
    wait_until(lambda: _claims_read_from(svc, nat.ip) == 2, 30, "both agents' claims, read by the server")
    run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
    assert svc.wait_for(run_id, TERMINAL, 120)["state"] == "succeeded"
    claimed = [a for a in agents if f"claimed run {run_id}" in a.output()]
    assert len(claimed) == 1, [a.output() for a in agents]
    idle = next(a for a in agents if a is not claimed[0])
    assert idle.proc.poll() is None, "the other agent is still waiting for work"
    idle.proc.send_signal(signal.SIGTERM)
    assert idle.wait(15) == 0


def test_a_replaced_token_stops_its_agent_with_the_fix(behind_nat: Services, nat: NatHost) -> None:
    svc = behind_nat
    agent = Agent(nat, svc, register(svc))
    wait_until(
        lambda: _claims_read_from(svc, nat.ip) == 1, 30, "the agent's claim, read by the server"
    )  # in its long-poll
    register(svc)  # the admin registers again: the old token stops working at once
    assert agent.wait(20) == 3
    out = agent.output()
    assert "refused this agent's token for backend lab" in out and f"potato-queue training register {BACKEND}" in out


def _claim(svc: Services, backend: str, token: str | None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"{svc.url}/api/training/agent/v1/backends/{backend}/claim?wait_s=0",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_backend_token_claims_only_its_own_backend(tmp_path: Path, redis_server_url: str) -> None:
    backends = {"backends": {"lab": {"type": "agent"}, "other": {"type": "agent"}}}
    with started(tmp_path, redis_server_url, executors=0, **backends) as svc:
        lab_token = register(svc, "lab")
        assert _claim(svc, "lab", lab_token) == (200, {"run_id": None, "token": None, "drain": False})
        status, reply = _claim(svc, "other", lab_token)
        assert status == 403 and reply["detail"] == "this token is for the agent backend lab, not other"
        status, reply = _claim(svc, "lab", None)
        assert status == 401 and "potato-queue training register lab CONFIG" in reply["detail"]


def test_check_shows_the_registration_and_the_agent_it_saw(behind_nat: Services, nat: NatHost) -> None:
    svc = behind_nat
    check = [sys.executable, "-m", "potato_queue.cli", "training", "check", BACKEND, str(svc.config)]
    before = subprocess.run(check, env=svc.env, capture_output=True, text=True, timeout=60)
    assert before.returncode == 1 and "no token issued yet" in before.stdout
    assert f"potato-queue training register {BACKEND} {svc.config}" in before.stdout
    token = register(svc)
    unseen = subprocess.run(check + ["--json"], env=svc.env, capture_output=True, text=True, timeout=60)
    assert unseen.returncode == 1 and json.loads(unseen.stdout)["last_seen"] is None
    agent = Agent(nat, svc, token)
    checks: list[subprocess.CompletedProcess[str]] = []

    def seen() -> bool:  # the agent's first claim marks the backend seen: `training check` passes from then on
        checks.append(subprocess.run(check + ["--json"], env=svc.env, capture_output=True, text=True, timeout=60))
        return checks[-1].returncode == 0

    try:
        _wait(seen, 30, "`training check` seeing the agent", lambda: (checks[-1].stdout, agent.output()))
    finally:
        agent.stop()
    report = json.loads(checks[-1].stdout)
    assert report["ok"] and report["last_seen"] is not None, (report, agent.output())
    assert report["agent"]["host"] == socket.gethostname()
    assert report["agent"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "scikit-learn" in report["agent"]["packages"]


def test_the_served_agent_runs_on_a_bare_python_38(behind_nat: Services, nat: NatHost) -> None:
    svc = behind_nat
    assert PYTHON38.exists(), f"{PYTHON38}: pyenv's CPython 3.8 stands in for an old GPU host"
    pyz = svc.tmp_path / "agent.pyz"
    # Fetched and checked inside the namespace with the register text's own line (curl, sha256sum).
    text = subprocess.run(
        [sys.executable, "-m", "potato_queue.cli", "training", "register", BACKEND, str(svc.config)],
        env=svc.env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    fetch = next(line.strip() for line in text.splitlines() if line.strip().startswith("curl "))
    assert "sha256sum -c -" in fetch
    assert "agent.pyz: OK" in nat.exec("sh", "-c", f"cd {svc.tmp_path} && {fetch}")
    token = text.splitlines()[2].strip()
    agent = Agent(nat, svc, token, "--once", argv=[str(PYTHON38), str(pyz)])
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 120)
    assert run["state"] == "succeeded", (run, agent.output())
    assert agent.wait() == 0
    assert "Python 3.8.18" in agent.output()
    assert (ROOT / "potato_queue") not in [Path(p) for p in agent.output().split()]


def test_the_token_is_in_no_command_line_url_or_log(behind_nat: Services, nat: NatHost) -> None:
    svc = behind_nat
    token = register(svc)
    agent = Agent(nat, svc, token, "--once")
    run_id = held_run(svc, backend=BACKEND)
    _wait_progress(svc, run_id)
    cmdlines = [p.read_bytes() for p in Path("/proc").glob("[0-9]*/cmdline") if p.exists()]
    assert not [c for c in cmdlines if token.encode() in c]
    assert svc.api("POST", f"/runs/{run_id}/cancel")[0] == 200
    assert svc.wait_for(run_id, TERMINAL, 60)["state"] == "cancelled"
    assert agent.wait(30) == 4, "with --once the agent exits with its run's exit code (4: cancelled)"
    texts = [agent.output(), svc.logs()] + [p.read_text(errors="replace") for p in svc.tmp_path.rglob("*.log")]
    assert not [t for t in texts if token in t]
    assert not nat.pids(), "nothing of the run is left on the training machine"


def _wait_progress(svc: Services, run_id: str, timeout_s: float = 60) -> None:
    _wait(
        lambda: svc.api("GET", f"/runs/{run_id}")[1].get("progress") is not None,
        timeout_s,
        f"progress of run {run_id} (its worker's first report)",
        svc.logs,
    )


def test_a_silent_network_cut_fails_the_run_and_the_agent_stops_its_worker(
    tmp_path: Path, redis_server_url: str, nat: NatHost
) -> None:
    with started(tmp_path, redis_server_url, host=nat.host_ip, **lab(heartbeat_timeout_s=5)) as svc:
        # --unreachable-s shortens AGT-7's 300 s for the test (an option documented as for testing).
        agent = Agent(nat, svc, register(svc), "--once", "--unreachable-s", "3")
        run_id = held_run(svc, backend=BACKEND)
        _wait_progress(svc, run_id)
        nat.cut()
        run = svc.wait_for(run_id, TERMINAL, 30)
        assert (run["state"], run["error"]) == ("failed", f"No word from the agent on {BACKEND} for 5 seconds")
        # On its side, the agent stops its worker 3 s after its last answer: a call hung on the silently cut
        # network fails within those 3 s (its timeout is no longer than the window), not after the usual 30 s.
        wait_until(lambda: "no answer from the server for 3 s: SIGTERM to" in agent.output(), 30, "the agent's SIGTERM")
        wait_until(
            lambda: not [p for p in nat.pids() if "potato_queue.worker" in (alive_cmd(p) or "")], 30, "the worker's end"
        )
        nat.restore()  # the hung calls get their answers: the agent ends (it lost the run, the server ended it)
        agent.wait(120)
        assert not nat.pids(), "nothing is left on the training machine"


def test_https_with_the_servers_ca_and_a_clear_error_without_it(
    tmp_path: Path, redis_server_url: str, nat: NatHost
) -> None:
    ca, cert, key = tls_files(tmp_path, nat.host_ip)
    svc = Services(make_project(tmp_path, **lab()), redis_server_url, tmp_path)
    svc.serve(nat.host_ip, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert svc.url.startswith("https://")
        svc.ssl_context = ssl.create_default_context(cafile=str(ca))
        svc.executor()
        token = register(svc)
        unverified = Agent(nat, svc, token, "--once", name="no-ca")
        assert unverified.wait(30) == 3
        assert "could not be verified" in unverified.output() and "--ca-file" in unverified.output()
        agent = Agent(nat, svc, token, "--once", "--ca-file", str(ca))
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
        assert svc.wait_for(run_id, TERMINAL, 120)["state"] == "succeeded", agent.output()
        assert agent.wait() == 0
    finally:
        svc.stop()


def test_predictions_over_max_predictions_mb_fail_the_run_saying_what_to_raise(
    tmp_path: Path, redis_server_url: str, nat: NatHost
) -> None:
    with started(tmp_path, redis_server_url, host=nat.host_ip, max_predictions_mb=0.001, **lab()) as svc:
        agent = Agent(nat, svc, register(svc), "--once")
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
        run = svc.wait_for(run_id, TERMINAL, 120)
        agent.wait()
    assert run["state"] == "failed"
    assert "above max_predictions_mb" in run["error"], run["error"]
    assert "raise model_training.max_predictions_mb" in run_paths(svc, run_id).run_log.read_text()


def test_a_bundle_download_cut_midway_resumes_and_is_verified(
    tmp_path: Path, redis_server_url: str, nat: NatHost
) -> None:
    with started(tmp_path, redis_server_url, host=nat.host_ip, **lab()) as svc:
        # ~3 MB of unlabelled items (incompressible text), over a 8 Mbit/s link: a download of seconds.
        data = svc.config.parent / "data" / "reviews.json"
        rng = random.Random(7)
        items = json.loads(data.read_text()) + [
            {"id": f"big{i}", "text": "".join(rng.choice(string.ascii_letters + " ") for _ in range(2000))}
            for i in range(2000)
        ]
        data.write_text(json.dumps(items))
        nat.slow("8mbit")
        agent = Agent(nat, svc, register(svc), "--once")
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        _wait(
            lambda: [p for p in agent.workdir.glob("*/bundle.tar.gz") if p.stat().st_size > 0],
            60,
            "a part of the bundle, on the training machine",
            agent.output,
        )
        nat.reset_connections_from(int(svc.url.rsplit(":", 1)[1]))
        # The reset has done its work once the agent says its download failed (it retries after a pause).
        wait_until(lambda: "GET bundle: " in agent.output(), 30, "the agent's download cut")
        nat.stop_resetting()
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert agent.wait() == 0
    out = agent.output()
    assert run["state"] == "succeeded", (run, out)
    assert "resuming the bundle download at byte" in out and "sha256 verified" in out, out


def test_an_agent_that_cannot_reach_the_server_says_what_to_check(nat: NatHost, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POTATO_")}
    env["POTATO_TRAINING_TOKEN"] = "some-token"
    server = f"http://{nat.host_ip}:9"  # nothing listens there
    with open(tmp_path / "agent.out", "w") as out:
        proc = nat.popen(
            [*AGENT, "--server", server, "--backend", BACKEND, "--workdir", str(tmp_path / "w")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        _wait(
            lambda: "is the server running" in (tmp_path / "agent.out").read_text(),
            30,
            "the agent's line on the unreachable server",
            (tmp_path / "agent.out").read_text,
        )
        text = (tmp_path / "agent.out").read_text()
        assert f"asking {server} for work" in text and "is --server the address this machine reaches it at?" in text
        assert proc.poll() is None, "it keeps trying: the server may be restarting"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def test_stopping_the_agent_cancels_its_run_with_grace_and_reports_it(behind_nat: Services, nat: NatHost) -> None:
    svc = behind_nat
    agent = Agent(nat, svc, register(svc))
    run_id = held_run(svc, backend=BACKEND)
    _wait_progress(svc, run_id)
    agent.proc.send_signal(signal.SIGTERM)  # Ctrl-C or a service manager stopping it
    run = svc.wait_for(run_id, TERMINAL, 60)
    assert (run["state"], run["exit_code"]) == ("cancelled", 4), run
    assert agent.wait(30) == 0, "stopped as asked: a clean exit"
    assert "the agent got SIGTERM: SIGTERM to" in agent.output()
    assert not nat.pids(), "the agent and its worker are gone"


def test_an_offer_left_by_a_dead_executor_for_a_cancelled_run_is_not_handed_out(
    tmp_path: Path, redis_server_url: str
) -> None:
    import redis

    from potato_queue.store import RunStore
    from potato_queue.validate import load_checked

    with started(tmp_path, redis_server_url, executors=0, **lab()) as svc:
        store = RunStore(load_checked(svc.config), redis.Redis.from_url(redis_server_url))
        token = register(svc)
        run_id = store.create(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)["run_id"]
        store.offers.offer(BACKEND, run_id)  # as an executor does, which then died
        assert store.request_cancel(run_id) == "cancelled"
        assert _claim(svc, BACKEND, token) == (200, {"run_id": None, "token": None, "drain": False})
        assert not store.offers.is_offered(BACKEND, run_id)


def test_idle_claims_that_wait_in_front_of_the_app_still_get_runs_refusals_and_errors(
    tmp_path: Path, redis_server_url: str
) -> None:
    """After one empty look, an agent's claims with the same token wait in the ClaimDoor (P7: no FastAPI on the
    idle path); everything a claim can meet must still come out as it does through the route."""
    import concurrent.futures

    import httpx

    path = f"/api/training/agent/v1/backends/{BACKEND}/claim"
    with (
        started(tmp_path, redis_server_url, **lab()) as svc,
        httpx.Client(base_url=svc.url, timeout=60) as http,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        token = register(svc)
        auth = {"Authorization": f"Bearer {token}"}

        def claim(wait_s: Any, body: Any = None, sent: threading.Event | None = None) -> httpx.Response:
            return http.post(
                path,
                params={"wait_s": wait_s},
                json={"host": "lab-1"} if body is None else body,
                headers=auth,
                extensions=None if sent is None else _on_sent(sent),
            )

        assert claim(0).json() == {
            "run_id": None,
            "token": None,
            "drain": False,
        }  # the look that lets the next ones wait
        bad = claim(0, {"host": 5})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "host"], bad.text
        assert claim(-1).status_code == 422 and claim("soon").status_code == 422
        started_s = time.monotonic()
        assert (
            claim(1).json() == {"run_id": None, "token": None, "drain": False} and time.monotonic() - started_s >= 1.0
        )

        sent = threading.Event()
        waiting = pool.submit(claim, 30, None, sent)
        # In its wait: the whole claim written, and the server read every byte that came.
        wait_until(lambda: sent.is_set() and _all_read(svc), 30, "the waiting claim, read by the server")
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        got = waiting.result(30).json()
        assert got["run_id"] == run_id and got["token"], got
        done = {"Authorization": f"Bearer {got['token']}"}
        assert http.post(
            f"/api/training/agent/v1/runs/{run_id}/result", json={"exit_code": 1, "message": "door"}, headers=done
        ).is_success
        assert svc.wait_for(run_id, TERMINAL, 30)["state"] == "failed"

        assert claim(0).json() == {"run_id": None, "token": None, "drain": False}
        sent = threading.Event()
        refused = pool.submit(claim, 30, None, sent)
        wait_until(lambda: sent.is_set() and _all_read(svc), 30, "the claim to refuse, read by the server")
        started_s = time.monotonic()
        register(svc)  # a new token: a claim made with the old one is refused at once, not at its deadline
        reply = refused.result(30)
        assert reply.status_code == 401 and time.monotonic() - started_s < 15, reply.text


def test_an_agent_that_leaves_its_idle_claim_passes_the_run_to_the_next(tmp_path: Path, redis_server_url: str) -> None:
    """Two claims wait in the ClaimDoor; the one waiting longer hangs up. The offer wakes it first, and the run
    goes on to the other claim instead of to nobody."""
    import concurrent.futures

    import httpx

    path = f"/api/training/agent/v1/backends/{BACKEND}/claim?wait_s=30"
    with started(tmp_path, redis_server_url, **lab()) as svc, concurrent.futures.ThreadPoolExecutor(1) as pool:
        token = register(svc)
        assert _claim(svc, BACKEND, token) == (200, {"run_id": None, "token": None, "drain": False})
        body = b'{"host": "gone"}'
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        host, port = urllib.parse.urlsplit(svc.url).hostname, urllib.parse.urlsplit(svc.url).port
        sent = threading.Event()

        def stay() -> httpx.Response:
            with httpx.Client(timeout=60) as client:
                return client.post(
                    f"{svc.url}{path}",
                    json={"host": "staying"},
                    headers={"Authorization": f"Bearer {token}"},
                    extensions=_on_sent(sent),
                )

        with socket.create_connection((host, port)) as gone:
            gone.sendall(head + body)
            # In line first: the server has read all of it before the second claim is sent.
            gone_peer = "{}:{}".format(*gone.getsockname())
            wait_until(
                lambda: _server_connections(svc).get(gone_peer) == (0, len(head + body)),
                30,
                "the first claim, read by the server",
            )
            staying = pool.submit(stay)
            wait_until(lambda: sent.is_set() and _all_read(svc), 30, "the second claim, read by the server")
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        got = staying.result(30).json()
        assert got["run_id"] == run_id, got
        assert svc.api("POST", f"/runs/{run_id}/cancel")[0] == 200
        assert svc.wait_for(run_id, TERMINAL, 30)["state"] == "cancelled"
