"""The ray backend against a real Ray head (tests/ray_cluster.py): the run is one Ray job that runs our agent
where Ray puts it; Ray's own failure modes end the run truly, each on the real head.

The module's cases share one head (tests/ray_cluster.py; up in seconds), each with its own server, executor
and workdir. The head's GPU is a logical one (--num-gpus=1): nothing computes on it, which is all these
tests need of it (majority-baseline trains on the CPU).
"""

from __future__ import annotations

import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.lifecycle_helpers import TERMINAL, Services, run_paths, started
from tests.ray_cluster import RayCluster

BACKEND = "cluster"
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray() -> Iterator[RayCluster]:
    cluster = RayCluster()
    try:
        yield cluster
    finally:
        cluster.close()


@contextmanager
def ray_project(tmp_path: Path, redis_url: str, ray: RayCluster, **backend: Any) -> Iterator[Services]:
    settings = {"type": "ray", "address": ray.address, "python": sys.executable, "workdir": str(tmp_path / "node")}
    with started(tmp_path, redis_url, executors=1, backend=BACKEND, backends={BACKEND: {**settings, **backend}}) as svc:
        yield svc


def job_of(ray: RayCluster, run_id: str) -> dict[str, Any]:
    job = ray.job(f"potato-queue-{run_id}")
    assert job is not None, f"Ray has no job for run {run_id}"
    return job


def wait_job(ray: RayCluster, run_id: str, statuses: set[str], timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (job := job_of(ray, run_id))["status"] not in statuses:
        assert time.monotonic() < deadline, f"Ray job of {run_id} still {job['status']}: {job['message']}"
        time.sleep(0.2)
    return job


def redeem(svc: Services, run_id: str, code: str) -> int:
    request = urllib.request.Request(
        f"{svc.url}/api/training/agent/v1/runs/{run_id}/redeem",
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {code}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_run_is_one_ray_job_that_succeeds_and_shows_no_usable_secret(
    tmp_path: Path, redis_server_url: str, ray: RayCluster
) -> None:
    with ray_project(tmp_path, redis_server_url, ray) as svc:
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
        run = svc.wait_for(run_id, TERMINAL, timeout_s=120)
        assert run["state"] == "succeeded", svc.logs()
        assert run_paths(svc, run_id).predictions.exists()
        job = wait_job(ray, run_id, {"SUCCEEDED"})
        # Placed by its resources (Ray sets CUDA_VISIBLE_DEVICES only for a job that asked for a GPU).
        assert f"run {run_id} on {socket.gethostname()}: GPUs 0 (CUDA_VISIBLE_DEVICES)" in ray.logs(job)
        # What the dashboard shows: the entrypoint names no secret, and the environment's code is spent.
        code = job["runtime_env"]["env_vars"]["POTATO_QUEUE_RUN_CODE"]
        assert code not in job["entrypoint"]
        assert redeem(svc, run_id, code) == 401
        assert job["runtime_env"]["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"] == "35"  # grace 20 s + 15
        log = run_paths(svc, run_id).run_log.read_text()
        assert f"submitted Ray job potato-queue-{run_id} to 127.0.0.1:{ray.dashboard_port}" in log
