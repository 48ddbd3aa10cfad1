"""The local backend: the agent as a subprocess of the executor, on this machine.

The agent runs in a session of its own; the worker it starts gets its own
process group inside that session. Stopping a run therefore means: ask the
agent (through the cancel flag it long-polls), wait the grace, then kill
every process left in the agent's session, so nothing of the run survives.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from potato_queue.config import ProjectConfig
from potato_queue.executors.base import CheckReport, Executor, RunContext

__all__ = ["LocalExecutor", "describe_device", "run_pids"]


@functools.lru_cache(maxsize=8)
def describe_device(requested: str = "auto") -> str:
    """The device a local run would use, in words (LOC-2)."""
    try:
        import torch
    except ImportError:
        return "CPU (torch is not installed here, so no accelerator can be used)"
    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if requested.startswith("cuda") and cuda:
        index = int(requested.split(":", 1)[1]) if ":" in requested else 0
        if index < torch.cuda.device_count():
            return f"CUDA GPU {index} ({torch.cuda.get_device_name(index)})"
    if requested in ("auto", "cuda") and cuda:
        return f"CUDA GPU 0 ({torch.cuda.get_device_name(0)})"
    if requested in ("auto", "mps") and mps:
        return "Apple Metal (mps)"
    if requested not in ("auto", "cpu"):
        return f"CPU ({requested} is not available here; runs fall back to the CPU)"
    return "CPU"


def run_pids(sid: int, marker: str) -> list[int]:
    """Pids in the agent's session (the agent, the worker, its children), or
    whose command line names the run's folder (should one have left the
    session). One pass over /proc (Linux; empty elsewhere).
    """
    pids = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if (len(fields) > 3 and int(fields[3]) == sid) or marker.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def _kill_run(sid: int, marker: str) -> None:
    """SIGKILL the agent's session and every process started for the run's folder."""
    for pid in set(run_pids(sid, marker)) | {sid}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _SpareAgents:
    """One agent process started ahead of time, waiting on stdin for its run.

    Starting Python and importing the agent costs tens of milliseconds; a
    warm agent makes a run's start that much closer to starting the worker by
    hand. The agent is standard library only, so it runs with -S (no site
    packages to scan). A spare whose executor dies sees EOF and exits.
    """

    def __init__(self) -> None:
        self._spare: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        # Thread counts travel in the job's limits; the worker applies them (every backend alike).
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        argv = [sys.executable, "-S", "-m", "potato_queue.agent", "run", "--assignment-on-stdin"]
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env, start_new_session=True, cwd="/")

    def take(self) -> subprocess.Popen[bytes]:
        """The warm agent (or a new one); call refill() once it has its assignment."""
        proc = self._spare if self._spare is not None and self._spare.poll() is None else self._spawn()
        self._spare = None
        return proc

    def refill(self) -> None:
        # After the hand-over, so forking the next one is not on this run's critical path.
        if self._spare is None:
            self._spare = self._spawn()


_SPARES = _SpareAgents()


class LocalExecutor(Executor):
    type_name = "local"

    def check(self, config: ProjectConfig, backend_name: str) -> CheckReport:
        device = describe_device(config.model_training.device)
        return CheckReport(ok=True, lines=[f"local: this machine, {device}"], data={"device": device})

    def start(self, ctx: RunContext) -> None:
        workdir = ctx.paths.agent_workdir
        workdir.mkdir(parents=True, exist_ok=True)
        proc = _SPARES.take()
        assignment = {"run_id": ctx.run_id, "server": ctx.server_url, "workdir": str(workdir),
                      "log": str(ctx.paths.agent_log)}
        assert proc.stdin is not None
        # The token travels on stdin only; the pipe stays open so the agent
        # sees EOF (and stops its worker) if this executor dies.
        proc.stdin.write(json.dumps(assignment).encode() + b"\n" + ctx.token.encode() + b"\n")
        proc.stdin.flush()
        _SPARES.refill()
        ctx.state["proc"] = proc
        # The worker resolves and logs the device; naming it here would import torch into the executor.
        ctx.step(f"started the agent on this machine (pid {proc.pid})")

    def alive(self, ctx: RunContext) -> bool:
        return ctx.state["proc"].poll() is None

    def stop(self, ctx: RunContext, grace_seconds: float) -> None:
        proc: subprocess.Popen[bytes] = ctx.state["proc"]
        if proc.poll() is None and grace_seconds > 0:
            ctx.store.signal_stop(ctx.run_id)
            deadline = time.monotonic() + grace_seconds + 2
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        _kill_run(proc.pid, str(ctx.paths.dir))
        self._reap(proc)

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def collect(self, ctx: RunContext) -> None:
        proc = ctx.state.get("proc")
        if proc is not None:
            _kill_run(proc.pid, str(ctx.paths.dir))  # anything the agent left behind
            self._reap(proc)
        work = ctx.paths.agent_workdir / ctx.run_id / "work"
        if work.is_dir():
            ctx.paths.artifacts.mkdir(exist_ok=True)
            for item in work.iterdir():
                if item.name != "predictions.jsonl":
                    item.rename(ctx.paths.artifacts / item.name)
        ctx.store.update(ctx.run_id, artifact_uri=str(ctx.paths.artifacts))
