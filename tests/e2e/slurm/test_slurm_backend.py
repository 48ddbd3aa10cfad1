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
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.fake_gpus import FakeGpus
from tests.lifecycle_helpers import (
    TERMINAL,
    Services,
    alive_cmd,
    held_run,
    make_project,
    pids,
    run_paths,
    started,
    wait_running,
)
from tests.nginx import Nginx, free_port
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
    backend = {
        "type": "slurm",
        "host": ALIAS,
        "python": "/usr/bin/python3",
        "job_python": sys.executable,
        "remote_dir": str(shared),
        "poll_interval_s": 1,
        "heartbeat_timeout_s": 60,
        "env": {**slurm.env, **extra.pop("env", {})},
        **extra,
    }
    return {"backends": {BACKEND: backend}}


@pytest.fixture
def svc_factory(tmp_path: Path, redis_server_url: str, sshd: Sshd, slurm: SlurmCluster, shared: Path) -> Iterator[Any]:
    contexts: list[Any] = []

    def make(training: dict[str, Any] | None = None, **backend: Any) -> Services:
        sshd.write_config("root")
        context = started(
            tmp_path, redis_server_url, executors=0, **cluster_backend(slurm, shared, **backend), **(training or {})
        )
        svc = context.__enter__()
        contexts.append(context)
        svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
        return svc

    yield make
    for context in contexts:
        context.__exit__(None, None, None)


def run_log(svc: Services, run_id: str) -> str:
    path = run_paths(svc, run_id).run_log
    return path.read_text() if path.exists() else ""  # the executor may not have taken the run yet


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
    return svc.start_run(
        trainer="hf-text-classification",
        schemas=["sentiment"],
        backend=BACKEND,
        params={"model_name": str(tiny_model), "epochs": 500, "batch_size": 4},
    )


def test_a_run_through_sbatch_succeeds_with_its_gres_gpu(
    svc_factory: Any, slurm: SlurmCluster, shared: Path, tmp_path: Path
) -> None:
    # srun and sacct are never used (SLURM-2): stand-ins in front of the real ones note any call.
    shim, called = tmp_path / "shim", tmp_path / "called"
    shim.mkdir()
    for name in ("srun", "sacct"):
        (shim / name).write_text(f'#!/bin/sh\necho {name} >> {called}\nexec /usr/bin/{name} "$@"\n')
        (shim / name).chmod(0o755)
    # The compute node's nvidia-smi is a script (this machine has no GPU): job.sh's GPU meter samples it.
    gpus = FakeGpus(tmp_path / "gpus", "0, NVIDIA A100, 70000, 81920, 0, 8.0\n", "0, 240.0, 77, 18000\n")
    # The prelude runs in the job, before the worker: it shows the GPU SLURM handed the job.
    svc = svc_factory(
        gres="gpu:1",
        time="00:10:00",
        env={"PATH": f"{gpus.folder}:{shim}:/usr/local/bin:/usr/bin:/bin"},
        prelude=['echo "job sees CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" >&2'],
    )
    run_id = svc.start_run(**MAJORITY)
    run = svc.wait_for(run_id, TERMINAL, 120)
    assert run["state"] == "succeeded", (run, run_log(svc, run_id), svc.logs())
    log = run_log(svc, run_id)
    job = job_id_of(svc, run_id)
    assert f"Submitted SLURM job {job}: --gres=gpu:1 --time=00:10:00 --no-requeue" in log
    assert f"SLURM job {job}: RUNNING on {NODE}" in log
    assert "job sees CUDA_VISIBLE_DEVICES=0" in log, log
    assert run["metrics"], run
    usage = run["gpu_usage"]  # measured on the compute node, beside the worker
    assert usage["gpus"] == ["0"] and usage["mean_utilization_pct"] == 77.0 and usage["samples"] >= 2, usage
    assert usage["energy_wh"] == pytest.approx(240.0 * usage["gpu_seconds"] / 3600, rel=1e-3)
    assert run_paths(svc, run_id).predictions.stat().st_size > 0
    assert list((shared / "jobs").iterdir()) == [], "the job folder is removed after the copy back"
    slurm.wait_empty()  # the agent ends at the job's exit_code file; SLURM may list it COMPLETING a moment longer
    assert not called.exists(), called.read_text()


def block_the_node(slurm: SlurmCluster, partition: str = "gpu") -> str:
    """A job holding every CPU of the node, so that the next one waits (PENDING, Resources)."""
    job = slurm.run(
        "sbatch", "--parsable", f"--partition={partition}", f"--cpus-per-task={CPUS}", "--wrap", "sleep 300"
    ).stdout.strip()
    deadline = time.monotonic() + 30
    while f"{job} RUNNING" not in slurm.queue():
        assert time.monotonic() < deadline, slurm.queue()
        time.sleep(0.1)
    return job


def test_a_pending_job_logs_its_queue_states_and_its_wait_is_not_run_time(
    svc_factory: Any, slurm: SlurmCluster
) -> None:
    blocker = block_the_node(slurm)
    # max_wall_seconds counts from the end of the wait, and no heartbeat clock runs out while the job waits.
    svc = svc_factory(training={"max_wall_seconds": 6}, heartbeat_timeout_s=3)
    run_id = svc.start_run(**MAJORITY)
    job = job_id_of(svc, run_id)
    wait_log(svc, run_id, f"SLURM job {job}: PENDING (Resources)")
    time.sleep(9)
    _, run = svc.api("GET", f"/runs/{run_id}")
    assert run["state"] == "running" and run["step"] == f"SLURM job {job}: PENDING (Resources)", run
    slurm.run("scancel", blocker)
    run = svc.wait_for(run_id, TERMINAL, 60)
    assert run["state"] == "succeeded", (run, run_log(svc, run_id))
    log = run_log(svc, run_id)
    assert log.index(f"SLURM job {job}: PENDING (Resources)") < log.index(f"SLURM job {job}: RUNNING on {NODE}")


def test_a_job_pending_past_pending_timeout_s_is_cancelled_and_the_run_fails_naming_it(
    svc_factory: Any, slurm: SlurmCluster
) -> None:
    """A job the scheduler never starts once held the run slot for good (the default had no bound)."""
    blocker = block_the_node(slurm)
    try:
        svc = svc_factory(pending_timeout_s=4)
        run_id = svc.start_run(**MAJORITY)
        job = job_id_of(svc, run_id)
        run = svc.wait_for(run_id, TERMINAL, 60)
        assert run["state"] == "failed", (run, run_log(svc, run_id))
        assert re.match(
            rf"The SLURM job waited in the scheduler's queue for more than pending_timeout_s \(4 s\) "
            rf"\(SLURM job {job}: PENDING \(\w+\)\); it was cancelled\. Fix: raise pending_timeout_s of "
            rf"backend {BACKEND}",
            run["error"],
        ), run["error"]
        deadline = time.monotonic() + 30
        while any(line.startswith(f"{job} ") for line in slurm.queue()):
            assert time.monotonic() < deadline, slurm.queue()
            time.sleep(0.2)
    finally:
        slurm.run("scancel", blocker)


def test_slurmd_killed_mid_run_and_restarted_leaves_the_run_to_finish_true(
    svc_factory: Any, slurm: SlurmCluster
) -> None:
    """Chaos on the scheduler's own daemon: slurmd SIGKILLed while the job trains, then started again (as
    systemd does). The job's step lives on under slurmstepd; the run is not failed for it, ends succeeded
    once, and the next run goes."""
    svc = svc_factory()
    run_id = svc.start_run(**MAJORITY, params={"hold_s": 6})
    job = job_id_of(svc, run_id)
    wait_log(svc, run_id, f"SLURM job {job}: RUNNING on {NODE}")
    os.kill(slurm.slurmd_pid(), signal.SIGKILL)
    time.sleep(1)
    slurm.restart_slurmd()
    run = svc.wait_for(run_id, TERMINAL, 90)
    assert run["state"] == "succeeded", (run, run_log(svc, run_id))
    assert agent_log(svc, run_id).count("worker started") == 1, "the job ran once"
    assert svc.wait_for(svc.start_run(**MAJORITY), TERMINAL, 90)["state"] == "succeeded"


def agent_log(svc: Services, run_id: str) -> str:
    return run_paths(svc, run_id).agent_log.read_text()


def test_cancel_from_the_api_ends_the_job(svc_factory: Any, slurm: SlurmCluster, tiny_model: Path) -> None:
    svc = svc_factory()
    run_id = long_hf_run(svc, tiny_model)
    job = job_id_of(svc, run_id)
    wait_log(svc, run_id, "step: training sentiment", timeout_s=90)
    svc.api("POST", f"/runs/{run_id}/cancel")
    run = svc.wait_for(run_id, TERMINAL, 60)
    assert run["state"] == "cancelled", (run, run_log(svc, run_id))
    assert f"scancel --full --signal=TERM {job}" in agent_log(svc, run_id)
    slurm.wait_empty(15)


def test_the_ssh_session_killed_mid_run_cancels_the_job(svc_factory: Any, slurm: SlurmCluster, shared: Path) -> None:
    svc = svc_factory()
    run_id = held_run(svc, backend=BACKEND)
    job = job_id_of(svc, run_id)
    wait_log(svc, run_id, f"SLURM job {job}: RUNNING on {NODE}", timeout_s=60)
    (client,) = [
        pid
        for pid in pids()
        if (alive_cmd(pid) or "").startswith("ssh ") and f"potato-queue-{run_id}-" in (alive_cmd(pid) or "")
    ]
    os.kill(client, signal.SIGKILL)
    run = svc.wait_for(run_id, TERMINAL, 60)
    assert run["state"] == "failed", run
    slurm.wait_empty(20)  # the allocation is freed: nothing of the run is left in SLURM
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and [p for p in pids() if str(shared) in (alive_cmd(p) or "")]:
        time.sleep(0.1)
    assert [alive_cmd(p) for p in pids() if str(shared) in (alive_cmd(p) or "")] == []
    assert list((shared / "jobs").iterdir()) == []


def test_a_dropped_session_makes_the_agent_cancel_its_job_by_itself(
    svc_factory: Any, slurm: SlurmCluster, sshd: Sshd
) -> None:
    # The executor's own clean-up cannot log in any more (a key the host does not know): only the agent
    # on the login node, which sees its session end, can free the allocation.
    svc = svc_factory(training={"grace_seconds": 2})
    run_id = held_run(svc, backend=BACKEND)
    job = job_id_of(svc, run_id)
    wait_log(svc, run_id, f"SLURM job {job}: RUNNING on {NODE}", timeout_s=60)
    sshd.write_config("root", key=sshd.new_key("unknown-to-the-host"))
    (client,) = [
        pid
        for pid in pids()
        if (alive_cmd(pid) or "").startswith("ssh ") and f"potato-queue-{run_id}-" in (alive_cmd(pid) or "")
    ]
    os.kill(client, signal.SIGKILL)
    assert svc.wait_for(run_id, TERMINAL, 60)["state"] == "failed"
    slurm.wait_empty(30)


def running_job(svc: Services, run_id: str, slurm: SlurmCluster) -> str:
    job = job_id_of(svc, run_id)
    wait_log(svc, run_id, f"SLURM job {job}: RUNNING on {NODE}", timeout_s=60)
    wait_running(svc, run_id, timeout_s=90)
    return job


def test_a_job_whose_gpu_idles_is_stopped_by_the_idle_guard_from_its_nodes_meter(
    svc_factory: Any, slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The meter job.sh runs on the compute node writes how long the job's GPU has idled; the agent on the
    login node reads it and stops the job as it stops a local worker (the nvidia-smi there is a script)."""
    gpus = FakeGpus(tmp_path / "gpus", "0, NVIDIA A100, 70000, 81920, 0, 8.0\n", "0, 61.0, 1, 900\n")
    svc = svc_factory(
        training={"gpu_watch": {"sample_s": 0.5, "idle_stop_s": 8}},
        gres="gpu:1",
        time="00:10:00",
        env={"PATH": f"{gpus.folder}:/usr/local/bin:/usr/bin:/bin"},
    )
    run_id = held_run(svc, backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 120)
    assert run["state"] == "failed", (run, run_log(svc, run_id))
    # How long it had idled when the agent looked (it reads the meter's file each second): 8 s, or a little more.
    said = re.match(
        r"the run's GPUs \(GPU 0\) stayed under 5% utilization for (\d+) s, past "
        r"model_training\.gpu_watch\.idle_stop_s \(8 s\): the idle guard stopped the run \(fix: ",
        run["error"],
    )
    assert said and 8 <= int(said.group(1)) <= 13, run["error"]
    assert "step: the run's GPUs (GPU 0) have been under 5% utilization for" in run_log(svc, run_id)
    assert run["gpu_usage"]["gpus"] == ["0"] and run["gpu_usage"]["mean_utilization_pct"] == 1.0
    slurm.wait_empty(30)


def test_a_job_past_its_time_limit_fails_the_run_with_the_reason(svc_factory: Any, slurm: SlurmCluster) -> None:
    svc = svc_factory(time="00:10:00")
    run_id = held_run(svc, backend=BACKEND)
    job = running_job(svc, run_id, slurm)
    slurm.run("scontrol", "update", f"jobid={job}", "TimeLimit=0")
    run = svc.wait_for(run_id, TERMINAL, 90)
    assert run["state"] == "failed", run
    assert run["error"].startswith(f"SLURM job {job} ended before the worker finished: it reached its time limit"), run
    assert "raise the backend's `time` (now 00:10:00)" in run["error"], run


def test_a_failed_node_fails_the_run_with_the_reason(svc_factory: Any, slurm: SlurmCluster) -> None:
    svc = svc_factory()
    run_id = held_run(svc, backend=BACKEND)
    job = running_job(svc, run_id, slurm)
    slurm.run("scontrol", "update", f"nodename={NODE}", "state=down", "reason=test")
    run = svc.wait_for(run_id, TERMINAL, 90)
    assert run["state"] == "failed", run
    assert run["error"].startswith(f"SLURM job {job} ended before the worker finished: its node {NODE} failed"), run


def test_a_preempted_job_fails_the_run_with_the_reason(svc_factory: Any, slurm: SlurmCluster) -> None:
    svc = svc_factory()
    run_id = held_run(svc, backend=BACKEND)
    job = running_job(svc, run_id, slurm)
    block_the_node(slurm, partition="urgent")  # a higher PriorityTier: the run's job is cancelled for it
    run = svc.wait_for(run_id, TERMINAL, 90)
    assert run["state"] == "failed", run
    assert run["error"].startswith(
        f"SLURM job {job} ended before the worker finished: it was preempted by a job of higher priority"
    ), run


def test_a_scancel_from_outside_fails_the_run_with_the_reason(svc_factory: Any, slurm: SlurmCluster) -> None:
    svc = svc_factory()
    run_id = held_run(svc, backend=BACKEND)
    job = running_job(svc, run_id, slurm)
    slurm.run("scancel", job)
    run = svc.wait_for(run_id, TERMINAL, 90)
    assert run["state"] == "failed", run
    assert run["error"].startswith(
        f"SLURM job {job} ended before the worker finished: it was cancelled from outside potato-queue (scancel)"
    ), run


def test_a_job_missing_from_one_squeue_answer_is_not_taken_as_finished(
    svc_factory: Any, slurm: SlurmCluster, tmp_path: Path
) -> None:
    # A squeue in front of the real one on the backend's PATH answers "no such job" while the flag file
    # exists, and removes it: the job vanishes from exactly one answer.
    shim, flag = tmp_path / "shim", tmp_path / "hide-once"
    shim.mkdir()
    (shim / "squeue").write_text(
        f'#!/bin/sh\nif [ -e {flag} ]; then rm -f {flag}; exit 0; fi\nexec /usr/bin/squeue "$@"\n'
    )
    (shim / "squeue").chmod(0o755)
    blocker = block_the_node(slurm)
    svc = svc_factory(env={"PATH": f"{shim}:/usr/local/bin:/usr/bin:/bin"})
    run_id = svc.start_run(**MAJORITY)
    job = job_id_of(svc, run_id)
    wait_log(svc, run_id, f"SLURM job {job}: PENDING (Resources)")
    flag.touch()
    deadline = time.monotonic() + 10
    while flag.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not flag.exists(), "the agent polled squeue"
    time.sleep(1.5)
    _, run = svc.api("GET", f"/runs/{run_id}")
    assert run["state"] == "running", run
    assert f"squeue did not list SLURM job {job}; scontrol says PENDING: still following it" in agent_log(svc, run_id)
    slurm.run("scancel", blocker)
    run = svc.wait_for(run_id, TERMINAL, 60)
    assert run["state"] == "succeeded", (run, run_log(svc, run_id))


def test_an_import_error_on_the_compute_node_is_in_run_log(svc_factory: Any) -> None:
    svc = svc_factory(job_python="/usr/bin/python3")  # Debian's python3 has no scikit-learn
    run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 90)
    assert run["state"] == "failed", run
    assert "Trainer 'sklearn-text' could not be imported" in run["error"], run
    assert "Trainer 'sklearn-text' could not be imported" in run_log(svc, run_id)


def test_a_job_python_the_nodes_lack_says_so(svc_factory: Any) -> None:
    svc = svc_factory(job_python="/opt/no-such/python3")
    run = svc.wait_for(svc.start_run(**MAJORITY), TERMINAL, 90)
    assert run["state"] == "failed", run
    assert run["error"].startswith(f"/opt/no-such/python3 was not found on {NODE}"), run
    assert "set the backend's job_python" in run["error"]


def test_a_login_host_without_sbatch_is_err_8(svc_factory: Any, tmp_path: Path) -> None:
    svc = svc_factory(env={"PATH": str(tmp_path / "empty")})
    run = svc.wait_for(svc.start_run(**MAJORITY), TERMINAL, 60)
    assert run["state"] == "failed", run
    assert run["error"].startswith(f"{ALIAS} has no sbatch on PATH, so it cannot submit jobs"), run
    assert "set PATH in the backend's env" in run["error"]


def check(
    tmp_path: Path, sshd: Sshd, slurm: SlurmCluster, shared: Path, **backend: Any
) -> subprocess.CompletedProcess[str]:
    from tests.lifecycle_helpers import make_project

    sshd.write_config("root")
    config = make_project(tmp_path, **cluster_backend(slurm, shared, **backend))
    return run_cli(
        "training", "check", BACKEND, config, "--json", env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)}, timeout_s=120
    )


def test_check_reports_the_commands_the_pythons_and_the_partition(
    tmp_path: Path, sshd: Sshd, slurm: SlurmCluster, shared: Path
) -> None:
    from tests.lifecycle_helpers import make_project

    sshd.write_config("root")
    config = make_project(tmp_path, **cluster_backend(slurm, shared, partition="gpu"))
    proc = run_cli(
        "training", "check", BACKEND, config, env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)}, timeout_s=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{ALIAS}: Python 3.11" in proc.stdout and "runs the agent" in proc.stdout
    assert "sbatch: /usr/bin/sbatch" in proc.stdout and "scancel: /usr/bin/scancel" in proc.stdout
    assert f"remote_dir: {shared}" in proc.stdout
    assert f"job_python: {sys.executable} runs the worker on the compute nodes" in proc.stdout
    assert "partition gpu: 1 node(s), idle; 2 of 2 GPUs free" in proc.stdout, proc.stdout
    data = json.loads(check(tmp_path / "json", sshd, slurm, shared).stdout)
    assert data["ok"] is True and data["nodes"] == [
        {"node": NODE, "partition": "gpu", "state": "idle", "gpus": 2, "free_gpus": 2},
        {"node": NODE, "partition": "urgent", "state": "idle", "gpus": 2, "free_gpus": 2},
        {"node": NODE, "partition": "spot", "state": "idle", "gpus": 2, "free_gpus": 2},
    ]


@pytest.mark.parametrize("shell", ["tcsh", "fish"])
def test_a_login_node_account_whose_shell_is_tcsh_or_fish_checks_and_runs_a_job(
    shell: str, tmp_path: Path, redis_server_url: str, sshd: Sshd, slurm: SlurmCluster, shared: Path
) -> None:
    """Many HPC sites still give tcsh; the check, the bootstrap, sbatch and the copy back go through it."""
    user = sshd.add_user(f"pqslurm-{shell}", shell=f"/usr/bin/{shell}")
    sshd.authorize(user, sshd.key)
    shutil.chown(shared, user, user)  # remote_dir is the account's, as on a cluster's shared storage
    config = sshd.aliases(f"ssh_config.{shell}", {f"login-{shell}": {"User": user}})
    backend = {
        "type": "slurm",
        "host": f"login-{shell}",
        "python": "/usr/bin/python3",
        "job_python": "/usr/bin/python3",
        "remote_dir": str(shared),
        "poll_interval_s": 1,
        "heartbeat_timeout_s": 60,
        "env": {"SLURM_CONF": slurm.conf_for_accounts()},
    }
    env = {"POTATO_QUEUE_SSH_CONFIG": str(config)}
    try:
        checked = run_cli(
            "training",
            "check",
            BACKEND,
            make_project(tmp_path / "check", backends={BACKEND: backend}),
            env=env,
            timeout_s=120,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "sbatch: /usr/bin/sbatch" in checked.stdout, checked.stdout
        # No partition set: the default one (sinfo's `*`), its node counted once though three partitions list it.
        assert "partition gpu (the default): 1 node(s), idle; 2 of 2 GPUs free" in checked.stdout, checked.stdout
        with started(tmp_path / "run", redis_server_url, executors=0, backends={BACKEND: backend}) as svc:
            svc.executor(env=env)
            run_id = svc.start_run(**MAJORITY)
            run = svc.wait_for(run_id, TERMINAL, 120)
            assert run["state"] == "succeeded", (run, run_log(svc, run_id), svc.logs())
            assert f"Submitted SLURM job {job_id_of(svc, run_id)}" in run_log(svc, run_id)
            assert run_paths(svc, run_id).predictions.stat().st_size > 0
        assert list((shared / "jobs").iterdir()) == [], "the job folder is removed after the copy back"
    finally:
        slurm.run("scancel", f"--user={user}", check=False)
        slurm.wait_empty()


def test_check_fails_without_sbatch_and_for_a_remote_dir_that_is_really_in_tmp(
    tmp_path: Path, sshd: Sshd, slurm: SlurmCluster, shared: Path
) -> None:
    proc = check(tmp_path / "a", sshd, slurm, shared, env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 1
    problems = json.loads(proc.stdout)["problems"]
    assert problems[0].startswith(f"{ALIAS} has no sbatch on PATH, so it cannot submit jobs; fix: "), problems
    # The validator sees /srv/...; only the login node knows the folder is a link into /tmp.
    link = shared / "scratch"
    link.symlink_to(tempfile.mkdtemp(prefix="pq-node-local-"))
    proc = check(tmp_path / "b", sshd, slurm, shared, remote_dir=str(link))
    assert proc.returncode == 1
    (problem,) = json.loads(proc.stdout)["problems"]
    assert problem.startswith(f"remote_dir {link} is {link.resolve()} on {ALIAS}, which is local to each node"), problem
    shutil.rmtree(link.resolve())


def test_a_hand_started_agent_on_the_login_node_submits_with_its_slurm_config(
    tmp_path: Path, redis_server_url: str, slurm: SlurmCluster, shared: Path
) -> None:
    from tests.agent_helpers import AGENT, lab, register

    settings = tmp_path / "slurm.json"
    with started(tmp_path, redis_server_url, executors=1, **lab()) as svc:
        token = register(svc)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("POTATO_")},
            **slurm.env,
            "POTATO_TRAINING_TOKEN": token,
        }
        settings.write_text(json.dumps({"partition": "gpu", "gres": "gpu:1", "job_pyhton": sys.executable}))
        refused = subprocess.run(
            [
                *AGENT,
                "--server",
                svc.url,
                "--backend",
                "lab",
                "--workdir",
                str(shared),
                "--slurm-config",
                str(settings),
                "--once",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2
        assert f"{settings}: unknown slurm setting job_pyhton; the settings are job_python, prelude" in refused.stderr
        settings.write_text(
            json.dumps({"partition": "gpu", "gres": "gpu:1", "job_python": sys.executable, "poll_interval_s": 1})
        )
        agent = subprocess.Popen(
            [
                *AGENT,
                "--server",
                svc.url,
                "--backend",
                "lab",
                "--workdir",
                str(shared),
                "--slurm-config",
                str(settings),
                "--once",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            cwd=tmp_path,
        )
        try:
            run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="lab")
            run = svc.wait_for(run_id, TERMINAL, 120)
            assert agent.wait(60) == 0
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
        output = agent.stdout.read() if agent.stdout else ""
        assert run["state"] == "succeeded", (run, output)
        log = run_log(svc, run_id)
        job = job_id_of(svc, run_id)
        assert f"Submitted SLURM job {job}: --partition=gpu --gres=gpu:1 --no-requeue" in log
        assert f"SLURM job {job}: RUNNING on {NODE}" in log
        assert run["artifact_uri"].endswith(f":{shared}/{run_id}/work"), run
        # An installed agent's code lives where the nodes may not look: the job ran a copy in the workdir.
        assert [p.name.startswith("potato-queue-") for p in (shared / "code").iterdir()] == [True]


def test_a_job_over_its_mem_fails_the_run_out_of_memory(
    tmp_path: Path, redis_server_url: str, sshd: Sshd, shared: Path, tiny_model: Path
) -> None:
    # The cgroup plugins enforce a job's memory at once (cgroup v1 on this machine): a cluster of its own.
    # (Without them OverMemoryKill samples every 30 s; that text is tests/data/slurm/*over_mem_polled*.)
    with SlurmCluster(tmp_path / "cgroup-slurm", cgroups=True) as slurm:
        sshd.write_config("root")
        backend = cluster_backend(slurm, shared, mem="150M")  # importing torch alone takes more
        with started(tmp_path, redis_server_url, executors=0, **backend) as svc:
            svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
            run_id = long_hf_run(svc, tiny_model)
            run = svc.wait_for(run_id, TERMINAL, 120)
            job = job_id_of(svc, run_id)
        assert run["state"] == "failed", run
        assert run["error"].startswith(f"SLURM job {job} ended before the worker finished: it ran out of memory"), run
        assert "raise the backend's `mem` (now 150M)" in run["error"]
        slurm.wait_empty()


# Records the worker's environment, then runs it: the job's python as the trainer sees it.
ENV_RECORDER = """#!/bin/sh
case "$4" in potato_queue.worker) env > "$(dirname "$0")/worker.env";; esac
exec {python} "$@"
"""


def test_a_secret_named_env_reaches_neither_job_sh_nor_the_trainer_unless_listed(
    svc_factory: Any, shared: Path
) -> None:
    """One environment rule on every backend: a backend's env reaches the trainer, except names that look like
    secrets, which need secret_env. Before, every env entry went in clear into job.sh on shared storage (and
    to the trainer), and job.sh was 0700: the job folder's files are 0600 in a 0700 folder now."""
    recorder = shared / "bin" / "python"
    recorder.parent.mkdir()
    recorder.write_text(ENV_RECORDER.format(python=sys.executable))
    recorder.chmod(0o755)
    svc = svc_factory(
        job_python=str(recorder),
        keep_remote=True,
        secret_env=["HF_TOKEN"],
        env={"PQ_PLAIN": "plain-value", "MY_API_KEY": "do-not-pass-1", "HF_TOKEN": "listed-value"},
    )
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    assert svc.wait_for(run_id, TERMINAL, 180)["state"] == "succeeded", run_log(svc, run_id)
    job = shared / "jobs" / run_id
    script = (job / "job.sh").read_text()
    assert "do-not-pass-1" not in script and "export PQ_PLAIN=plain-value" in script
    seen = dict(line.split("=", 1) for line in (recorder.parent / "worker.env").read_text().splitlines() if "=" in line)
    assert seen.get("PQ_PLAIN") == "plain-value" and seen.get("HF_TOKEN") == "listed-value"
    assert "MY_API_KEY" not in seen and "do-not-pass-1" not in "".join(seen.values())
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    loose = {
        str(path.relative_to(job)): oct(stat.S_IMODE(path.stat().st_mode))
        for path in job.rglob("*")
        if path.is_file() and stat.S_IMODE(path.stat().st_mode) & 0o077
    }
    assert loose == {}, "every file of the job folder is the account's alone"


def test_a_server_behind_the_shipped_nginx_runs_slurm_jobs(
    tmp_path: Path, redis_server_url: str, sshd: Sshd, slurm: SlurmCluster, shared: Path
) -> None:
    """serve on 127.0.0.1 with an https --public-url behind deploy/nginx.conf (tests/nginx.py): the job's agent
    on the login node reports through its ssh forward to the bound address, not through the public URL."""
    upstream = free_port("127.0.0.1")
    proxy = Nginx(tmp_path / "nginx", "127.0.0.1", upstream)
    sshd.write_config("root")
    svc = Services(make_project(tmp_path, **cluster_backend(slurm, shared)), redis_server_url, tmp_path)
    try:
        svc.serve("127.0.0.1", "--port", str(upstream), "--public-url", proxy.url)
        svc.ssl_context = proxy.ssl_context()
        svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        assert svc.wait_for(run_id, TERMINAL, 180)["state"] == "succeeded", run_log(svc, run_id)
    finally:
        svc.stop()
        proxy.close()


# ---------------------------------------------------------------- preemption, requeue, resume

REQUEUEABLE = {"partition": "spot", "requeue": True}
# 10 s: a checkpoint at step 3 leaves seven seconds for SLURM to preempt or signal the job; the requeued job
# holds only the rest.
HOLD_CHECKPOINTED = {
    "trainer": "majority-baseline",
    "schemas": ["sentiment"],
    "backend": BACKEND,
    "params": {"hold_s": 10, "checkpoint_every_steps": 1},
}


def wait_checkpoint(shared: Path, run_id: str, step: int, timeout_s: float = 90) -> None:
    """Until the run's worker has saved a whole checkpoint at `step` or later (its folder, beside the job
    folders, is on shared storage)."""
    deadline = time.monotonic() + timeout_s
    folder = shared / "jobs" / "checkpoints" / run_id
    while not any(int(done.parent.name.split("-")[1]) >= step for done in folder.glob("step-*/DONE")):
        assert time.monotonic() < deadline, f"no checkpoint at step {step} in {folder}"
        time.sleep(0.1)


def start_again_now(slurm: SlurmCluster, job: str, run_id: str) -> None:
    """SLURM holds a requeued job back for a while (BeginTime, about two minutes on this one); the tests do
    not wait it out. The requeue itself and the job's second run are SLURM's own. The two minutes also let
    the first run's end be done with: so the second starts only once no process of the first is left (its
    batch script, in this cluster's spool, and its worker) and its credential is older than the clock's
    second, as after the two minutes."""
    deadline = time.monotonic() + 60
    while f"{job} PENDING" not in slurm.queue():
        assert time.monotonic() < deadline, slurm.queue()
        time.sleep(0.2)
    script, spec = str(slurm.spool / f"job{int(job):05d}"), f"/jobs/{run_id}/spec.json"
    while left := [
        cmd
        for cmd in map(alive_cmd, pids())
        if cmd and (script in cmd or (spec in cmd and "potato_queue.worker" in cmd))
    ]:
        assert time.monotonic() < deadline, f"the first run of SLURM job {job} did not end: {left}"
        time.sleep(0.2)
    # slurmd refuses a job whose credential is not newer, to the second, than the revocation of its first run's
    # ("Killing non-startable batch job: Job credential revoked"), which SLURM did before the requeue we saw:
    # the start waits for the next second on the clock (SLURM's own hold is for this).
    first_run_ended_s = int(time.time())
    while int(time.time()) <= first_run_ended_s:
        time.sleep(0.05)
    slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now")


def _job_stderr(svc: Services, run_id: str) -> str:
    """The job folder's stderr.log (for a failure's message)."""
    try:
        remote_dir = Path(svc.project_config.model_training.backends[BACKEND].remote_dir)  # type: ignore[union-attr]
        found = list(remote_dir.glob(f"**/{run_id}/stderr.log"))
        return "".join(f"{path}:\n{path.read_text(errors='replace')[-4000:]}" for path in found) or "no stderr.log"
    except Exception as exc:  # noqa: BLE001 - only a failure's message
        return f"stderr.log not read: {exc!r}"


def resumed_as_one_run(svc: Services, slurm: SlurmCluster, run_id: str, job: str) -> str:
    log = wait_log(svc, run_id, f"SLURM job {job} was preempted and requeued", timeout_s=90)
    start_again_now(slurm, job, run_id)
    run = svc.wait_for(run_id, TERMINAL, 120)
    log = run_log(svc, run_id)
    # the whole of run.log (the worker's stderr is in it), the job folder's own stderr and the agent's log (what
    # it read of squeue, scontrol and exit_code), not a cut repr
    assert run["state"] == "succeeded", (
        f"{run['state']}: {run.get('error')}\n{log}\n{_job_stderr(svc, run_id)}\n"
        f"agent.log:\n{agent_log(svc, run_id)}\n{slurm.job_lines(job)}"
    )
    found = re.search(r"preempted, requeued, resumed at step (\d+)", log)
    assert found and int(found.group(1)) >= 3, log
    # run.log may say the submission as a step and as a line (that depends on timing): count the jobs
    assert set(re.findall(r"Submitted SLURM job (\d+)", log)) == {job}, "one run, one job: SLURM ran it again"
    return log


def test_a_job_preempted_for_a_higher_priority_one_is_requeued_and_resumes_as_one_run(
    svc_factory: Any, slurm: SlurmCluster, shared: Path
) -> None:
    """spot's jobs are requeued when urgent needs the node (SLURM's PreemptMode=REQUEUE): SIGTERM, then back in
    the queue. The worker takes that SIGTERM for a preemption (it is not our cancel), checkpoints and exits 6;
    the job runs again and the worker holds only the rest."""
    svc = svc_factory(**REQUEUEABLE)
    run_id = svc.start_run(**HOLD_CHECKPOINTED)
    job = job_id_of(svc, run_id)
    wait_checkpoint(shared, run_id, 3)
    blocker = block_the_node(slurm, partition="urgent")
    wait_log(svc, run_id, f"SLURM job {job} was preempted and requeued", timeout_s=90)
    slurm.run("scancel", blocker)
    resumed_as_one_run(svc, slurm, run_id, job)


def test_the_time_limit_signal_checkpoints_and_the_job_requeues_itself(
    svc_factory: Any, slurm: SlurmCluster, shared: Path
) -> None:
    """SLURM's --signal=B:USR1@preempt_signal_s, sent here by hand (scancel --batch --signal=USR1: what SLURM
    sends that long before the time limit): job.sh passes it on, the worker checkpoints, the job requeues itself."""
    svc = svc_factory(**REQUEUEABLE, time="60")
    run_id = svc.start_run(**HOLD_CHECKPOINTED)
    job = job_id_of(svc, run_id)
    wait_checkpoint(shared, run_id, 3)
    slurm.run("scancel", "--batch", "--signal=USR1", job)
    resumed_as_one_run(svc, slurm, run_id, job)


def test_cancel_of_a_requeueable_job_stays_a_cancel(svc_factory: Any, slurm: SlurmCluster, shared: Path) -> None:
    svc = svc_factory(**REQUEUEABLE)
    run_id = svc.start_run(**HOLD_CHECKPOINTED)
    job = job_id_of(svc, run_id)
    wait_checkpoint(shared, run_id, 2)
    svc.api("POST", f"/runs/{run_id}/cancel")
    run = svc.wait_for(run_id, TERMINAL, 90)
    assert run["state"] == "cancelled", (run, run_log(svc, run_id))
    assert "preempted" not in run_log(svc, run_id)
    slurm.wait_empty()  # the job was not requeued
    assert job not in " ".join(slurm.queue())


def test_a_slurm_run_whose_worker_was_killed_resumes_when_retried(svc_factory: Any, shared: Path) -> None:
    """Not requeueable: the killed worker fails the run, and its retry (a new job) resumes from the checkpoint
    on the shared storage."""
    from tests.e2e.runs.test_retry import kill_then_retry

    svc = svc_factory()

    def worker_of(run_id: str) -> int:
        found = [
            p
            for p in pids()
            if "potato_queue.worker" in (alive_cmd(p) or "") and f"/jobs/{run_id}/spec.json" in (alive_cmd(p) or "")
        ]
        assert len(found) == 1, [alive_cmd(p) for p in found]
        return found[0]

    kill_then_retry(svc, BACKEND, lambda run_id: shared / "jobs" / "checkpoints" / run_id, worker_of)
    assert list((shared / "jobs").iterdir()) == [], "nothing left on the shared storage"
