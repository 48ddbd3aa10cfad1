"""The agent of an agent backend: asks the server for its backend's runs, and runs them, until stopped.

Standard library only, Python 3.8+ (it is also served as one file, agent.pyz).
It opens every connection itself, so it works from behind NAT or a one-way
firewall (AGT-2). The backend token (from `potato-queue training register`)
only claims runs; each claim answers a token for that run alone, and the run
goes through the same Runner as on every other backend.

With --min-free-gpu-mb, it claims only while a GPU of its machine (those
CUDA_VISIBLE_DEVICES lets it use) has that much memory free: meanwhile it asks
nvidia-smi every GPU_POLL_S and tells the server what it waits for (the
offered run's step line says so), and claims as soon as a GPU frees.
"""

import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional
from urllib.parse import quote

from potato_queue.agent.client import RunClient
from potato_queue.agent.launchers.base import WorkerLauncher
from potato_queue.agent.launchers.process import ProcessLauncher, worker_env
from potato_queue.agent.runner import Runner
from potato_queue.agent.transport import ApiError, TlsError, Transport, Unreachable, call_timeout_s
from potato_queue.host.check import nvidia_smi
from potato_queue.host.gpus import (
    GPU_POLL_S,
    GPU_REPORT_S,
    GpuWait,
    agent_gpu_problem,
    agent_pick,
    agent_wait,
)
from potato_queue.host.nvidia_smi import NVIDIA_SMI_QUERY, parse_gpus, visible_gpus

__all__ = ["BackendAgent", "describe_python", "CLAIM_WAIT_S", "EXIT_REFUSED"]

# How long one claim waits on the server for a run (the server's MAX_WAIT_S caps it).
# 90 s: fewer reconnects of idle agents (the shipped nginx lets agent calls last 120 s).
CLAIM_WAIT_S = 90.0
# With --min-free-gpu-mb: a claim waits this long at most, so that the GPU was looked at moments before a
# run arrives (another user may take the GPU while the claim waits).
GPU_CLAIM_WAIT_S = 10.0
# The agent's exit when the server refuses it (a wrong or replaced token, an unknown backend).
EXIT_REFUSED = 3
PACKAGES = ("torch", "transformers", "peft", "scikit-learn", "accelerate")
_DESCRIBE = (
    "import json, platform, sys\n"
    "try:\n    from importlib import metadata\nexcept ImportError:\n    metadata = None\n"
    "found = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n        found[name] = metadata.version(name) if metadata else None\n"
    "    except Exception:\n        pass\n"
    "print(json.dumps({'python': platform.python_version(), 'packages': found}))\n"
)


def describe_python(python: str) -> Dict[str, Any]:
    """The worker's interpreter: its version and the trainer packages it has (what `training check` shows)."""
    try:
        out = subprocess.run(
            [python, "-I", "-c", _DESCRIBE] + list(PACKAGES),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env=worker_env(),
        )
        return dict(json.loads(out.stdout), executable=python)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return {"executable": python, "error": str(exc)}


class BackendAgent:
    """Claim a run, run it, repeat (`once`: one run). stop() ends it cleanly, cancelling a run in flight."""

    def __init__(
        self,
        server: str,
        backend: str,
        token: str,
        workdir: str,
        python: str = sys.executable,
        keep: bool = False,
        once: bool = False,
        unreachable_s: float = 300.0,
        ca_file: Optional[str] = None,
        log: Callable[[str], None] = print,
        launcher_factory: Optional[Callable[[], WorkerLauncher]] = None,
        min_free_gpu_mb: float = 0.0,
    ) -> None:
        self.server, self.backend, self.workdir, self.python = server, backend, workdir, python
        self.min_free_gpu_mb = min_free_gpu_mb
        self.gpu_said_s = None  # type: Optional[float]  # when the server last heard of our wait for a GPU
        self.keep, self.once, self.unreachable_s, self.ca_file, self.log = keep, once, unreachable_s, ca_file, log
        self.transport = Transport(server, token, log=log, ca_file=ca_file)
        self.stopping = threading.Event()
        self.draining = threading.Event()  # finish the run in flight, claim no new one, exit 0
        self.drain_reason = ""
        self.in_claim = False  # waiting in a claim's long-poll: nothing claimed that a quick exit would lose
        self.runner = None  # type: Optional[Runner]
        # Each run's launcher: by default its worker is a process here, started ahead while we wait for work.
        self.new_launcher = launcher_factory or (lambda: ProcessLauncher(python, worker_env()))
        self.launcher = self.new_launcher()
        self.me = {"host": socket.gethostname(), "agent_python": platform.python_version(), "pid": os.getpid()}
        # How a failed claim is logged (the first failure and every 10th): what was tried, and the fix.
        self._asking = (
            "asking {} for work (if this goes on: is the server running, and is --server the "
            "address this machine reaches it at?)".format(server)
        )

    def stop(self, reason: str) -> None:
        """Stop after the run in flight, which is cancelled (SIGTERM, grace) and reported."""
        self.stopping.set()
        runner = self.runner
        if runner is not None:
            runner.request_stop(reason)

    def drain(self, reason: str) -> None:
        """Finish the run in flight and claim no new one, then leave serve() with 0 (SIGUSR1, `--drain`, the
        server's switch). Only sets a flag (it runs in a signal handler): the thread serve() started says it."""
        if not self.draining.is_set():
            self.drain_reason = reason
            self.draining.set()

    def _say_draining(self) -> None:
        """Once draining: our log, and the server (`training check` shows a draining agent), with a claim that
        claims nothing."""
        self.draining.wait()
        what = "its run finishes, then it exits" if self.runner is not None else "no run in flight: it exits"
        self.log("draining ({}): the agent claims no new run; {}".format(self.drain_reason, what))
        self.me["draining"] = True
        path = "backends/{}/claim".format(quote(self.backend, safe=""))
        try:
            self.transport.call("POST", path, self.me, query="?wait_s=0", timeout_s=15, give_up_s=15, what="drain")
        except (Unreachable, ApiError):
            pass  # the drain holds all the same: only the server's word of it is lost

    def serve(self) -> int:
        """Until stopped: 0 (with `once`, after one run: its exit code), or EXIT_REFUSED when the server
        refuses us."""
        self.me.update(describe_python(self.python))
        saying = threading.Thread(target=self._say_draining, name="drain", daemon=True)
        saying.start()
        self.log(
            "agent for backend {} on {}: server {}, workdir {}, worker Python {} ({})".format(
                self.backend, self.me["host"], self.server, self.workdir, self.me.get("python", "?"), self.python
            )
        )
        try:
            while not self.stopping.is_set() and not self.draining.is_set():
                wait = self._gpu_wait()
                if wait is not None:
                    self._say_waiting(wait)
                    self.stopping.wait(GPU_POLL_S)
                    continue
                if self.gpu_said_s is not None:
                    self.gpu_said_s = None
                    self.log("a GPU has {:g} MB free: asking for work".format(self.min_free_gpu_mb))
                claim = self._claim()
                if claim is None:
                    continue
                if claim.get("drain"):
                    self.drain("the server's drain switch for backend {}".format(self.backend))
                    break
                code = self._run(claim)
                if self.once:
                    return code
            if self.draining.is_set():
                saying.join(20.0)  # the log line and the server's word of it, before the exit
                self.log("drained: no run in flight, none claimed; the agent exits")
        except ApiError as exc:
            self.log(self._refusal(exc))
            return EXIT_REFUSED
        except TlsError as exc:
            self.log(str(exc))
            return EXIT_REFUSED
        finally:
            self.launcher.close()
        return 0

    def _gpus(self) -> Any:
        return visible_gpus(parse_gpus(nvidia_smi(NVIDIA_SMI_QUERY)), os.environ.get("CUDA_VISIBLE_DEVICES"))

    def gpu_problem(self) -> Optional[str]:
        """Why this agent cannot start with its --min-free-gpu-mb (a wait that could never end), or None."""
        if self.min_free_gpu_mb <= 0:
            return None
        return agent_gpu_problem(shutil.which("nvidia-smi") is not None, self._gpus(), self.min_free_gpu_mb)

    def _gpu_wait(self) -> Optional[GpuWait]:
        """What this agent waits for before it may claim (no GPU with min_free_gpu_mb free), or None."""
        return None if self.min_free_gpu_mb <= 0 else agent_wait(self._gpus(), self.min_free_gpu_mb)

    def _say_waiting(self, wait: GpuWait) -> None:
        """Tell the server (the offered run's step line) and our log, again every GPU_REPORT_S: the server
        takes a report older than a few of those for an agent that went away."""
        now_s = time.monotonic()
        if self.gpu_said_s is not None and now_s - self.gpu_said_s < GPU_REPORT_S:
            return
        if self.gpu_said_s is None:
            self.log("no GPU has {:g} MB free: waiting before asking for work".format(self.min_free_gpu_mb))
        self.gpu_said_s = now_s
        path = "backends/{}/waiting".format(quote(self.backend, safe=""))
        try:
            self.transport.call(
                "POST",
                path,
                dict(self.me, gpu_wait=wait.to_json()),
                timeout_s=30,
                give_up_s=GPU_REPORT_S,
                what=self._asking,
            )
        except Unreachable:
            pass  # said again at the next report

    def _claim(self) -> Optional[Dict[str, Any]]:
        """One long-poll for work: the claim ({run_id, token}), or None when none came."""
        if isinstance(self.launcher, ProcessLauncher) and self.launcher.prestarted is None:
            self.launcher.prestart()  # the next run's worker starts while we wait (cancel and start are faster)
        path = "backends/{}/claim".format(quote(self.backend, safe=""))
        wait_s = GPU_CLAIM_WAIT_S if self.min_free_gpu_mb > 0 else CLAIM_WAIT_S
        self.in_claim = True
        try:
            reply = self.transport.call(
                "POST",
                path,
                self.me,
                query="?wait_s={:g}".format(wait_s),
                timeout_s=wait_s + 15,
                give_up_s=math.inf,
                what=self._asking,
            )
        except Unreachable:
            return None  # only when stopping: the policy retries for ever otherwise
        finally:
            self.in_claim = False
        return reply if reply.get("run_id") or reply.get("drain") else None

    def _run(self, claim: Dict[str, Any]) -> int:
        run_id, token = str(claim["run_id"]), str(claim["token"])
        self.log("claimed run {}".format(run_id))
        transport = Transport(
            self.server, token, call_timeout_s(self.unreachable_s), log=self.log, ca_file=self.ca_file
        )
        client = RunClient(transport, run_id)
        launcher, self.launcher = self.launcher, self.new_launcher()
        gpu = agent_pick(self._gpus(), self.min_free_gpu_mb)  # the GPU with room that let us claim
        self.runner = Runner(
            client, self.workdir, launcher, keep=self.keep, unreachable_s=self.unreachable_s, log=self.log, gpu=gpu
        )
        if self.stopping.is_set():
            self.runner.request_stop("the agent is stopping")
        try:
            return self.runner.run()
        finally:
            self.runner = None

    def _refusal(self, exc: ApiError) -> str:
        """What the server's refusal means for whoever started this agent, with the fix."""
        register = "potato-queue training register {} CONFIG".format(self.backend)
        if exc.status == 401:
            return (
                "the server refused this agent's token for backend {} (HTTP 401: it is wrong, or it was "
                "replaced by a newer register); fix: run `{}` on the server and give this agent the new token "
                "(POTATO_TRAINING_TOKEN or --token-file)".format(self.backend, register)
            )
        if exc.status == 403:
            return "{}; fix: start the agent with the --backend its token was issued for".format(exc.detail)
        if exc.status == 404:
            return "{}; fix: start the agent with --backend set to one of them".format(exc.detail)
        return "the server refused the claim: {}".format(exc)
