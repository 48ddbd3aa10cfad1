"""Claim only with a free GPU (issue 22): an ssh run's setup and an agent wait, saying so on the run's step
line, while no GPU has min_free_gpu_mb free; a freed GPU is taken; the wait is bounded by the run's limit.

This machine has no GPU: `nvidia-smi` here is a script first on PATH that prints the CSV in a file the
test rewrites (tests/fake_gpus.py). It stands in for the GPUs, and rewriting the file is a GPU's memory being freed. Everything
else is real: Redis, the server, the executor, sshd, the bootstrap, the agent and the worker.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from potato_queue.wire.exit_codes import EXIT_BAD_SPEC
from tests.agent_helpers import BACKEND, lab, register
from tests.e2e.ssh.test_ssh_backend import BACKEND as SSH_BACKEND
from tests.e2e.ssh.test_ssh_backend import over_ssh
from tests.fake_gpus import FakeGpus, LocalAgent
from tests.lifecycle_helpers import TERMINAL, Services, run_paths, started, wait_until
from tests.sshd import ALIAS, Sshd

BUSY = "0, NVIDIA A100-SXM4-80GB, 1200, 81920, 97, 8.0\n1, NVIDIA A100-SXM4-80GB, 1500, 81920, 90, 8.0\n"
FREED = "0, NVIDIA A100-SXM4-80GB, 1200, 81920, 97, 8.0\n1, NVIDIA A100-SXM4-80GB, 70000, 81920, 3, 8.0\n"
BEST_BUSY = "GPU 1: NVIDIA A100-SXM4-80GB, 1500 of 81920 MB free"


def step_of(svc: Services, run_id: str) -> str:
    status, run = svc.api("GET", f"/runs/{run_id}")
    assert status == 200, run
    return str(run["step"])


@pytest.fixture
def ssh_services(tmp_path: Path, redis_server_url: str, sshd: Sshd) -> Iterator[Any]:
    """Makes the server and an executor whose ssh backend has the given keys; stopped after the test."""
    with ExitStack() as stack:

        def make(**backend: Any) -> Services:
            context, svc = over_ssh(tmp_path, redis_server_url, sshd, **backend)
            stack.push(context.__exit__)
            return svc

        yield make


def test_an_ssh_run_waits_for_a_gpu_with_room_says_so_and_takes_the_one_freed(
    ssh_services: Any, tmp_path: Path
) -> None:
    gpus = FakeGpus(tmp_path / "bin", BUSY)
    svc = ssh_services(env={"PATH": gpus.path}, min_free_gpu_mb=2000, setup_timeout_s=120)
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=SSH_BACKEND)
    waiting = f"waiting for a GPU with 2000 MB free on {ALIAS} (best now: {BEST_BUSY})"
    wait_until(lambda: step_of(svc, run_id) == waiting, 60, "the step line saying the run waits for a GPU")
    assert svc.api("GET", f"/runs/{run_id}")[1]["state"] == "starting", "waiting, not failed"
    gpus.set(FREED)
    run = svc.wait_for(run_id, TERMINAL, 120)
    assert run["state"] == "succeeded", (run, svc.logs())
    log = run_paths(svc, run_id).run_log.read_text()
    assert waiting in log and f"{ALIAS}: the run gets GPU 1: NVIDIA A100-SXM4-80GB, 70000 of 81920 MB free" in log


def test_an_ssh_run_that_waits_past_setup_timeout_s_fails_naming_the_limit_and_the_fixes(
    ssh_services: Any, tmp_path: Path
) -> None:
    svc = ssh_services(env={"PATH": FakeGpus(tmp_path / "bin", BUSY).path}, min_free_gpu_mb=2000, setup_timeout_s=8)
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=SSH_BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 60)
    assert run["state"] == "failed"
    assert run["error"] == (
        f"No GPU on {ALIAS} had 2000 MB free within setup_timeout_s (8 s) (at the end: {BEST_BUSY}); the run did not "
        f"start. Fix: free memory on a GPU of {ALIAS}, lower min_free_gpu_mb of backend {SSH_BACKEND}, or raise its "
        "setup_timeout_s"
    ), run["error"]


def GpuAgent(svc: Services, token: str, gpus_path: str, min_free_gpu_mb: float) -> LocalAgent:
    """`potato-queue training agent --min-free-gpu-mb MB` on this machine, its GPUs the fake ones."""
    return LocalAgent(svc, token, gpus_path, "--min-free-gpu-mb", f"{min_free_gpu_mb:g}")


@pytest.fixture
def agent_backend(tmp_path: Path, redis_server_url: str, request: pytest.FixtureRequest) -> Iterator[Services]:
    with started(tmp_path, redis_server_url, **lab(queue_timeout_s=request.param)) as svc:
        yield svc


def waiting_agent(svc: Services, gpus: FakeGpus) -> GpuAgent:
    """An agent whose GPUs are all busy, once it has told the server so."""
    agent = GpuAgent(svc, register(svc), gpus.path, 2000)
    wait_until(lambda: "waiting before asking for work" in agent.output(), 30, "the agent waiting for a GPU")
    return agent


@pytest.mark.parametrize("agent_backend", [120], indirect=True)
def test_an_agent_claims_only_once_a_gpu_has_room_and_the_run_says_why_it_waits(
    agent_backend: Services, tmp_path: Path
) -> None:
    svc, gpus = agent_backend, FakeGpus(tmp_path / "bin", BUSY)
    agent = waiting_agent(svc, gpus)
    try:
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        waiting = (
            f"waiting for the agent on {BACKEND} ({socket.gethostname()}): its GPUs have less than 2000 MB free "
            f"(best: {BEST_BUSY})"
        )
        wait_until(lambda: step_of(svc, run_id) == waiting, 30, "the step line naming the agent's GPUs")
        assert svc.api("GET", f"/runs/{run_id}")[1]["state"] == "queued", "not claimed while no GPU has room"
        gpus.set(FREED)
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded", (run, agent.output(), svc.logs())
        assert f"claimed run {run_id}" in agent.output()
        # The GPU that had room is the run's (GPU 0 is still busy): its index, in nvidia-smi's numbering.
        paths = run_paths(svc, run_id)
        assert (
            "step: the run gets GPU 1: NVIDIA A100-SXM4-80GB, 70000 of 81920 MB free, 3 % busy"
            in paths.run_log.read_text()
        )
        assert (
            "Running majority-baseline on cpu (CUDA_VISIBLE_DEVICES=1, CUDA_DEVICE_ORDER=PCI_BUS_ID)"
            in paths.events.read_text()
        )
    finally:
        agent.stop()


@pytest.mark.parametrize("agent_backend", [6], indirect=True)
def test_a_run_whose_agent_finds_no_gpu_with_room_within_queue_timeout_s_fails_saying_so(
    agent_backend: Services, tmp_path: Path
) -> None:
    svc = agent_backend
    agent = waiting_agent(svc, FakeGpus(tmp_path / "bin", BUSY))
    try:
        run = svc.wait_for(
            svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND), TERMINAL, 60
        )
        host = socket.gethostname()
        assert run["state"] == "failed"
        assert run["error"] == (
            f"No GPU of the agent on {BACKEND} ({host}) had 2000 MB free within queue_timeout_s (6 s) (at the end: "
            f"{BEST_BUSY}), so it claimed no run. Fix: free memory on a GPU of {host}, start its agent with a lower "
            f"--min-free-gpu-mb, or raise queue_timeout_s of backend {BACKEND}"
        ), run["error"]
        assert "claimed run" not in agent.output()
    finally:
        agent.stop()


@pytest.mark.parametrize("agent_backend", [120], indirect=True)
def test_an_agent_asked_to_wait_for_a_gpu_on_a_machine_without_one_does_not_start(
    agent_backend: Services, tmp_path: Path
) -> None:
    empty = tmp_path / "no-gpu-bin"
    empty.mkdir()
    agent = GpuAgent(agent_backend, register(agent_backend), f"{empty}:/usr/local/bin:/usr/bin:/bin", 2000)
    assert agent.proc.wait(60) == EXIT_BAD_SPEC
    assert (
        "--min-free-gpu-mb 2000 waits for a GPU, but there is no nvidia-smi on this machine's PATH; fix: start "
        "the agent without --min-free-gpu-mb to take runs as a CPU machine, or put nvidia-smi on PATH"
    ) in agent.output()


def test_an_ssh_runs_gpu_use_is_measured_on_the_gpu_it_was_given(
    tmp_path: Path, redis_server_url: str, sshd: Sshd
) -> None:
    """Issue 38 on the ssh backend: the bootstrap gives the run GPU 1 (the one with room), and the agent it
    starts samples that GPU alone while the worker runs."""
    gpus = FakeGpus(tmp_path / "bin", BUSY, "0, 400.0, 99, 79000\n1, 250.0, 64, 12000\n")
    gpus.set(FREED)
    context, svc = over_ssh(
        tmp_path, redis_server_url, sshd, env={"PATH": gpus.path}, training={"gpu_watch": {"sample_s": 0.2}}
    )
    with ExitStack() as stack:
        stack.push(context.__exit__)
        run_id = svc.start_run(
            trainer="majority-baseline", schemas=["sentiment"], params={"hold_s": 2}, backend=SSH_BACKEND
        )
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded", (run, svc.logs())
        usage = run["gpu_usage"]
        assert usage["gpus"] == ["1"] and usage["mean_utilization_pct"] == 64.0, usage
        assert 2.0 <= usage["gpu_seconds"] <= 60.0
        assert usage["energy_wh"] == pytest.approx(250.0 * usage["gpu_seconds"] / 3600, rel=1e-3)
        assert gpus.usage_calls() >= 3, "sampled while it ran, not only at its start and end"
