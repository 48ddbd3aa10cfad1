"""The slurm backend, for real: a real single-node SLURM (tests/slurm_cluster.py: munged, slurmctld, slurmd)
behind a real sshd on 127.0.0.1 (tests/sshd.py), which stands for the login node. Redis, the server, the
executor, the agent on the "login node", sbatch, squeue, scontrol, scancel and the worker in its job are
all real. The GPUs are not: the node's two gres GPUs are files linked to /dev/null, so a job gets
CUDA_VISIBLE_DEVICES from SLURM but trains on the CPU. remote_dir is a folder outside /tmp (the
validator refuses node-local folders), made and removed by the fixture.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.lifecycle_helpers import TERMINAL, Services, alive_cmd, pids, run_path, started
from tests.slurm_cluster import CPUS, NODE, SlurmCluster
from tests.sshd import ALIAS, Sshd

BACKEND = "cluster"
MAJORITY = {"trainer": "majority-baseline", "schemas": ["sentiment"], "backend": BACKEND}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def shared(slurm: SlurmCluster) -> Iterator[Path]:
    """remote_dir: storage the "compute node" shares, outside /tmp; the node is idle again after the test."""
    folder = Path(tempfile.mkdtemp(prefix="pq-slurm-shared-", dir="/srv"))
    try:
        yield folder
    finally:
        slurm.run("scancel", "--user=root", check=False)
        slurm.wait_empty()
        if slurm.node_state().rstrip("*~#") != "idle":
            slurm.resume_node()
        shutil.rmtree(folder, ignore_errors=True)


def cluster_backend(slurm: SlurmCluster, shared: Path, **extra: Any) -> dict[str, Any]:
    backend = {"type": "slurm", "host": ALIAS, "python": "/usr/bin/python3", "job_python": sys.executable,
               "remote_dir": str(shared), "poll_interval_s": 1, "heartbeat_timeout_s": 60,
               "env": {**slurm.env, **extra.pop("env", {})}, **extra}
    return {"backends": {BACKEND: backend}}


@pytest.fixture
def svc_factory(tmp_path: Path, redis_server_url: str, sshd: Sshd, slurm: SlurmCluster, shared: Path) -> Iterator[Any]:
    contexts: list[Any] = []

    def make(training: dict[str, Any] | None = None, **backend: Any) -> Services:
        sshd.write_config("root")
        context = started(tmp_path, redis_server_url, executors=0, **cluster_backend(slurm, shared, **backend),
                          **(training or {}))
        svc = context.__enter__()
        contexts.append(context)
        svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
        return svc

    yield make
    for context in contexts:
        context.__exit__(None, None, None)


def run_log(svc: Services, run_id: str) -> str:
    return (run_path(svc, run_id) / "run.log").read_text()


def job_id_of(svc: Services, run_id: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(r"Submitted SLURM job (\d+)", run_log(svc, run_id))
        if found:
            return found.group(1)
        time.sleep(0.1)
    raise AssertionError(f"no job submitted: {run_log(svc, run_id)} {svc.logs()}")


def wait_log(svc: Services, run_id: str, text: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = run_log(svc, run_id)
        if text in log:
            return log
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in run.log after {timeout_s} s: {run_log(svc, run_id)}")


def long_hf_run(svc: Services, tiny_model: Path) -> str:
    return svc.start_run(trainer="hf-text-classification", schemas=["sentiment"], backend=BACKEND,
                         params={"model_name": str(tiny_model), "epochs": 500, "batch_size": 4})


def test_a_run_through_sbatch_succeeds_with_its_gres_gpu(svc_factory: Any, slurm: SlurmCluster, shared: Path) -> None:
    # The prelude runs in the job, before the worker: it shows the GPU SLURM handed the job.
    svc = svc_factory(gres="gpu:1", time="00:10:00", prelude=['echo "job sees CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" >&2'])
    run_id = svc.start_run(**MAJORITY)
    run = svc.wait_for(run_id, TERMINAL, 120)
    assert run["state"] == "succeeded", (run, run_log(svc, run_id), svc.logs())
    log = run_log(svc, run_id)
    job = job_id_of(svc, run_id)
    assert f"Submitted SLURM job {job}: --gres=gpu:1 --time=00:10:00 --no-requeue" in log
    assert f"SLURM job {job}: RUNNING on {NODE}" in log
    assert "job sees CUDA_VISIBLE_DEVICES=0" in log, log
    assert run["metrics"], run
    assert (run_path(svc, run_id) / "predictions.jsonl").stat().st_size > 0
    assert list((shared / "jobs").iterdir()) == [], "the job folder is removed after the copy back"
    assert slurm.queue() == []
