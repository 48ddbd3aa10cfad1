"""The agent of an agent backend: asks the server for its backend's runs, and runs them, until stopped.

Standard library only, Python 3.8+ (it is also served as one file, agent.pyz).
It opens every connection itself, so it works from behind NAT or a one-way
firewall (AGT-2). The backend token (from `potato-queue training register`)
only claims runs; each claim answers a token for that run alone, and the run
goes through the same Runner as on every other backend.
"""

import json
import math
import os
import platform
import socket
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, Optional
from urllib.parse import quote

from potato_queue.agent.client import RunClient
from potato_queue.agent.launchers.base import WorkerLauncher
from potato_queue.agent.launchers.process import ProcessLauncher, worker_env
from potato_queue.agent.runner import Runner
from potato_queue.agent.transport import ApiError, TlsError, Transport, Unreachable

__all__ = ["BackendAgent", "describe_python", "CLAIM_WAIT_S", "EXIT_REFUSED"]

# How long one claim waits on the server for a run (the server's MAX_WAIT_S caps it).
# 90 s: fewer reconnects of idle agents (the shipped nginx lets agent calls last 120 s).
CLAIM_WAIT_S = 90.0
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
        out = subprocess.run([python, "-I", "-c", _DESCRIBE] + list(PACKAGES), capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL, env=worker_env())
        return dict(json.loads(out.stdout), executable=python)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return {"executable": python, "error": str(exc)}


class BackendAgent:
    """Claim a run, run it, repeat (`once`: one run). stop() ends it cleanly, cancelling a run in flight."""

    def __init__(self, server: str, backend: str, token: str, workdir: str, python: str = sys.executable,
                 keep: bool = False, once: bool = False, unreachable_s: float = 300.0,
                 ca_file: Optional[str] = None, log: Callable[[str], None] = print,
                 launcher_factory: Optional[Callable[[], WorkerLauncher]] = None) -> None:
        self.server, self.backend, self.workdir, self.python = server, backend, workdir, python
        self.keep, self.once, self.unreachable_s, self.ca_file, self.log = keep, once, unreachable_s, ca_file, log
        self.transport = Transport(server, token, log=log, ca_file=ca_file)
        self.stopping = threading.Event()
        self.runner = None  # type: Optional[Runner]
        # Each run's launcher: by default its worker is a process here, started ahead while we wait for work.
        self.new_launcher = launcher_factory or (lambda: ProcessLauncher(python, worker_env()))
        self.launcher = self.new_launcher()
        self.me = {"host": socket.gethostname(), "agent_python": platform.python_version(), "pid": os.getpid()}
        # How a failed claim is logged (the first failure and every 10th): what was tried, and the fix.
        self._asking = ("asking {} for work (if this goes on: is the server running, and is --server the "
                        "address this machine reaches it at?)".format(server))

    def stop(self, reason: str) -> None:
        """Stop after the run in flight, which is cancelled (SIGTERM, grace) and reported."""
        self.stopping.set()
        runner = self.runner
        if runner is not None:
            runner.request_stop(reason)

    def serve(self) -> int:
        """Until stopped: 0 (with `once`, after one run: its exit code), or EXIT_REFUSED when the server
        refuses us."""
        self.me.update(describe_python(self.python))
        self.log("agent for backend {} on {}: server {}, workdir {}, worker Python {} ({})".format(
            self.backend, self.me["host"], self.server, self.workdir, self.me.get("python", "?"), self.python))
        try:
            while not self.stopping.is_set():
                claim = self._claim()
                if claim is None:
                    continue
                code = self._run(claim)
                if self.once:
                    return code
        except ApiError as exc:
            self.log(self._refusal(exc))
            return EXIT_REFUSED
        except TlsError as exc:
            self.log(str(exc))
            return EXIT_REFUSED
        finally:
            self.launcher.close()
        return 0

    def _claim(self) -> Optional[Dict[str, Any]]:
        """One long-poll for work: the claim ({run_id, token}), or None when none came."""
        if isinstance(self.launcher, ProcessLauncher) and self.launcher.prestarted is None:
            self.launcher.prestart()  # the next run's worker starts while we wait (cancel and start are faster)
        path = "backends/{}/claim".format(quote(self.backend, safe=""))
        try:
            reply = self.transport.call("POST", path, self.me, query="?wait_s={:g}".format(CLAIM_WAIT_S),
                                        timeout_s=CLAIM_WAIT_S + 15, give_up_s=math.inf, what=self._asking)
        except Unreachable:
            return None  # only when stopping: the policy retries for ever otherwise
        return reply if reply.get("run_id") else None

    def _run(self, claim: Dict[str, Any]) -> int:
        run_id, token = str(claim["run_id"]), str(claim["token"])
        self.log("claimed run {}".format(run_id))
        client = RunClient(Transport(self.server, token, log=self.log, ca_file=self.ca_file), run_id)
        launcher, self.launcher = self.launcher, self.new_launcher()
        self.runner = Runner(client, self.workdir, launcher, keep=self.keep, unreachable_s=self.unreachable_s,
                             log=self.log)
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
            return ("the server refused this agent's token for backend {} (HTTP 401: it is wrong, or it was "
                    "replaced by a newer register); fix: run `{}` on the server and give this agent the new token "
                    "(POTATO_TRAINING_TOKEN or --token-file)".format(self.backend, register))
        if exc.status == 403:
            return "{}; fix: start the agent with the --backend its token was issued for".format(exc.detail)
        if exc.status == 404:
            return "{}; fix: start the agent with --backend set to one of them".format(exc.detail)
        return "the server refused the claim: {}".format(exc)
