"""The ray backend against a real Ray head (tests/ray_cluster.py): the run is one Ray job that runs our agent
where Ray puts it; Ray's own failure modes end the run truly, each on the real head.

The module's cases share one head (tests/ray_cluster.py; up in seconds), each with its own server, executor
and workdir. The head's GPU is a logical one (--num-gpus=1): nothing computes on it, which is all these
tests need of it (majority-baseline trains on the CPU).
"""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.lifecycle_helpers import TERMINAL, Services, run_paths, started, wait_until
from tests.ray_cluster import ROOT, RayCluster

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
def ray_project(
    tmp_path: Path,
    redis_url: str,
    ray: RayCluster,
    executors: int = 1,
    executor_env: dict[str, str] | None = None,
    training: dict[str, Any] | None = None,
    **backend: Any,
) -> Iterator[Services]:
    settings = {"type": "ray", "address": ray.address, "python": sys.executable, "workdir": str(tmp_path / "node")}
    with started(
        tmp_path,
        redis_url,
        executors=executors,
        executor_env=executor_env,
        backend=BACKEND,
        backends={BACKEND: {**settings, **backend}},
        **(training or {}),
    ) as svc:
        yield svc


def job_of(ray: RayCluster, run_id: str) -> dict[str, Any]:
    job = ray.job(f"potato-queue-{run_id}")
    assert job is not None, f"Ray has no job for run {run_id}"
    return job


def wait_job(ray: RayCluster, run_id: str, statuses: set[str], timeout_s: float = 60) -> dict[str, Any]:
    """The run's Ray job once its status is one of `statuses` (it is submitted once its bundle is built)."""
    deadline = time.monotonic() + timeout_s
    while (job := ray.job(f"potato-queue-{run_id}")) is None or job["status"] not in statuses:
        assert time.monotonic() < deadline, f"Ray job of {run_id}: {job}"
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
        paths = run_paths(svc, run_id)
        assert paths.predictions.exists()
        # The model files came back over HTTP (nothing else reaches a node), and left the node.
        assert run["artifact_uri"] == str(paths.artifacts)
        assert json.loads((paths.artifacts / "majority.json").read_text())["sentiment"]
        assert oct((paths.artifacts / "majority.json").stat().st_mode & 0o777) == "0o600"
        assert not paths.model_upload.exists()
        assert not (tmp_path / "node" / run_id / "work" / "majority.json").exists()
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
        # Should Ray start the job again (it never does for one that ended): the spent code stops it at once.
        again = entry(svc, run_id, code, tmp_path / "again")
        assert again.returncode == 0, again.stderr
        assert f"run {run_id} has ended, or its code was spent: this job has nothing to do" in again.stderr
        assert not (tmp_path / "again").exists()


def test_model_files_over_max_artifact_mb_stay_on_the_node_and_the_run_says_where(
    tmp_path: Path, redis_server_url: str, ray: RayCluster
) -> None:
    with ray_project(tmp_path, redis_server_url, ray, max_artifact_mb=0.00001) as svc:
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
        run = svc.wait_for(run_id, TERMINAL, timeout_s=120)
        assert run["state"] == "succeeded", svc.logs()
        node_work = tmp_path / "node" / run_id / "work"
        assert run["artifact_uri"] == f"{socket.gethostname()}:{node_work}"
        assert (node_work / "majority.json").is_file()
        log = run_paths(svc, run_id).run_log.read_text()
        assert f"'majority.json' (0 MB) is over max_artifact_mb: it stays on {run['artifact_uri']}" in log
        assert list(run_paths(svc, run_id).artifacts.iterdir()) == []


def entry(svc: Services, run_id: str, code: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """host/ray_entry.py as a Ray job's entrypoint runs it, with the run's code in its environment."""
    source = (ROOT / "potato_queue" / "host" / "ray_entry.py").read_text()
    env = {"PATH": os.environ["PATH"], "POTATO_QUEUE_RUN_CODE": code}
    argv = [sys.executable, "-I", "-c", source, svc.url, run_id, "0" * 64, str(workdir)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def ours(workdir: Path) -> list[str]:
    """The processes of a run on the node: the agent and worker started from the workdir's code."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and str(workdir) in cmdline:
            found.append(cmdline)
    return found


def wait_gone(workdir: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := ours(workdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"left running on the node: {left}"


def held_run_running(svc: Services, ray: RayCluster) -> str:
    """A run that holds until it is stopped, once its Ray job and the run both say it runs."""
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], params={"hold_s": 120})
    svc.wait_for(run_id, {"running"}, timeout_s=60)
    wait_job(ray, run_id, {"RUNNING"})
    return run_id


def test_cancel_of_a_running_run_stops_its_job_and_every_process(
    tmp_path: Path, redis_server_url: str, ray: RayCluster
) -> None:
    with ray_project(tmp_path, redis_server_url, ray) as svc:
        run_id = held_run_running(svc, ray)
        status, _ = svc.api("POST", f"/runs/{run_id}/cancel")
        assert status == 200
        run = svc.wait_for(run_id, TERMINAL, timeout_s=60)
        assert run["state"] == "cancelled", svc.logs()
        job = wait_job(ray, run_id, {"STOPPED", "SUCCEEDED", "FAILED"})
        assert job["status"] != "RUNNING"
        wait_gone(tmp_path / "node")
        assert "not through potato-queue" not in run_paths(svc, run_id).run_log.read_text()


def taken_out_of_the_queue(svc: Services, ray: RayCluster, run_id: str) -> dict[str, Any]:
    """The run's Ray job once its removal (executors/ray.py) has ended it: FAILED, its supervisor killed while it
    waited, and run.log saying so."""
    job = wait_job(ray, run_id, {"STOPPED", "SUCCEEDED", "FAILED"}, timeout_s=60)
    assert job["status"] == "FAILED" and job["error_type"] == "JOB_SUPERVISOR_ACTOR_DIED", job
    log = run_paths(svc, run_id).run_log
    wait_until(lambda: "out of 127.0.0.1" in log.read_text(), timeout_s=30, what="run.log's removal line")
    assert f"Ray job potato-queue-{run_id} was taken out of 127.0.0.1:{ray.dashboard_port}'s queue" in log.read_text()
    return job


def test_max_wall_seconds_stops_a_ray_run_and_its_job(tmp_path: Path, redis_server_url: str, ray: RayCluster) -> None:
    """The wall clock counts from the job's start (its wait in Ray's queue is not run time)."""
    training = {"max_wall_seconds": 4, "grace_seconds": 2}
    with ray_project(tmp_path, redis_server_url, ray, training=training) as svc:
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], params={"hold_s": 120})
        run = svc.wait_for(run_id, TERMINAL, timeout_s=60)
        assert run["state"] == "failed"
        assert run["error"].startswith("The run did not finish within max_wall_seconds (4 s) and was stopped"), run
        assert wait_job(ray, run_id, {"STOPPED", "SUCCEEDED", "FAILED"})["status"] != "RUNNING"
        wait_gone(tmp_path / "node")


def test_a_job_stopped_on_the_cluster_ends_the_run_and_run_log_says_who_stopped_it(
    tmp_path: Path, redis_server_url: str, ray: RayCluster
) -> None:
    """Someone stops the job on Ray's dashboard: the agent takes Ray's SIGTERM as a cancel, stops the worker
    within its grace and reports; nothing is left on the node."""
    with ray_project(tmp_path, redis_server_url, ray) as svc:
        run_id = held_run_running(svc, ray)
        # Once the worker trains (a SIGTERM before its handler is set ends it with 143, the run failed).
        log = run_paths(svc, run_id).run_log
        wait_until(lambda: "step: fitting" in log.read_text(), timeout_s=30, what="the worker's fit")
        ray.stop(f"potato-queue-{run_id}")
        run = svc.wait_for(run_id, TERMINAL, timeout_s=60)
        assert run["state"] == "cancelled", (run["error"], log.read_text())
        assert "agent finished: exit code 4" in log.read_text() and "the agent got SIGTERM" in log.read_text()
        said = f"Ray job potato-queue-{run_id} was stopped on 127.0.0.1:{ray.dashboard_port}, not through potato-queue"
        wait_until(lambda: said in log.read_text(), timeout_s=10, what="run.log's line on who stopped the job")
        assert wait_job(ray, run_id, {"STOPPED", "SUCCEEDED", "FAILED"})["status"] == "STOPPED"
        wait_gone(tmp_path / "node")


def test_a_job_ray_cannot_place_fails_the_run_after_pending_timeout_s_and_leaves_the_queue(
    tmp_path: Path, redis_server_url: str, ray: RayCluster
) -> None:
    with ray_project(tmp_path, redis_server_url, ray, num_gpus=2, pending_timeout_s=3) as svc:
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
        run = svc.wait_for(run_id, TERMINAL, timeout_s=60)
        assert run["state"] == "failed"
        job_id = f"potato-queue-{run_id}"
        assert (
            f"Ray job {job_id} was still PENDING on 127.0.0.1:{ray.dashboard_port} after pending_timeout_s (3 s)"
            in (run["error"])
        )
        assert "it asked for num_gpus=2, num_cpus=1" in run["error"] and "fix: free or add a node" in run["error"]
        # Ray's own stop would have left it PENDING (ray issue 58353), to start when a node with 2 GPUs joins.
        taken_out_of_the_queue(svc, ray, run_id)
        assert not any(job["status"] == "PENDING" for job in ray.jobs())


def test_cancel_of_a_run_whose_job_waits_takes_the_job_out_of_rays_queue(
    tmp_path: Path, redis_server_url: str, ray: RayCluster
) -> None:
    """The job waits behind someone else's that holds the GPU; once that one ends, ours must not start."""
    blocker = ray.submit("sleep 120", num_gpus=1)
    with ray_project(tmp_path, redis_server_url, ray) as svc:
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
        wait_job(ray, run_id, {"PENDING"})
        status, _ = svc.api("POST", f"/runs/{run_id}/cancel")
        assert status == 200
        run = svc.wait_for(run_id, TERMINAL, timeout_s=30)
        assert run["state"] == "cancelled", svc.logs()
        assert "it never started" in run["error"]
        job = taken_out_of_the_queue(svc, ray, run_id)
        ray.stop(blocker)  # the GPU frees
        wait_until(lambda: ray.job(blocker)["status"] == "STOPPED", timeout_s=30, what="the blocker's end")
        time.sleep(1)  # a moment in which Ray would have placed a job still queued
        assert ray.job(job["submission_id"])["status"] == "FAILED"
        assert f"run {run_id} on " not in ray.logs(job)
        assert not (tmp_path / "node" / "code").exists(), "the agent was fetched for a cancelled run"
        # Should Ray start it all the same (its removal could not run): its entry finds the code dead.
        code = job["runtime_env"]["env_vars"]["POTATO_QUEUE_RUN_CODE"]
        late = entry(svc, run_id, code, tmp_path / "late")
        assert late.returncode == 0 and "this job has nothing to do" in late.stderr, late.stderr
        assert not (tmp_path / "late").exists()


def test_a_head_restart_fails_the_run_saying_ray_lost_its_job(
    tmp_path: Path, redis_server_url: str, ray: RayCluster
) -> None:
    with ray_project(tmp_path, redis_server_url, ray) as svc:
        run_id = held_run_running(svc, ray)
        ray.restart_head()
        run = svc.wait_for(run_id, TERMINAL, timeout_s=60)
        assert run["state"] == "failed"
        assert (
            f"The Ray head at 127.0.0.1:{ray.dashboard_port} restarted and lost job potato-queue-{run_id}"
            in run["error"]
        )
        wait_gone(tmp_path / "node")


def check(svc: Services, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any] | str]:
    done = run_cli("training", "check", BACKEND, svc.config, "--json", env=env)
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        return done.returncode, done.stdout + done.stderr


def test_check_says_rays_version_the_nodes_and_whether_a_run_fits(
    tmp_path: Path, redis_server_url: str, ray: RayCluster
) -> None:
    with ray_project(tmp_path / "fits", redis_server_url, ray) as svc:
        code, found = check(svc)
        assert code == 0, found
        assert isinstance(found, dict) and found["ray_version"] == "2.60.0" and found["placeable"]
        assert [node["resources_total"]["GPU"] for node in found["nodes"]] == [1.0]
        text = run_cli("training", "check", BACKEND, svc.config).stdout
        assert f"{BACKEND}: Ray 2.60.0 at {ray.address} (auth: accepted)" in text
        assert "a run asks GPU 1, CPU 1: " in text
        assert "server_url: not set, so the nodes dial the address potato-queue serve is bound to" in text
        # A short job with a run's resources looked at the node as a run's worker would see it.
        node = found["node"]
        assert (node["python"], node["executable"]) == (platform.python_version(), sys.executable)
        assert node["cuda_visible_devices"] == "0" and node["packages"]["sklearn"] is True
        assert (
            f"where a run would go ({socket.gethostname()}, CUDA_VISIBLE_DEVICES=0): Python "
            f"{platform.python_version()} ({sys.executable})" in text
        )
        assert "no GPU (no nvidia-smi on the node's PATH)" in text
        assert not [job for job in ray.jobs() if job["status"] in ("PENDING", "RUNNING")]
        # With the GPU held by someone else's job, the check job is taken out of the queue, not left there.
        blocker = ray.submit("sleep 30", num_gpus=1)
        wait_until(lambda: ray.job(blocker)["status"] == "RUNNING", timeout_s=30, what="the blocker's start")
        text = run_cli("training", "check", BACKEND, svc.config).stdout
        assert "the nodes' Python and packages: not looked at (the check job waited 10 s for a run's" in text
        ray.stop(blocker)
        wait_until(
            lambda: not [job for job in ray.jobs() if job["status"] in ("PENDING", "RUNNING")],
            timeout_s=30,
            what="no job left waiting or running",
        )
        # The Training page's "Runs on" menu names it by its head.
        _, rows = svc.api("GET", "/backends")
        assert {row["name"]: row["label"] for row in rows}[
            BACKEND
        ] == f"{BACKEND} (ray at 127.0.0.1:{ray.dashboard_port})"
    with ray_project(tmp_path / "too-big", redis_server_url, ray, num_gpus=2) as svc:
        code, found = check(svc)
        assert code == 1 and isinstance(found, dict) and not found["placeable"]
        assert "no live node has what a run asks (GPU 2, CPU 1)" in found["problems"][0]
        assert found["node"] is None
    with ray_project(tmp_path / "no-python", redis_server_url, ray, python="/nonexistent/python3") as svc:
        code, found = check(svc)
        assert code == 1 and isinstance(found, dict), found
        (problem,) = found["problems"]
        assert "without an answer from the node's python (/nonexistent/python3)" in problem
        assert "not found" in problem and "fix: set the backend's python to an interpreter the nodes have" in problem


def test_a_cluster_with_token_auth_takes_the_token_from_the_named_variable_only(
    tmp_path: Path, redis_server_url: str
) -> None:
    token = secrets.token_hex(32)
    cluster = RayCluster(auth_token=token)
    try:
        with ray_project(tmp_path / "none", redis_server_url, cluster, executors=0) as svc:
            code, said = check(svc)
            assert code == 1 and "refused potato-queue (401: no token was sent)" in str(said)
        named = {"token_env": "LAB_RAY_TOKEN"}
        with ray_project(tmp_path / "unset", redis_server_url, cluster, executors=0, **named) as svc:
            code, said = check(svc, env={"LAB_RAY_TOKEN": ""})
            assert code == 1 and "token_env names LAB_RAY_TOKEN, which is not set in this process" in str(said)
            code, said = check(svc, env={"LAB_RAY_TOKEN": "not-" + token})
            assert code == 1 and "(403: the token was refused)" in str(said)
        with ray_project(
            tmp_path / "run", redis_server_url, cluster, executor_env={"LAB_RAY_TOKEN": token}, **named
        ) as svc:
            code, said = check(svc, env={"LAB_RAY_TOKEN": token})
            assert code == 0, said
            run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
            assert svc.wait_for(run_id, TERMINAL, timeout_s=120)["state"] == "succeeded", svc.logs()
        written = [p for p in tmp_path.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        assert written == [], f"the Ray token was written to {written}"
    finally:
        cluster.close()


# The head's view of a dead node, shortened from Ray's 30 s of missed health checks to a few seconds.
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4"}


def test_a_run_whose_node_dies_is_submitted_again_and_resumes_from_its_checkpoint(
    tmp_path: Path, redis_server_url: str
) -> None:
    """The head has no GPU: the run's job goes to the worker node, which is killed mid-run (a spot node
    reclaimed). Ray fails the job (its supervisor's node died); the run is submitted again, placed on a new
    node, and resumes from the checkpoint in the shared workdir."""
    cluster = RayCluster(num_gpus=0, env=FAST_NODE_DEATH)
    try:
        first = cluster.add_node()
        with ray_project(tmp_path, redis_server_url, cluster, pending_timeout_s=120) as svc:
            params = {"hold_s": 12, "checkpoint_every_steps": 1}
            run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], params=params)
            svc.wait_for(run_id, {"running"}, timeout_s=60)
            checkpoints = tmp_path / "node" / "checkpoints" / run_id
            wait_until(lambda: (checkpoints / "step-3").exists(), 30, "the run's third checkpoint")
            first.kill()
            cluster.add_node()
            run = svc.wait_for(run_id, TERMINAL, timeout_s=120)
            assert run["state"] == "succeeded", svc.logs()
            log = run_paths(svc, run_id).run_log.read_text()
            assert f"Ray job potato-queue-{run_id}'s node died" in log, log
            assert f"submitted again as potato-queue-{run_id}-2 (1 of max_requeues 3)" in log, log
            assert re.search(r"resumed at step [3-9]\d* from the checkpoint", log), log
            assert wait_job(cluster, run_id, {"FAILED"})["error_type"] == "JOB_SUPERVISOR_ACTOR_DIED"
            # The run succeeded once its agent reported; Ray's job ends as that agent exits, a moment later.
            second = f"potato-queue-{run_id}-2"
            wait_until(lambda: cluster.job(second)["status"] == "SUCCEEDED", timeout_s=30, what=f"{second}'s end")
    finally:
        cluster.close()
