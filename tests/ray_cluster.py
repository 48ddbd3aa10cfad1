"""A real Ray cluster (ray 2.60: a head, and a worker node when asked) for the ray backend's tests.

Ray runs from its own venv, .venv-ray (`make venv` builds it: Ray pins many packages of its own). Each
cluster has its own ports (every one Ray opens is named, so that two xdist workers' clusters never meet,
worker ports included), its own short temp folder (Ray's socket paths have a length limit) and
RAY_USAGE_STATS_ENABLED=0. Each node runs `ray start --block` in a session of its own; close() ends that
session's processes by their process group, never with `ray stop` (which ends every Ray on the machine).
`--num-gpus=1` is a logical GPU: a job that asks for it is placed, and sees CUDA_VISIBLE_DEVICES=0 on a machine
where torch finds none (the trainers fall back to the CPU).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.sshd import free_port

ROOT = Path(__file__).resolve().parents[1]
RAY = ROOT / ".venv-ray" / "bin" / "ray"
START_S = 90.0
WORKER_PORTS = 200


def require_ray() -> None:
    """Fails (never skips) where the suite cannot run Ray: these tests are part of the suite."""
    if not RAY.exists():
        pytest.fail(f"the ray backend's tests need Ray in {RAY.parent.parent}: make venv builds it")


def _ports(count: int) -> list[int]:
    return [free_port() for _ in range(count)]


def _worker_ports() -> int:
    """The first of WORKER_PORTS free ports in a row, below the kernel's ephemeral range (where free_port's
    come from), so that another cluster's node or a test's server does not take one meanwhile."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    while True:
        first = rng.randrange(20000, 30000 - WORKER_PORTS)
        if all(_bindable(port) for port in (first, first + WORKER_PORTS // 2, first + WORKER_PORTS - 1)):
            return first


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class RayNode:
    """One `ray start --block`, in a session of its own."""

    def __init__(self, args: list[str], temp: Path, log: Path, env: dict[str, str]) -> None:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1", **env}
        env.pop("VIRTUAL_ENV", None)
        worker = _worker_ports()
        ports = _ports(6)
        command = [str(RAY), "start", "--block", "--disable-usage-stats", f"--temp-dir={temp}"]
        command += [
            f"--min-worker-port={worker}",
            f"--max-worker-port={worker + WORKER_PORTS - 1}",
            f"--node-manager-port={ports[0]}",
            f"--object-manager-port={ports[1]}",
            f"--dashboard-agent-grpc-port={ports[2]}",
            f"--dashboard-agent-listen-port={ports[3]}",
            f"--metrics-export-port={ports[4]}",
            f"--runtime-env-agent-port={ports[5]}",
        ]
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                command + args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def kill(self) -> None:
        """Every process of the node (its session), at once: a node lost, or the end of the test."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


class RayCluster:
    """A head (with the dashboard's Jobs API on 127.0.0.1) and the worker nodes added to it."""

    def __init__(
        self, num_gpus: int = 1, num_cpus: int = 2, auth_token: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        """`auth_token`: a cluster with token auth (RAY_AUTH_MODE=token) and this token; `env`: Ray's settings."""
        require_ray()
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": auth_token} if auth_token else {}
        self.env.update(env or {})
        self.headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self.root = Path(tempfile.mkdtemp(prefix="pqray-", dir="/tmp"))
        self.gcs_port, self.dashboard_port, self.client_port = _ports(3)
        self.num_gpus, self.num_cpus = num_gpus, num_cpus
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.nodes: list[RayNode] = []
        self.head = self._start_head()

    def _start_head(self) -> RayNode:
        args = [
            "--head",
            f"--port={self.gcs_port}",
            f"--ray-client-server-port={self.client_port}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--num-gpus={self.num_gpus}",
            f"--num-cpus={self.num_cpus}",
        ]
        head = RayNode(args, self.root / "h", self.root / "head.log", self.env)
        self.head = head
        self._wait_for(lambda: self.version() is not None, "the head's Jobs API", head)
        self._wait_for(lambda: self.alive_nodes() >= 1, "the head node in the state API", head)
        return head

    def alive_nodes(self) -> int:
        return len(self.alive_ids())

    def alive_ids(self) -> set[str]:
        """The node ids the state API lists ALIVE."""
        try:
            with self._open("/api/v0/nodes", timeout_s=5) as reply:
                rows = json.loads(reply.read())["data"]["result"]["result"]
        except (OSError, KeyError, ValueError):
            return set()
        return {str(row.get("node_id")) for row in rows if row.get("state") == "ALIVE"}

    def _open(self, path: str, data: bytes | None = None, timeout_s: float = 10) -> Any:
        headers = {**self.headers, "Content-Type": "application/json"}
        request = urllib.request.Request(self.address + path, data, headers, method="POST" if data else "GET")
        return urllib.request.urlopen(request, timeout=timeout_s)

    def version(self) -> dict | None:
        try:
            with self._open("/api/version", timeout_s=2) as reply:
                return json.loads(reply.read())
        except OSError:
            return None

    def _wait_for(self, ready, what: str, node: RayNode) -> None:
        deadline = time.monotonic() + START_S
        while not ready():
            if node.proc.poll() is not None or time.monotonic() > deadline:
                tail = node.log.read_text(errors="replace")[-3000:]
                self.close()
                raise RuntimeError(f"Ray did not start ({what}): {tail}")
            time.sleep(0.2)

    def job(self, job_id: str) -> dict | None:
        try:
            with self._open(f"/api/jobs/{job_id}") as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def submit(self, entrypoint: str, num_gpus: float = 0) -> str:
        """A job of someone else's on the cluster (a blocker holding the GPU)."""
        body = {"entrypoint": entrypoint, "entrypoint_num_gpus": num_gpus, "entrypoint_num_cpus": 0}
        with self._open("/api/jobs/", json.dumps(body).encode()) as reply:
            return str(json.loads(reply.read())["submission_id"])

    def stop(self, job_id: str) -> None:
        with self._open(f"/api/jobs/{job_id}/stop", b"{}") as reply:
            reply.read()

    def logs(self, job: dict) -> str:
        with self._open(f"/api/jobs/{job['submission_id']}/logs") as reply:
            return str(json.loads(reply.read())["logs"])

    def jobs(self) -> list[dict]:
        with self._open("/api/jobs/") as reply:
            return list(json.loads(reply.read()))

    def add_node(self, num_gpus: int = 1, num_cpus: int = 1) -> RayNode:
        """A worker node joined to the head (the node a job asking for a GPU goes to, when the head has none)."""
        name = f"node{len(self.nodes) + 1}"
        args = [f"--address=127.0.0.1:{self.gcs_port}", f"--num-gpus={num_gpus}", f"--num-cpus={num_cpus}"]
        node = RayNode(args, self.root / name, self.root / f"{name}.log", self.env)
        self.nodes.append(node)
        known = self.alive_ids()  # a node killed a moment ago may still be listed: a new id is the new node
        self._wait_for(lambda: bool(self.alive_ids() - known), f"worker node {name}", node)
        return node

    def restart_head(self) -> None:
        """The head killed and started again on the same ports: Ray keeps no job record across it."""
        self.head.kill()
        self.head = self._start_head()

    def close(self) -> None:
        for node in [*self.nodes, self.head] if hasattr(self, "head") else self.nodes:
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)
