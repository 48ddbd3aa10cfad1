"""GPUs for the tests on a machine that has none: an `nvidia-smi` first on PATH, and an agent that sees them.

This machine has no GPU, so `nvidia-smi` here is a script that answers each of potato-queue's queries
from a file the test rewrites: the GPUs (gpus.csv: memory, how busy), their use (usage.csv: power draw,
utilization, memory used) and the processes holding GPU memory (apps/<pid>, holding its MB: listed while
that pid lives). Rewriting a file is the GPU changing. Everything else in the tests that use it is real:
Redis, the server, the executor, sshd, the agent and the worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.agent_helpers import AGENT, BACKEND
from tests.lifecycle_helpers import Services

__all__ = ["FakeGpus", "LocalAgent", "gpu_process"]

_SCRIPT = """#!/bin/sh
# potato-queue's tests: a stand-in for nvidia-smi (tests/fake_gpus.py)
echo "$@" >> '{folder}/calls.log'
case "$1" in
  --query-gpu=index,power.draw*) cat '{folder}/usage.csv' ;;
  --query-gpu=*) cat '{folder}/gpus.csv' ;;
  --query-compute-apps=*)
    for f in '{folder}'/apps/*; do
      [ -e "$f" ] || continue
      pid=$(basename "$f")
      [ -d "/proc/$pid" ] && echo "$pid, $(cat "$f")"
    done ;;
esac
"""


class FakeGpus:
    """A folder with an `nvidia-smi` that prints what `set()` and `set_usage()` last wrote."""

    def __init__(self, folder: Path, csv: str, usage: str = "") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        (folder / "apps").mkdir(exist_ok=True)
        self.set(csv)
        self.set_usage(usage)
        script = folder / "nvidia-smi"
        script.write_text(_SCRIPT.format(folder=folder))
        script.chmod(0o755)
        self.path = f"{folder}:/usr/local/bin:/usr/bin:/bin"

    def _write(self, name: str, text: str) -> None:
        partial = self.folder / f"{name}.partial"
        partial.write_text(text)
        partial.replace(self.folder / name)  # whole: nvidia-smi never prints half a file

    def set(self, csv: str) -> None:
        """The GPUs: `index, name, free MB, total MB, busy %, compute capability` a line."""
        self._write("gpus.csv", csv)

    def set_usage(self, csv: str) -> None:
        """Their use: `index, power W, busy %, MB used` a line."""
        self._write("usage.csv", csv)

    def holds(self, pid: int, used_mb: float) -> None:
        """Process `pid` holds `used_mb` of GPU memory (listed while it lives)."""
        self._write(f"apps/{pid}", f"{used_mb:g}\n")

    def usage_calls(self) -> int:
        """How many times the usage was asked for."""
        calls = self.folder / "calls.log"
        return sum(1 for line in calls.read_text().splitlines() if "power.draw" in line) if calls.exists() else 0


def gpu_process(run_id: str | None, cwd: Path) -> subprocess.Popen[bytes]:
    """A process that would hold GPU memory: started apart from any worker (its own session), its
    environment naming `run_id` the way everything a run's worker starts does (None: another account's)."""
    env = {"PATH": "/usr/bin:/bin"}
    if run_id is not None:
        env["POTATO_QUEUE_RUN_ID"] = run_id
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env=env, cwd=cwd, start_new_session=True
    )


class LocalAgent:
    """`potato-queue training agent` on this machine (not behind NAT), its GPUs the fake ones."""

    def __init__(
        self,
        svc: Services,
        token: str,
        gpus_path: str,
        *args: str,
        name: str = "agent",
        env: dict[str, str] | None = None,
    ) -> None:
        self.out = svc.tmp_path / f"{name}.out"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("POTATO_")}
        environ.update(POTATO_TRAINING_TOKEN=token, PATH=gpus_path, **(env or {}))
        command = AGENT + ["--server", svc.url, "--backend", BACKEND, "--workdir", str(svc.tmp_path / f"{name}-work")]
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen(
                command + list(args), stdout=out, stderr=subprocess.STDOUT, env=environ, cwd=svc.tmp_path
            )

    def output(self) -> str:
        return self.out.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
