"""Taking an agent out of service without killing its run (issue 38): drained by `training agent --drain`
(SIGUSR1) or by the server's switch, an agent finishes the run in flight, claims no new one, and exits 0;
`training check` says so. Real server, executor, Redis, agent and worker. `--drain` signals only the agent
that holds DIR/agent.pid's lock, however it was started (issue 51)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import fake_gpus
from tests.agent_helpers import BACKEND, lab, register
from tests.conftest import run_cli
from tests.fake_gpus import LocalAgent
from tests.lifecycle_helpers import TERMINAL, Services, run_paths, started, wait_running, wait_until

PATH = "/usr/local/bin:/usr/bin:/bin"
# The console script, as the README starts an agent (`potato-queue training agent --server URL --backend NAME`)
# and drains it (`potato-queue training agent --drain --workdir DIR`): its process's command line names neither
# potato_queue nor agent.pyz.
CONSOLE_SCRIPT = str(Path(sys.executable).parent / "potato-queue")


@pytest.fixture
def lab_svc(tmp_path: Path, redis_server_url: str) -> Iterator[Services]:
    with started(tmp_path, redis_server_url, **lab()) as svc:
        yield svc


def state_of(svc: Services, run_id: str) -> str:
    return str(svc.api("GET", f"/runs/{run_id}")[1]["state"])


def check_lines(svc: Services) -> str:
    return run_cli("training", "check", BACKEND, svc.config).stdout


def test_a_drained_agent_finishes_its_run_claims_no_new_one_and_exits_0(lab_svc: Services) -> None:
    svc = lab_svc
    agent = LocalAgent(svc, register(svc), PATH)
    workdir = svc.tmp_path / "agent-work"
    try:
        wait_until(lambda: (workdir / "agent.pid").exists(), 30, "the agent's pid file")
        first = svc.start_run(
            trainer="majority-baseline", schemas=["sentiment"], params={"hold_s": 10}, backend=BACKEND
        )
        # Its worker training, with 10 s left for the CLI to start and signal: a drain that came after the run
        # (a loaded machine) would find the agent idle, and it would exit at once with no run to finish.
        wait_running(svc, first)
        told = run_cli("training", "agent", "--drain", "--workdir", workdir)
        assert told.returncode == 0, told.stdout + told.stderr
        assert told.stdout.strip() == (
            f"told the agent of backend {BACKEND} (pid {agent.proc.pid}) to drain: it finishes its run, claims no "
            "new one, then exits"
        )
        second = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        host = socket.gethostname()
        wait_until(
            lambda: f"agent {host} (pid {agent.proc.pid}) said it drains at" in check_lines(svc), 30, "check says"
        )
        assert agent.proc.wait(120) == 0, agent.output()
        assert svc.wait_for(first, TERMINAL, 60)["state"] == "succeeded", "the run in flight finished"
        assert state_of(svc, second) == "queued", "no new run was claimed"
        second_log = run_paths(svc, second).run_log  # a run nothing happened to yet may have no run.log at all
        assert not second_log.exists() or "claimed by" not in second_log.read_text()
        out = agent.output()
        assert "draining (the agent got SIGUSR1): the agent claims no new run; its run finishes, then it exits" in out
        assert "drained: no run in flight, none claimed; the agent exits" in out
        assert not (workdir / "agent.pid").exists()
        again = run_cli("training", "agent", "--drain", "--workdir", workdir)
        assert again.returncode == 1 and f"no agent serves from {workdir} (no agent.pid there)" in again.stdout
    finally:
        agent.stop()


def test_the_servers_switch_drains_a_backends_agents_until_switched_off(lab_svc: Services) -> None:
    svc = lab_svc
    token = register(svc)
    agent = LocalAgent(svc, token, PATH)
    try:
        wait_until(lambda: (svc.tmp_path / "agent-work" / "agent.pid").exists(), 30, "the agent serving")
        status, reply = svc.api("POST", f"/backends/{BACKEND}/drain")
        assert status == 200 and reply["draining"] is True, reply
        assert agent.proc.wait(120) == 0, agent.output()
        assert f"draining (the server's drain switch for backend {BACKEND})" in agent.output()
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        assert "  draining: switched on" in check_lines(svc)
        late = LocalAgent(svc, token, PATH, name="late")
        assert late.proc.wait(120) == 0, "an agent started while the switch is on claims nothing"
        assert state_of(svc, run_id) == "queued"
        assert svc.api("DELETE", f"/backends/{BACKEND}/drain")[1]["draining"] is False
        back = LocalAgent(svc, token, PATH, name="back")
        try:
            assert svc.wait_for(run_id, TERMINAL, 60)["state"] == "succeeded"
        finally:
            back.stop()
        status, refused = svc.api("POST", "/backends/local/drain")
        assert status == 409 and refused["detail"].startswith("Backend local is not an agent backend"), refused
    finally:
        agent.stop()


def pid_line(workdir: Path) -> str:
    try:
        return (workdir / "agent.pid").read_text()
    except FileNotFoundError:
        return ""


def test_the_console_scripts_agent_is_drained_by_its_workdir_and_a_second_one_serves_on(
    lab_svc: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = lab_svc
    token = register(svc)
    monkeypatch.setattr(fake_gpus, "AGENT", [CONSOLE_SCRIPT, "training", "agent"])  # LocalAgent's argv, no other
    agent = LocalAgent(svc, token, PATH)
    workdir = svc.tmp_path / "agent-work"
    second = None
    try:
        wait_until(lambda: pid_line(workdir) == f"{agent.proc.pid} {BACKEND}\n", 30, "the agent's pid file")
        # A second agent in the same folder (its last --workdir wins) serves on, and says how each one drains.
        second = LocalAgent(svc, token, PATH, "--workdir", str(workdir), name="second")
        said = (
            f"another agent serves from {workdir} ({workdir / 'agent.pid'} is locked): --drain --workdir {workdir} "
            f"reaches that one (pid {agent.proc.pid}); this one drains with kill -USR1 {second.proc.pid}"
        )
        wait_until(lambda: said in second.output(), 30, "the second agent's line")
        told = subprocess.run(
            [CONSOLE_SCRIPT, "training", "agent", "--drain", "--workdir", str(workdir)],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert told.returncode == 0, told.stdout + told.stderr
        assert told.stdout.strip() == (
            f"told the agent of backend {BACKEND} (pid {agent.proc.pid}) to drain: it finishes its run, claims no "
            "new one, then exits"
        )
        assert agent.proc.wait(60) == 0, agent.output()
        assert not (workdir / "agent.pid").exists(), "the agent that held it removed it"
        assert second.proc.poll() is None, "the second agent was not told: " + second.output()
        os.kill(second.proc.pid, signal.SIGUSR1)
        assert second.proc.wait(60) == 0, second.output()
    finally:
        agent.stop()
        if second is not None:
            second.stop()


def test_drain_signals_no_process_a_stale_pid_file_names(tmp_path: Path) -> None:
    # Alive, this account's, and with the words the old check took for an agent's (`.pyz`, `--backend`):
    # SIGUSR1's default action would kill it.
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--backend", "x.pyz"], stdin=subprocess.DEVNULL
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    pid_file = workdir / "agent.pid"
    pid_file.write_text(f"{bystander.pid} {BACKEND}\n")
    try:
        refused = run_cli("training", "agent", "--drain", "--workdir", workdir)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stdout.strip() == (
            f"{pid_file} names pid {bystander.pid}, but no agent holds it: the file is stale or forged (its agent "
            f"is gone, or never wrote it); nothing signalled; fix: remove {pid_file}, and give --workdir the "
            "folder a running agent was started with"
        )
        with pytest.raises(subprocess.TimeoutExpired):
            bystander.wait(1)  # a signal sent would have ended it by now
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
