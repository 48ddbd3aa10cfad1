"""An agent backend's pieces for the tests: its config, `training register`, an agent in a namespace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.lifecycle_helpers import Services
from tests.netns import NatHost, netns_missing

__all__ = ["BACKEND", "PYTHON38", "AGENT", "nat_host", "lab", "register", "Agent"]

BACKEND = "lab"
PYTHON38 = Path.home() / ".pyenv" / "versions" / "3.8.18" / "bin" / "python3.8"
AGENT = [sys.executable, "-m", "potato_queue.cli", "training", "agent"]


@contextmanager
def nat_host() -> Iterator[NatHost]:
    """A machine behind NAT; the test fails (never skips) where namespaces cannot be made."""
    missing = netns_missing()
    if missing:
        pytest.fail(f"the agent-backend tests need a network namespace: {missing}")
    with NatHost() as host:
        yield host


def lab(**extra: Any) -> dict[str, Any]:
    return {"backends": {BACKEND: {"type": "agent", **extra}}}


def register(svc: Services, backend: str = BACKEND) -> str:
    """`potato-queue training register`, as the admin runs it; the token it printed."""
    out = subprocess.run(
        [sys.executable, "-m", "potato_queue.cli", "training", "register", backend, str(svc.config)],
        env=svc.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "shown once" in out.stdout and f"--server {svc.url} --backend {backend}" in out.stdout
    return out.stdout.splitlines()[2].strip()


class Agent:
    """One agent process inside the namespace, its output in a file."""

    def __init__(
        self, nat: NatHost, svc: Services, token: str, *args: str, argv: list[str] | None = None, name: str = "agent"
    ) -> None:
        self.out = svc.tmp_path / f"{name}.out"
        self.workdir = svc.tmp_path / f"{name}-work"
        env = {k: v for k, v in os.environ.items() if not k.startswith("POTATO_")}
        env["POTATO_TRAINING_TOKEN"] = token
        command = (argv or AGENT) + ["--server", svc.url, "--backend", BACKEND, "--workdir", str(self.workdir), *args]
        with open(self.out, "w") as out:
            self.proc = nat.popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=svc.tmp_path, start_new_session=True
            )

    def output(self) -> str:
        return self.out.read_text()

    def wait(self, timeout_s: float = 60) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
