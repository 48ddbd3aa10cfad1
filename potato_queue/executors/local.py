"""The local backend: the agent as a subprocess of the executor, on this machine.

The agent runs in a session of its own; the worker it starts gets its own
process group inside that session. The hard stop is therefore: SIGKILL every
process left in the agent's session (and any that names the run's folder),
so nothing of the run survives. Asking the agent to stop first is the run
lifecycle's job, the same on every backend.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from potato_queue.agent.launchers.process import scan_processes
from potato_queue.config import LocalBackend
from potato_queue.executors.base import (
    AgentResult,
    CheckReport,
    Executor,
    Gone,
    LaunchSpec,
    RunHandle,
    Running,
    Status,
)
from potato_queue.settings import DEFAULT_SETTINGS, Settings
from potato_queue.wire.isolated import CODE_ROOT, allowed_env, python_argv

__all__ = ["LocalExecutor", "LocalHandle", "run_pids", "describe_device"]

DESCRIBE_TIMEOUT_S = 60.0
KILLED_WAIT_S = 5.0  # a SIGKILLed process is gone within ms, unless stuck in the kernel (D state)
KILLED_POLL_S = 0.002  # how often that is looked at: a killed process goes in about a millisecond
REPORTED_EXIT_S = 0.5  # an agent that reported its result leaves by itself this soon


def describe_device(requested: str = "auto") -> str:
    """The device a local run would use, in words (LOC-2), asked of the worker's own code in a
    subprocess: importing torch into the executor would cost every run's start ~1 s and ~300 MB."""
    argv = python_argv(sys.executable, "potato_queue.worker", ["--describe-device", requested])
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=DESCRIBE_TIMEOUT_S,
            cwd=CODE_ROOT,
            env=allowed_env(),
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({sys.executable} could not be asked: {exc})"
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if proc.returncode == 0 and lines else f"unknown ({proc.stderr.strip()[-300:]})"


def run_pids(sid: int, marker: str) -> list[int]:
    """Pids in the agent's session (the agent, the worker, its children), or whose command line
    names the run's folder (should one have left the session)."""
    me = os.getpid()
    needle = marker.encode()
    return [
        p.pid
        for p in scan_processes(with_cmdline=True)
        if p.pid != me and p.state != "Z" and (p.sid == sid or needle in p.cmdline)
    ]


def _kill_run(sid: int, marker: str, leader_reaped: bool) -> None:
    """SIGKILL the run's processes, and return once they are gone (at most KILLED_WAIT_S): a run whose
    end is recorded has no process left, even on a machine too loaded to reap them at once. The session's
    leader (the agent, our child) is signalled by its pid only while it is not reaped: a reaped pid may be
    another process's already."""
    alive = run_pids(sid, marker)
    for pid in set(alive) | (set() if leader_reaped else {sid}):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline_s = time.monotonic() + KILLED_WAIT_S
    while alive and time.monotonic() < deadline_s:  # none found: none to wait for (the usual end)
        time.sleep(KILLED_POLL_S)
        alive = run_pids(sid, marker)


class _SpareAgent:
    """One agent process started ahead of time, waiting on stdin for its run.

    Starting Python and importing the agent costs tens of milliseconds; a
    warm agent makes a run's start that much closer to starting the worker by
    hand. The agent is standard library only, so it runs with -S (no site
    packages to scan). A spare whose executor dies sees EOF and exits.
    """

    def __init__(self) -> None:
        self._spare: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        argv = python_argv(sys.executable, "potato_queue.agent", ["run", "--assignment-on-stdin"], no_site=True)
        # The agent and the worker it starts get the allow-listed environment, not the executor's
        # (its Redis URL, the admin key).
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=allowed_env(),
            start_new_session=True,
            cwd=CODE_ROOT,
        )

    def take(self) -> subprocess.Popen[bytes]:
        """The warm agent (or a new one); call refill() once it has its assignment."""
        proc = self._spare if self._spare is not None and self._spare.poll() is None else self._spawn()
        self._spare = None
        return proc

    def refill(self) -> None:
        # After the hand-over, so forking the next one is not on this run's critical path.
        if self._spare is None:
            self._spare = self._spawn()

    def close(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None and spare.stdin is not None:
            spare.stdin.close()  # EOF: the spare exits on its own
            spare.wait(timeout=10)


class LocalHandle(RunHandle):
    def __init__(self, proc: subprocess.Popen[bytes], spec: LaunchSpec) -> None:
        self.proc, self.spec = proc, spec

    def poll(self) -> Status:
        code = self.proc.poll()
        return Running() if code is None else Gone(f"the agent (pid {self.proc.pid}) exited with code {code}")

    def kill(self) -> None:
        _kill_run(self.proc.pid, str(self.spec.paths.dir), leader_reaped=self.proc.poll() is not None)
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def collect(self, result: AgentResult) -> str | None:
        try:  # an agent that reported is on its way out: let it go by itself rather than kill it mid-exit
            self.proc.wait(timeout=REPORTED_EXIT_S)
        except subprocess.TimeoutExpired:
            pass
        self.kill()  # anything the agent left behind
        paths = self.spec.paths
        work = paths.agent_workdir / self.spec.run_id / "work"
        if work.is_dir():
            paths.artifacts.mkdir(mode=0o700, exist_ok=True)
            for item in work.iterdir():
                if item.name != "predictions.jsonl":
                    item.rename(paths.artifacts / item.name)
        return str(paths.artifacts)


class LocalExecutor(Executor[LocalBackend]):
    type_name = "local"

    def __init__(self, backend_name: str, backend: LocalBackend, settings: Settings = DEFAULT_SETTINGS) -> None:
        super().__init__(backend_name, backend, settings)
        self._spares = _SpareAgent()

    def check(self, model: str | None = None) -> CheckReport:
        device = describe_device(self.backend.device)
        report = CheckReport(ok=True, lines=[f"local: this machine, {device}"], data={"device": device})
        if model is None:
            return report
        from importlib.util import find_spec

        from potato_queue.host.check import find_model_config, nvidia_smi
        from potato_queue.host.nvidia_smi import NVIDIA_SMI_QUERY, parse_gpus

        gpus = [] if self.backend.device == "cpu" else parse_gpus(nvidia_smi(NVIDIA_SMI_QUERY))
        report.data["llm_facts"] = {
            "model_config": find_model_config(model),
            "bitsandbytes": find_spec("bitsandbytes") is not None,
            "gpus": [[gpu.index, gpu.free_mb] for gpu in gpus if gpu.free_mb is not None],
        }  # not MIG's [N/A]
        return report

    def launch(self, spec: LaunchSpec) -> RunHandle:
        if spec.token is None:
            raise ValueError("a local run needs its run token")
        workdir = spec.paths.agent_workdir
        workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        proc = self._spares.take()
        assignment = {
            "run_id": spec.run_id,
            "server": spec.server_url,
            "workdir": str(workdir),
            "log": str(spec.paths.agent_log),
            "checkpoints": str(spec.paths.local_checkpoints),
        }
        assert proc.stdin is not None
        # The token travels on stdin only; the pipe stays open so the agent
        # sees EOF (and stops its worker) if this executor dies.
        proc.stdin.write(json.dumps(assignment).encode() + b"\n" + spec.token.encode() + b"\n")
        proc.stdin.flush()
        self._spares.refill()
        # The worker resolves and logs the device; naming it here would import torch into the executor.
        spec.step(f"started the agent on this machine (pid {proc.pid})")
        return LocalHandle(proc, spec)

    def warm(self) -> None:
        self._spares.refill()

    def close(self) -> None:
        self._spares.close()
