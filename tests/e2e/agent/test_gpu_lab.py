"""A shared GPU lab on the agent backend (issue 38): what a run cost in GPU-hours and energy, the idle guard,
the leak guard.

This machine has no GPU: `nvidia-smi` is tests/fake_gpus.py's script, answering from files the test
rewrites (two GPUs; the agent is given GPU 1 by CUDA_VISIBLE_DEVICES, as a lab admin gives one). A process
"holding GPU memory" is a real process the test starts, listed by that nvidia-smi while it lives. Everything
else is real: Redis, the server, the executor, the agent and the worker, which holds its train phase
(majority-baseline's hold_s) while the agent samples the GPUs every 0.2 s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_helpers import BACKEND, lab, register
from tests.conftest import run_cli
from tests.fake_gpus import FakeGpus, LocalAgent, gpu_process
from tests.lifecycle_helpers import TERMINAL, Services, held_run, run_paths, started, wait_running
from tests.potato_helpers import potato_view

GPUS = "0, NVIDIA A100-SXM4-80GB, 1200, 81920, 97, 8.0\n1, NVIDIA A100-SXM4-80GB, 50000, 81920, 3, 8.0\n"
BUSY = "0, 400.0, 99, 79000\n1, 300.0, 87, 30000\n"
IDLE = "0, 400.0, 99, 79000\n1, 61.5, 1, 30000\n"
# Its warning comes at half: a 3 s window, wide enough for an agent's once-a-second look on a loaded machine.
IDLE_STOP_S = 6


class Lab:
    def __init__(self, svc: Services, gpus: FakeGpus, agent: LocalAgent) -> None:
        self.svc, self.gpus, self.agent = svc, gpus, agent


@pytest.fixture(scope="module")
def gpu_lab(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str) -> Iterator[Lab]:
    tmp_path = tmp_path_factory.mktemp("gpu-lab")
    watch = {"sample_s": 0.2, "idle_utilization_pct": 5, "idle_stop_s": IDLE_STOP_S}
    with started(tmp_path, redis_server_url, **lab(), gpu_watch=watch) as svc:
        gpus = FakeGpus(tmp_path / "bin", GPUS, BUSY)
        agent = LocalAgent(svc, register(svc), gpus.path, env={"CUDA_VISIBLE_DEVICES": "1"})
        try:
            yield Lab(svc, gpus, agent)
        finally:
            agent.stop()


def ended(svc: Services, run_id: str, timeout_s: float = 60) -> dict[str, Any]:
    return svc.wait_for(run_id, TERMINAL, timeout_s)


def test_a_runs_gpu_hours_energy_and_utilization_are_measured_on_its_own_gpu(gpu_lab: Lab) -> None:
    svc = gpu_lab.svc
    gpu_lab.gpus.set_usage(BUSY)
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], params={"hold_s": 2}, backend=BACKEND)
    run = ended(svc, run_id)
    assert run["state"] == "succeeded", (run, gpu_lab.agent.output())
    usage = run["gpu_usage"]
    # GPU 1 only (GPU 0, drawing 400 W, is someone else's): 300 W the whole time it ran.
    assert usage["gpus"] == ["1"]
    assert 2.0 <= usage["gpu_seconds"] <= 30.0, usage
    assert usage["energy_wh"] == pytest.approx(300.0 * usage["gpu_seconds"] / 3600, rel=1e-3)
    assert usage["mean_utilization_pct"] == 87.0 and usage["peak_memory_mb"] == 30000.0
    # Sampled while it ran, not only at its start and end (how many a loaded machine fits in 2 s varies).
    assert usage["samples"] >= 3 and usage["sample_s"] == 0.2
    log = run_paths(svc, run_id).run_log.read_text()
    assert "GPU use: sampling GPU 1 every 0.2 s" in gpu_lab.agent.output()
    assert "leak guard" not in log, "nothing of the run was left to kill"
    # Where an admin looks: the run page's line, `training runs`, Potato's own record of the run.
    assert run["gpu_use"].startswith("1 GPU (1): ") and "87% busy on average, 30000 MB at most" in run["gpu_use"]
    listed = run_cli("training", "runs", svc.config)
    header, row = listed.stdout.splitlines()[0], next(line for line in listed.stdout.splitlines() if run_id in line)
    assert header.split()[-3:] == ["GPU-HOURS", "WH", "HELD-OUT"]
    figures = row[header.index("GPU-HOURS") : header.index("HELD-OUT")].split()  # columns are aligned
    assert figures == [f"{usage['gpu_seconds'] / 3600:.3g}", f"{usage['energy_wh']:.3g}"]
    from potato.training import store  # Potato's own reading of its store

    potato_run = store.load_run(potato_view(svc.config), run_id)
    assert potato_run.metrics["gpu_hours"] == pytest.approx(usage["gpu_seconds"] / 3600, abs=1e-6)
    assert (potato_run.metrics["gpu_energy_wh"], potato_run.metrics["gpu_mean_utilization_pct"]) == (
        usage["energy_wh"],
        87.0,
    )


def test_a_run_whose_gpu_idles_is_warned_then_stopped_by_the_idle_guard(gpu_lab: Lab) -> None:
    svc = gpu_lab.svc
    gpu_lab.gpus.set_usage(IDLE)
    try:
        run = ended(svc, held_run(svc, backend=BACKEND))
    finally:
        gpu_lab.gpus.set_usage(BUSY)
    assert run["state"] == "failed", run
    # How long it had idled when the agent looked (once a second): the limit, or a little more.
    said = re.match(
        r"the run's GPUs \(GPU 1\) stayed under 5% utilization for (\d+) s, past "
        r"model_training\.gpu_watch\.idle_stop_s \(6 s\): the idle guard stopped the run \(fix: make the trainer "
        r"use the GPU",
        run["error"],
    )
    assert said and IDLE_STOP_S <= int(said.group(1)) <= IDLE_STOP_S + 5, run["error"]
    log = run_paths(svc, run["run_id"]).run_log.read_text()
    warned = log.index("step: the run's GPUs (GPU 1) have been under 5% utilization for")
    assert "the idle guard stops the run at 6 s unless they get busy" in log[warned:]
    assert warned < log.index("failed: the run's GPUs"), "warned before the stop"
    assert run["gpu_usage"]["mean_utilization_pct"] == 1.0


def test_what_of_a_run_still_holds_gpu_memory_after_it_ends_is_killed_and_named(gpu_lab: Lab, tmp_path: Path) -> None:
    svc = gpu_lab.svc
    gpu_lab.gpus.set_usage(BUSY)
    run_id = held_run(svc, backend=BACKEND)
    # Its worker training, not only its agent in contact: a run cancelled before its worker starts has started
    # no process to leave behind (the agent then has no worker's group to look at, and does not look).
    wait_running(svc, run_id)
    # A process the run started that left the worker's process group (its own session), and another
    # account's process on the same GPU: both hold GPU memory.
    leftover, stranger = gpu_process(run_id, tmp_path), gpu_process(None, tmp_path)
    try:
        gpu_lab.gpus.holds(leftover.pid, 2300)
        gpu_lab.gpus.holds(stranger.pid, 5000)
        assert svc.api("POST", f"/runs/{run_id}/cancel")[0] == 200
        run = ended(svc, run_id)
        assert run["state"] == "cancelled", run
        assert leftover.wait(10) == -9, "the run's leftover was killed"
        assert stranger.poll() is None, "another account's process is never touched"
        log = run_paths(svc, run_id).run_log.read_text()
        assert (
            f"leak guard: process {leftover.pid} of the run still held 2300 MB of GPU memory after the run "
            f"ended: killed"
        ) in log
        assert str(stranger.pid) not in log
    finally:
        for proc in (leftover, stranger):
            proc.kill()
            proc.wait()
