"""Chaos: each process of a run broken on purpose, and the queue never wedged.

One stack per module (per xdist worker): its own Redis (one case freezes it), `potato-queue serve`, one
executor, a real sshd on 127.0.0.1 for the ssh backend and a real agent process on this machine for the agent
backend; heartbeat_timeout_s is 3 s, max_wall_seconds 12 s. Each case starts a long run (majority-baseline
holding 60 s: no CPU spent), waits until its worker trains, then kills (SIGKILL) or freezes (SIGSTOP) one
process: the server, the executor, the agent, the worker, the ssh session's sshd, or Redis (also killed and
started again empty). An operator's restart follows where one would (systemd restarts the server and the
executor; the admin registers the agent backend again after Redis came back empty). Then, within the bounds:

- the run has ended in a true state that says what happened;
- nothing of the run is left: no process (here or on the host), no socket, no job folder on the host;
- the run ran once (one worker start in its agent's log);
- the next run succeeds: the run slot is free.

The table of cases and outcomes is printed at the end of the session (tests/conftest.py). Elsewhere: a setup
that hangs (test_ssh_backend), a copy cut short (test_ssh_backend), a disk that stops taking writes
(test_hardening), a SLURM session killed mid-run and a job pending too long (test_slurm_backend).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from potato_queue.processes.embedded_redis import EmbeddedRedis
from tests.agent_helpers import AGENT, register
from tests.conftest import CHAOS_TABLE_ENV
from tests.lifecycle_helpers import (
    TERMINAL,
    Services,
    agent_pid,
    alive_cmd,
    make_project,
    parent_of,
    pids,
    processes_of,
    run_paths,
    session_of,
    wait_running,
    wait_until,
)
from tests.sshd import ALIAS, Sshd

HOLD = {"trainer": "majority-baseline", "schemas": ["sentiment"], "params": {"hold_s": 60}}
QUICK = {"trainer": "majority-baseline", "schemas": ["sentiment"]}
HEARTBEAT_S = 3
MAX_WALL_S = 12
SSH, SLOW, PULL = "gpu-server", "slow-host", "lab"
# slow-host's interpreter takes SETUP_S to start the bootstrap: a setup long enough to break something in.
SETUP_S = 4
# The setup's own bound, which a case breaking the setup must beat.
SETUP_TIMEOUT_S = 12
# Everything a case waits for ends well within this: the orphan rule (15 s of quiet) after a restart is the
# longest bound.
END_WITHIN_S = 60


@dataclass
class Stack:
    svc: Services
    redis: EmbeddedRedis
    tmp: Path
    ssh_env: dict[str, str]
    token: str = ""
    server: subprocess.Popen[str] | None = None
    executor: subprocess.Popen[str] | None = None
    agent: subprocess.Popen[bytes] | None = None

    @property
    def remote(self) -> Path:
        return self.tmp / "remote"

    @property
    def agent_out(self) -> Path:
        return self.tmp / "agent.out"

    def start_agent(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POTATO_")}
        env["POTATO_TRAINING_TOKEN"] = self.token
        with open(self.agent_out, "ab") as out:
            self.agent = subprocess.Popen(
                [*AGENT, "--server", self.svc.url, "--backend", PULL, "--workdir", str(self.tmp / "agent-work")],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.tmp,
                start_new_session=True,
            )

    def restart(self, which: str) -> None:
        """What systemd does for a process that died: start it again."""
        if which == "server":
            self.start_server()
            if self.agent is not None:  # the agent was told the old address
                self.stop_agent()
                self.start_agent()
        elif which == "executor":
            self.executor = self.svc.executor(env=self.ssh_env)
        elif which == "agent":
            self.start_agent()
        elif which == "redis":  # it keeps nothing: it comes back empty, and the admin registers the agent again
            self.redis.process.wait()  # type: ignore[union-attr]
            self.redis.socket_path.unlink(missing_ok=True)
            self.redis.start()
            wait_until(self.server_url_known, 15, "the server recording its address again")
            self.stop_agent()
            self.token = register(self.svc, PULL)
            self.start_agent()

    def server_url_known(self) -> bool:
        import redis

        from potato_queue.store.keys import Keys

        with redis.Redis.from_url(self.redis.url) as client:
            return client.get(Keys.of(self.svc.project_config).server_url) == self.svc.url.encode()

    def start_server(self) -> None:
        self.svc.serve()
        self.server = self.svc.procs[-1]

    def stop_agent(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            os.killpg(self.agent.pid, signal.SIGKILL)
            self.agent.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, sshd: Sshd) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("chaos")
    redis_server = EmbeddedRedis(tmp / "redis")
    url = redis_server.start()
    sshd.write_config("root")
    slow = tmp / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep {SETUP_S}\nexec {sys.executable} "$@"\n')  # its runs never get to a copy
    slow.chmod(0o755)
    backends = {
        SSH: {
            "type": "ssh",
            "host": ALIAS,
            "python": sys.executable,
            "gpus": "none",
            "remote_dir": str(tmp / "remote"),
            "heartbeat_timeout_s": HEARTBEAT_S,
        },
        SLOW: {
            "type": "ssh",
            "host": ALIAS,
            "python": str(slow),
            "gpus": "none",
            "remote_dir": str(tmp / "remote"),
            "heartbeat_timeout_s": HEARTBEAT_S,
            "setup_timeout_s": SETUP_TIMEOUT_S,
        },
        PULL: {"type": "agent", "heartbeat_timeout_s": HEARTBEAT_S},
    }
    svc = Services(
        make_project(
            tmp, backends=backends, heartbeat_timeout_s=HEARTBEAT_S, max_wall_seconds=MAX_WALL_S, grace_seconds=2
        ),
        url,
        tmp,
    )
    ssh_env = {"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)}
    try:
        stack = Stack(svc, redis_server, tmp, ssh_env)
        stack.start_server()
        stack.restart("executor")
        stack.token = register(svc, PULL)
        stack.start_agent()
        yield stack
        stack.stop_agent()
    finally:
        svc.stop()
        redis_server.stop()


# -- the victims: which process of the run, found as an operator would ----------------------------------------


def _local_agent(stack: Stack, run_id: str) -> int:
    return agent_pid(run_paths(stack.svc, run_id).dir)


def _local_worker(stack: Stack, run_id: str) -> int:
    agent = _local_agent(stack, run_id)
    return _one(p for p in pids() if session_of(p) == agent and "potato_queue.worker" in (alive_cmd(p) or ""))


def _host(stack: Stack, module: str) -> int:
    return _one(p for p in pids() if f"{stack.remote}/code/" in (alive_cmd(p) or "") and module in (alive_cmd(p) or ""))


def _pull_worker(stack: Stack, run_id: str) -> int:
    assert stack.agent is not None
    return _one(p for p in pids() if session_of(p) == stack.agent.pid and "potato_queue.worker" in (alive_cmd(p) or ""))


def _in_setup(stack: Stack) -> list[int]:
    """The host's side of slow-host's setup: its interpreter's wrapper (our ssh client's command line names
    it too, and is not it)."""
    return [
        p
        for p in pids()
        if str(stack.tmp / "slow-python") in (alive_cmd(p) or "") and not (alive_cmd(p) or "").startswith("ssh ")
    ]


def _one(found: Iterator[int]) -> int:
    pids_found = list(found)
    assert len(pids_found) == 1, [alive_cmd(p) for p in pids_found]
    return pids_found[0]


Victim = Callable[[Stack, str], int]
VICTIMS: dict[str, Victim] = {
    "server": lambda stack, run_id: stack.server.pid,  # type: ignore[union-attr]
    "executor": lambda stack, run_id: stack.executor.pid,  # type: ignore[union-attr]
    "redis": lambda stack, run_id: stack.redis.process.pid,  # type: ignore[union-attr]
    "local agent": _local_agent,
    "local worker": _local_worker,
    "host agent": lambda stack, run_id: _host(stack, "potato_queue.agent"),
    "host worker": lambda stack, run_id: _host(stack, "potato_queue.worker"),
    "sshd session": lambda stack, run_id: parent_of(_host(stack, "potato_queue.agent")) or 0,
    # During slow-host's setup: the shell sshd started, now the interpreter's wrapper, and its sshd.
    "setup sshd session": lambda stack, run_id: parent_of(_one(iter(_in_setup(stack)))) or 0,
    "pull agent": lambda stack, run_id: stack.agent.pid,  # type: ignore[union-attr]
    "pull worker": _pull_worker,
}


@dataclass(frozen=True)
class Case:
    backend: str
    victim: str
    how: str  # "kill" (SIGKILL) or "stop" (SIGSTOP, then SIGCONT after `for_s`)
    moment: str  # "training": the worker trains; "setup": the ssh setup on the host (slow-host)
    state: str
    error: str  # a regex the run's error must match from its start
    restart: str | None = None  # started again after the kill, as systemd would
    for_s: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.backend}: {self.how} {self.victim} ({self.moment})"


NO_RESULT = r"The agent stopped without reporting a result"
SILENT = r"No word from the agent on {backend} for 3 seconds"
EXECUTOR_GONE = r"The executor supervising this run stopped \(killed or restarted\)"
REDIS = r"Redis was unreachable \("
STALLED = r"This executor did not renew the run slot within its lease \(10 s\): it was stalled"
WALL = r"The run did not finish within max_wall_seconds \(12 s\) and was stopped"
WORKER_KILLED = r"The worker exited with code -?\d+"
EMPTIED = r"Redis lost its data during the run \(restarted without persistence, or flushed\)"

CASES = [
    Case("local", "local worker", "kill", "training", "failed", WORKER_KILLED),
    Case("local", "local worker", "stop", "training", "failed", WALL, for_s=60),
    Case("local", "local agent", "kill", "training", "failed", NO_RESULT),
    Case("local", "server", "kill", "training", "failed", SILENT, restart="server"),
    Case("local", "executor", "kill", "training", "failed", EXECUTOR_GONE, restart="executor"),
    Case("local", "redis", "stop", "training", "failed", REDIS, for_s=15),
    Case(SSH, "host worker", "kill", "training", "failed", WORKER_KILLED),
    Case(SSH, "host agent", "kill", "training", "failed", NO_RESULT),
    Case(SSH, "sshd session", "kill", "training", "failed", NO_RESULT),
    Case(SSH, "executor", "kill", "training", "failed", EXECUTOR_GONE, restart="executor"),
    Case(SLOW, "executor", "kill", "setup", "failed", EXECUTOR_GONE, restart="executor"),
    Case(SLOW, "setup sshd session", "kill", "setup", "failed", r"ssh to \S+ failed: Connection to \S+ closed"),
    Case("local", "redis", "kill", "training", "failed", EMPTIED, restart="redis"),
    Case("local", "server", "stop", "training", "failed", SILENT, for_s=10),
    Case(SSH, "executor", "stop", "training", "failed", STALLED, for_s=15),
    Case(PULL, "pull agent", "stop", "training", "failed", SILENT, for_s=10),
    Case(PULL, "pull agent", "kill", "training", "failed", SILENT, restart="agent"),
    Case(PULL, "pull worker", "kill", "training", "failed", WORKER_KILLED),
]


def _leftovers(stack: Stack, case: Case, run_id: str, pull: tuple[int, int]) -> list[str]:
    """What of the run is still there, after the bounds' time to go. `pull`: the agent backend's agent (its
    session) and the run's worker, as they were when the run trained."""
    deadline = time.monotonic() + 15
    while True:
        left = processes_of(run_id, run_paths(stack.svc, run_id).dir if case.backend == "local" else None)
        if case.backend in (SSH, SLOW):
            left += [
                cmd
                for cmd in (alive_cmd(p) for p in pids())
                if cmd and (f"{stack.remote}/code/" in cmd or str(stack.tmp / "slow-python") in cmd)
            ]
            left += [str(p) for p in Path("/tmp").glob(f"potato-queue-{run_id}-*.sock")]
            left += [str(p) for p in [stack.remote / "jobs" / run_id] if p.exists()]
        if case.backend == PULL:
            agent, worker = pull
            # The run's worker; and, when the agent itself died, anything of its session (an agent that
            # lives on keeps a worker started ahead for its next run, which is not this run's).
            left += [
                cmd
                for p in pids()
                if (p == worker or (session_of(p) == agent and alive_cmd(agent) is None)) and (cmd := alive_cmd(p))
            ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _starts(stack: Stack, case: Case, run_id: str) -> int:
    """How many times the run's worker was started: once, whatever broke."""
    if case.backend != PULL:
        return run_paths(stack.svc, run_id).agent_log.read_text(errors="replace").count("worker started")
    # One agent serves many runs: what it logged between claiming this run and the next claim.
    text = stack.agent_out.read_text(errors="replace")
    return sum(
        part.split("claimed run ", 1)[0].count("worker started") for part in text.split(f"claimed run {run_id}")[1:]
    )


def _table_row(case: Case, outcome: str, took_s: float) -> None:
    folder = Path(os.environ[CHAOS_TABLE_ENV])
    slug = re.sub(r"[^a-z0-9]+", "-", case.name.lower())
    (folder / f"{slug}.txt").write_text(f"{case.name:<32} -> {outcome} (known {took_s:.1f} s after)\n")


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name.replace(" ", "-").replace(":", ""))
def test_a_run_whose_process_breaks_ends_true_and_the_next_run_runs(stack: Stack, case: Case) -> None:
    if case.backend == PULL and (stack.agent is None or stack.agent.poll() is not None):
        stack.start_agent()
    backend = case.backend
    run_id = stack.svc.start_run(backend=backend, **HOLD)
    if case.moment == "setup":
        wait_until(lambda: _in_setup(stack), 30, "the setup on the host")
    else:
        wait_running(stack.svc, run_id, timeout_s=60)
    victim = VICTIMS[case.victim](stack, run_id)
    assert victim > 0
    pull = (stack.agent.pid, _pull_worker(stack, run_id)) if case.backend == PULL and stack.agent else (0, 0)
    broke_s = time.monotonic()
    os.kill(victim, signal.SIGSTOP if case.how == "stop" else signal.SIGKILL)
    try:
        if case.restart:
            time.sleep(1)
            stack.restart(case.restart)
        if case.how == "stop":
            _wait_final_or(stack, run_id, broke_s + case.for_s)
    finally:
        if case.how == "stop":
            with contextlib.suppress(ProcessLookupError):  # killed while frozen: the hard stop reached it
                os.kill(victim, signal.SIGCONT)
    run = stack.svc.wait_for(run_id, TERMINAL, END_WITHIN_S)
    took_s = time.monotonic() - broke_s
    outcome = f"{run['state']}: {run.get('error') or ''}"[:110]
    _table_row(case, outcome, took_s)
    assert run["state"] == case.state, (run, stack.svc.logs())
    assert re.match(case.error.format(backend=backend), run["error"] or ""), run["error"]
    assert _leftovers(stack, case, run_id, pull) == [], "nothing of the run is left"
    assert _starts(stack, case, run_id) == (1 if case.moment == "training" else 0), "the run ran once, or not at all"
    after = stack.svc.start_run(backend=backend, **QUICK)
    assert stack.svc.wait_for(after, TERMINAL, END_WITHIN_S)["state"] == "succeeded", stack.svc.logs()


def _wait_final_or(stack: Stack, run_id: str, until_s: float) -> None:
    """While a process is frozen: until the run ends, or until_s (monotonic). The run folder's run.json says
    so, as the record of truth: a frozen server or Redis answers nothing."""
    run_json = run_paths(stack.svc, run_id).run_json
    while time.monotonic() < until_s:
        with contextlib.suppress(OSError, ValueError):  # replaced atomically, but read it as a stranger would
            if json.loads(run_json.read_text()).get("state") in TERMINAL:
                return
        time.sleep(0.2)
