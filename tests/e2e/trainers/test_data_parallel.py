"""Data-parallel runs: the ranks' command lines and environments, and real 2-rank runs on CPU processes (gloo).

No GPU is here: POTATO_QUEUE_CPU_RANKS=2 asks the worker for two CPU ranks, which take the very path two
GPUs take (the worker starts the ranks, torch DDP all-reduces their gradients, rank 0 alone reports), with
gloo for nccl. The multi-GPU run itself is bench/gpu_check.py's, on a GPU machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from potato_queue.agent.launchers.process import group_members
from potato_queue.wire.isolated import BOOTSTRAP, CODE_ROOT, THREAD_ENV_VARS
from potato_queue.worker.parallel import describe_parallel, rank_launches, threads_per_rank, world_for
from tests.e2e.trainers.test_llm_trainer import llm_params, run_until
from tests.e2e.trainers.test_worker import (
    ROOT,
    SCHEMA,
    Run,
    assert_predictions,
    assert_well_formed,
    worker_env,
    write_bundle,
    write_spec,
)

PYTHON = ["/usr/bin/python3", "-c", BOOTSTRAP, CODE_ROOT, "potato_queue.worker"]


def test_two_gpus_are_two_ranks_with_torchruns_environment_each_on_its_own_gpu() -> None:
    launches = rank_launches(PYTHON, "/jobs/r1/spec.json", 2, True, 29500, threads_per_rank(16, 2, 64))
    assert [launch.argv[5:] for launch in launches] == [
        ["--spec", "/jobs/r1/spec.json", "--rank", "0"],
        ["--spec", "/jobs/r1/spec.json", "--rank", "1"],
    ]
    assert all(launch.argv[:5] == PYTHON for launch in launches)
    threads = {name: "8" for name in THREAD_ENV_VARS}
    assert [launch.env for launch in launches] == [
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            "POTATO_QUEUE_RANK_DEVICE": "cuda:0",
            **threads,
        },
        {
            "RANK": "1",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            "POTATO_QUEUE_RANK_DEVICE": "cuda:1",
            **threads,
        },
    ]
    assert describe_parallel(launches, {"CUDA_VISIBLE_DEVICES": "2,5"}) == (
        "data-parallel on 2 GPUs (cuda:0, cuda:1; CUDA_VISIBLE_DEVICES=2,5), one process each, torch DDP over nccl"
    )


def test_cpu_ranks_for_tests_share_the_threads_and_say_so() -> None:
    launches = rank_launches(PYTHON, "spec.json", 3, False, 4000, threads_per_rank(None, 3, 2))
    assert [launch.env["POTATO_QUEUE_RANK_DEVICE"] for launch in launches] == ["cpu", "cpu", "cpu"]
    assert {launch.env["OMP_NUM_THREADS"] for launch in launches} == {"1"}  # at least one a rank
    assert describe_parallel(launches, {}) == (
        "data-parallel on 3 CPU processes (POTATO_QUEUE_CPU_RANKS=3, for tests "
        "and CPU-only machines), torch DDP over gloo"
    )


def test_only_several_visible_gpus_of_the_workers_choosing_and_a_trainer_that_can_make_ranks() -> None:
    two = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert world_for("auto", True, two) == 2 and world_for("cuda", True, two) == 2
    assert world_for("auto", True, {"CUDA_VISIBLE_DEVICES": "3"}) == 1, "one GPU stays in-process"
    assert world_for("auto", True, {}) == 1, "no CUDA_VISIBLE_DEVICES: one GPU, the default"
    assert world_for("cuda:1", True, two) == 1, "a named device is the user's choice"
    assert world_for("cpu", True, two) == 1
    assert world_for("auto", False, two) == 1, "a trainer that cannot (sklearn-text, majority-baseline)"
    assert world_for("cpu", True, {"POTATO_QUEUE_CPU_RANKS": "2"}) == 2


def ranks_env() -> dict[str, str]:
    return {**worker_env(), "POTATO_QUEUE_CPU_RANKS": "2"}


def run_in_group(spec: Path, act: Callable[[subprocess.Popen[str]], None]) -> tuple[Run, int]:
    """Two ranks; at the second update act(worker). The run and the worker's process group (the agent's)."""
    groups = []

    def acting(proc: subprocess.Popen[str]) -> None:
        groups.append(proc.pid)
        act(proc)

    return run_until(spec, 2, acting, ranks_env()), groups[0]


def run_to_end(spec: Path, env: dict[str, str]) -> Run:
    proc = subprocess.run(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def confidences(work: Path) -> dict[str, float]:
    return {
        p["instance_id"]: p["confidence"]
        for p in map(json.loads, (work / "predictions.jsonl").read_text().splitlines())
    }


def test_two_ranks_train_one_model_that_rank_0_alone_reports_and_saves(tmp_path: Path, tiny_llm: Path) -> None:
    """Two ranks of batch_size 4 train the model one process trains with batch_size 8: each rank takes every
    other item of an epoch's order and their gradients are averaged, so only the all-reduce makes them equal."""
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    no_dropout = {"r": 4, "alpha": 8, "dropout": 0.0}
    (tmp_path / "ranks").mkdir()
    run = run_to_end(
        write_spec(tmp_path / "ranks", bundle, "hf-llm-lora", llm_params(tiny_llm, lora=no_dropout)), ranks_env()
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert_well_formed(run)
    assert_predictions(tmp_path / "ranks" / "work", bundle, run)  # every item once, one result
    logs = [e["msg"] for e in run.of("log")]
    assert logs[0].startswith("data-parallel on 2 CPU processes"), logs
    assert [s["step"] for s in run.of("status")].count("loading the bundle") == 1, "rank 1 said nothing"
    assert sum(m.startswith("Running hf-llm-lora on") for m in logs) == 1
    train = [e for e in run.of("progress") if e["phase"] == "train"]
    # 26 items, 13 a rank: batches of 4 = 4 batches, 2 per update = 2 updates an epoch, 2 epochs (8 in one process).
    assert train[-1]["current"] == train[-1]["total"] == 4, train[-1]
    assert (tmp_path / "ranks" / "work" / SCHEMA / "adapter_model.safetensors").is_file()

    (tmp_path / "one").mkdir()
    alone = run_to_end(
        write_spec(
            tmp_path / "one",
            bundle,
            "hf-llm-lora",
            llm_params(tiny_llm, lora=no_dropout, batch_size=8, grad_accum_steps=2),
        ),
        worker_env(),
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    together, single = confidences(tmp_path / "ranks" / "work"), confidences(tmp_path / "one" / "work")
    assert together.keys() == single.keys()
    assert max(abs(together[k] - single[k]) for k in single) < 1e-4, (together, single)


def test_two_ranks_of_hf_text_classification(tmp_path: Path, tiny_model: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    params = {"model_name": str(tiny_model), "epochs": 1, "batch_size": 4, "learning_rate": 1e-3}
    run = run_to_end(write_spec(tmp_path, bundle, "hf-text-classification", params), ranks_env())
    assert run.returncode == 0, run.stderr[-3000:]
    assert_predictions(tmp_path / "work", bundle, run)
    train = [e for e in run.of("progress") if e["phase"] == "train"]
    assert train[-1]["current"] == train[-1]["total"] == 4, train[-1]  # 13 items a rank, batches of 4


def test_a_preemption_sent_to_the_group_saves_one_checkpoint_exits_6_and_the_rerun_resumes(
    tmp_path: Path, tiny_llm: Path
) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    spec = write_spec(tmp_path, bundle, "hf-llm-lora", llm_params(tiny_llm, epochs=3, checkpoint_every_steps=100))
    # SIGUSR1 to the worker's whole group, as SLURM signals a job's processes.
    run, group = run_in_group(spec, lambda proc: os.killpg(proc.pid, signal.SIGUSR1))
    assert run.returncode == 6, run.stderr[-3000:]
    assert run.of("status")[-1]["state"] == "preempted" and not run.of("error")
    saved = [e["msg"] for e in run.of("log") if e["msg"].startswith("checkpoint saved")]
    assert len(saved) == 1, saved
    step = int(saved[0].rsplit(" ", 1)[1])
    assert (tmp_path / "checkpoints" / f"step-{step}" / "DONE").is_file()
    assert group_members(group) == []

    resumed = run_to_end(spec, ranks_env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert any(e["msg"].startswith(f"resumed at step {step} ") for e in resumed.of("log"))
    train = [e for e in resumed.of("progress") if e["phase"] == "train"]
    assert train[0]["current"] == step + 1 and train[-1]["current"] == 6, (train[0], train[-1])


def test_a_cancel_sent_to_the_worker_alone_reaches_every_rank(tmp_path: Path, tiny_llm: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    spec = write_spec(tmp_path, bundle, "hf-llm-lora", llm_params(tiny_llm, epochs=20))
    run, group = run_in_group(spec, lambda proc: proc.send_signal(signal.SIGTERM))
    assert run.returncode == 4, run.stderr[-3000:]
    assert run.of("status")[-1]["state"] == "cancelled" and not run.of("result")
    assert group_members(group) == []


def _rank_pid(group: int, rank: int) -> int:
    for pid in group_members(group):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--rank" in argv and argv[argv.index(b"--rank") + 1] == str(rank).encode():
            return pid
    raise AssertionError(f"no rank {rank} in group {group}")


def test_a_rank_that_dies_ends_the_run_naming_it_and_leaves_no_rank_running(tmp_path: Path, tiny_llm: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    spec = write_spec(tmp_path, bundle, "hf-llm-lora", llm_params(tiny_llm, epochs=20))
    run, group = run_in_group(spec, lambda proc: os.kill(_rank_pid(proc.pid, 1), signal.SIGKILL))
    assert run.returncode == 1, run.stderr[-3000:]
    # The run's error (the last one) names the rank that died. Rank 0 may have seen the broken gradient
    # exchange first and said so in an error of its own (then "ended with it"), or been stopped by the parent.
    *rank0_said, last = run.of("error")
    assert last["message"] in (
        "rank 1 of 2 (cpu) exited with code 137; rank 0 was stopped",
        "rank 1 of 2 (cpu) exited with code 137; rank 0 ended with it",
    ), run.of("error")
    assert len(rank0_said) <= 1
    assert group_members(group) == []


# Rank 1's sitecustomize: it waits at its interpreter's start for the test's go (the file RELEASE names), so that
# rank 0 is alone in init_process_group's rendezvous when the cancel comes.
HOLD_RANK_1 = """import os, time
if os.environ.get("RANK") == "1":
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def _cancel_while_loading(
    spec: Path, env: dict[str, str], ready: Callable[[dict[str, Any], int], bool]
) -> tuple[Run, int]:
    """Two ranks; SIGTERM to the worker alone once ready(event, the worker's group) (before any train progress).
    The run and the group."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # as the agent starts it: the worker leads the group its ranks join
    )
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if ready(json.loads(line), proc.pid):
                proc.send_signal(signal.SIGTERM)
                break
        if "RELEASE" in env:
            Path(env["RELEASE"]).touch()
        try:
            rest, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # what the agent does after its grace: the exit code is 137
            rest, stderr = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return Run(proc.returncode, "".join(lines) + rest, stderr), proc.pid


def _assert_cancelled(run: Run, group: int) -> None:
    assert not [e for e in run.of("progress") if e["phase"] == "train"], "the cancel came after training began"
    assert run.returncode == 4, (run.returncode, run.of("status")[-2:], run.stderr[-3000:])
    assert run.of("status")[-1]["state"] == "cancelled" and not run.of("result") and not run.of("error")
    assert group_members(group) == []


def test_a_cancel_while_the_ranks_load_the_model_ends_cancelled_and_leaves_no_rank(
    tmp_path: Path, tiny_llm: Path
) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    spec = write_spec(tmp_path, bundle, "hf-llm-lora", llm_params(tiny_llm, epochs=20))
    run, group = _cancel_while_loading(
        spec, ranks_env(), lambda e, _: e["event"] == "status" and e["step"].startswith(f"loading {tiny_llm} for ")
    )
    _assert_cancelled(run, group)


def _listening(port: int) -> bool:
    """Whether something listens on the TCP port (/proc/net: no connection made, nothing disturbed)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "0A":
                return True
    return False


def _in_rendezvous(group: int) -> bool:
    """Whether rank 0 waits in init_process_group: it listens on MASTER_PORT for the other ranks."""
    pid = _rank_pid(group, 0)
    environ = dict(
        item.split(b"=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in item
    )
    deadline = time.monotonic() + 60
    while not _listening(int(environ[b"MASTER_PORT"])):
        assert time.monotonic() < deadline, "rank 0 never opened the rendezvous"
        time.sleep(0.05)
    return True


def test_a_cancel_while_one_rank_still_loads_and_the_other_waits_for_it_ends_cancelled(
    tmp_path: Path, tiny_llm: Path
) -> None:
    """Rank 1 still starting (the cancel reaches it before its trainer's loop: it stops at once) while rank 0
    waits for it in init_process_group, inside native code where no signal handler of its runs: the parent
    ends rank 0 after PEER_GRACE_S and says the run was cancelled (it waited out the agent's grace: 137)."""
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    (tmp_path / "hold").mkdir()
    (tmp_path / "hold" / "sitecustomize.py").write_text(HOLD_RANK_1)
    env = ranks_env()
    env.update(PYTHONPATH=f"{tmp_path / 'hold'}{os.pathsep}{env['PYTHONPATH']}", RELEASE=str(tmp_path / "go"))
    spec = write_spec(tmp_path, bundle, "hf-llm-lora", llm_params(tiny_llm, epochs=20))
    run, group = _cancel_while_loading(
        spec, env, lambda e, group: e["event"] == "status" and e["step"] == "fitting" and _in_rendezvous(group)
    )
    _assert_cancelled(run, group)
    said = run.of("status")[-1]["step"]
    assert said.startswith("stopped on SIGTERM: rank 1 ended while rank 0 waited on it"), said
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
