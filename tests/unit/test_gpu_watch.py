"""A run's GPU use, its idle guard and its leak guard, as pure parts: nvidia-smi's answers (scripted here, as
real drivers print them: this machine has no GPU), the meter's integration on times the test hands in, and
which processes holding GPU memory are a run's (real processes, started by the test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from potato_queue.agent.gpu_watch import GpuWatch, UsageMeter, idle_verdict, leftovers
from potato_queue.host.nvidia_smi import GpuApp, GpuSample, parse_apps, parse_usage
from potato_queue.lab.usage import gpu_hours, usage_metrics, usage_of, usage_words, within_run
from potato_queue.store.potato_ledger import potato_metrics
from potato_queue.wire.job import GpuWatch as Settings
from potato_queue.wire.job import Job

pytestmark = pytest.mark.unit

# nvidia-smi --query-gpu=index,power.draw,utilization.gpu,memory.used --format=csv,noheader,nounits, as an
# A100 and an older card without power readings print it.
USAGE = "0, 287.45, 93, 30512\n1, [N/A], 0, 4\n"
APPS = "31337, 30500\n4242, [N/A]\n"


def test_nvidia_smi_usage_and_process_lists_are_read_as_drivers_print_them() -> None:
    assert parse_usage(USAGE) == [GpuSample(0, 287.45, 93.0, 30512.0), GpuSample(1, None, 0.0, 4.0)]
    assert parse_usage("No devices were found\n\n") == []
    assert parse_apps(APPS) == [GpuApp(31337, 30500.0), GpuApp(4242, None)]
    assert parse_apps("No running processes found\n") == []


def test_the_meter_integrates_power_over_the_whole_run_and_counts_gpu_seconds_per_gpu() -> None:
    meter = UsageMeter([0, 1], start_s=100.0, idle_floor_pct=5)
    # Power held from the run's start to the first sample, trapezoids between samples, the last held to the end.
    meter.add(110.0, [GpuSample(0, 200.0, 90, 1000), GpuSample(1, 100.0, 10, 500), GpuSample(2, 999.0, 99, 9)])
    meter.add(130.0, [GpuSample(0, 300.0, 70, 3000), GpuSample(1, 100.0, 30, 500)])
    usage = meter.summary(end_s=136.0, sample_s=10)
    gpu0 = 10 * 200 + 20 * 250 + 6 * 300  # watt-seconds
    gpu1 = 36 * 100
    assert usage["energy_wh"] == pytest.approx((gpu0 + gpu1) / 3600, abs=1e-4)
    assert usage["gpu_seconds"] == 72.0  # 36 s, two GPUs; GPU 2 is not the run's
    assert usage["mean_utilization_pct"] == 50.0
    assert usage["peak_memory_mb"] == 3500.0
    assert usage["gpus"] == ["0", "1"] and usage["samples"] == 2


def test_a_gpu_that_reports_no_power_has_no_energy_rather_than_an_invented_one() -> None:
    meter = UsageMeter([1], start_s=0.0, idle_floor_pct=5)
    meter.add(5.0, parse_usage(USAGE))
    usage = meter.summary(end_s=10.0, sample_s=5)
    assert usage["energy_wh"] is None and usage["gpu_seconds"] == 10.0
    assert (
        usage_words(usage_of(usage))
        == "1 GPU (1): 0.00278 GPU-hours, energy not reported (no power reading), 0% busy on average, 4 MB at most"
    )


def test_idle_time_counts_from_the_last_busy_sample_and_a_gpu_that_cannot_tell_is_never_idle() -> None:
    meter = UsageMeter([0], start_s=0.0, idle_floor_pct=5)
    assert meter.idle_s(600.0) == 0.0, "no sample yet: not known to be idle"
    meter.add(10.0, [GpuSample(0, 60.0, 2, 100)])
    assert meter.idle_s(20.0) == 20.0  # under the floor since the start
    meter.add(30.0, [GpuSample(0, 250.0, 80, 100)])
    meter.add(40.0, [GpuSample(0, 60.0, 4, 100)])
    assert meter.idle_s(50.0) == 20.0
    meter.add(60.0, [GpuSample(0, None, None, None)])  # [N/A]: not known to be idle
    assert meter.idle_s(60.0) == 0.0


def test_the_idle_guard_warns_once_at_half_its_time_then_stops_with_the_figures() -> None:
    settings = Settings(sample_s=1, idle_utilization_pct=5, idle_stop_s=60)
    warning, stop, warned = idle_verdict(["0"], 31.0, settings, False)
    assert stop is None and warned and warning is not None
    assert warning.startswith("the run's GPUs (GPU 0) have been under 5% utilization for 31 s: the idle guard")
    assert idle_verdict(["0"], 45.0, settings, warned) == (None, None, True), "warned once"
    warning, stop, _ = idle_verdict(["0"], 61.0, settings, warned)
    assert warning is None and stop == (
        "the run's GPUs (GPU 0) stayed under 5% utilization for 61 s, past model_training.gpu_watch.idle_stop_s "
        "(60 s): the idle guard stopped the run"
    )
    assert idle_verdict(["0"], 2.0, settings, True) == (None, None, False), "busy again: a later idle spell warns"
    # The watch keeps that state between its looks (on the real clock: no exact figures here).
    watch = GpuWatch([0], None, settings)
    watch.meter.add(watch.meter.start_s, [GpuSample(0, 60.0, 1, 100)])
    watch.meter.busy_at_s -= 31  # idle for 31 s already
    warning, stop = watch.idle_check()
    assert stop is None and warning is not None
    assert watch.idle_check() == (None, None), "warned once"
    watch.meter.busy_at_s -= 30
    assert watch.idle_check()[1] is not None
    off = GpuWatch([0], None, Settings(idle_stop_s=None))
    off.meter.add(off.meter.start_s, [GpuSample(0, 60.0, 1, 100)])
    off.meter.busy_at_s -= 10_000
    assert off.idle_check() == (None, None), "off by default"


def test_a_cpu_only_run_says_so_instead_of_a_figure() -> None:
    watch = GpuWatch([], "no nvidia-smi on lab1's PATH: a CPU-only host", Settings()).start()
    usage = usage_of(watch.stop())
    assert usage == {"gpus": [], "why": "no nvidia-smi on lab1's PATH: a CPU-only host"}
    assert usage_words(usage) == "no GPU measured: no nvidia-smi on lab1's PATH: a CPU-only host"
    assert usage_metrics(usage) == {}


def test_what_an_agent_sends_is_bounded_and_reaches_potatos_run_metrics() -> None:
    sent = {"gpus": ["0"] * 500, "gpu_seconds": 7200.0, "energy_wh": float("nan"), "samples": -3, "x": "y"}
    usage = usage_of(sent)
    assert len(usage["gpus"]) == 64 and "x" not in usage
    assert usage["energy_wh"] is None and usage["samples"] is None  # NaN and negatives are no figures
    record = {
        "metrics": {"train/loss": 0.5},
        "gpu_usage": {"gpus": ["0"], "gpu_seconds": 5400.0, "energy_wh": 420.5, "mean_utilization_pct": 81.0},
    }
    assert potato_metrics(record) == {
        "train_loss": 0.5,
        "gpu_hours": 1.5,
        "gpu_energy_wh": 420.5,
        "gpu_mean_utilization_pct": 81.0,
    }


def test_a_job_from_a_server_without_the_gpu_watch_gets_its_defaults() -> None:
    job = Job.from_dict(
        {
            "run_id": "r1",
            "trainer": "t",
            "schemas": ["s"],
            "bundle": {"bytes": 1, "sha256": "x"},
            "heartbeat_interval_s": 10,
            "max_predictions_bytes": 1,
        }
    )
    assert job.gpu_watch == Settings(sample_s=10.0, idle_utilization_pct=5.0, idle_stop_s=None, leak_guard=True)
    sent = Job.from_dict({**job.to_dict(), "gpu_watch": {"sample_s": 2, "idle_stop_s": 600}})
    assert sent.gpu_watch.sample_s == 2.0 and sent.gpu_watch.idle_stop_s == 600.0


def test_only_the_runs_processes_are_leftovers_never_another_accounts_or_runs(tmp_path: Path) -> None:
    def sleeper(env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            env={"PATH": "/usr/bin:/bin", **env},
            cwd=tmp_path,
            start_new_session=True,
        )

    ours, other_run, stranger = (
        sleeper({"POTATO_QUEUE_RUN_ID": "run-a"}),
        sleeper({"POTATO_QUEUE_RUN_ID": "run-ab"}),
        sleeper({}),
    )
    group = sleeper({})  # in the worker's process group: stands for the worker's own
    try:
        apps = [GpuApp(p.pid, 100.0) for p in (ours, other_run, stranger, group)] + [GpuApp(1, 5.0)]
        found = leftovers(apps, "run-a", os.getpgid(group.pid))
        assert [app.pid for app in found] == [ours.pid, group.pid]
    finally:
        for proc in (ours, other_run, stranger, group):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ({"gpus": [0], "idle_s": "abc"}, "idle_s is 'abc', not a number of 0 or more"),
        ({"gpus": 5, "idle_s": 3}, "gpus is 5, not a list of GPUs"),
        ({"gpus": [0], "gpu_seconds": float("nan")}, "gpu_seconds is nan, not a number of 0 or more"),
        ({"gpus": [0], "why": {"x": 1}}, "why is {'x': 1}, not text"),
    ],
    ids=["idle-text", "gpus-number", "nan", "why-object"],
)
def test_a_malformed_meter_file_is_a_reason_for_no_figures_never_an_exception_in_the_watch(
    tmp_path: Path, written: dict[str, object], said: str
) -> None:
    """The SLURM node's gpu_usage.json is in the job folder, which the run's own trainer can write."""
    import json as json_module

    from potato_queue.agent.gpu_meter import read_usage

    path = tmp_path / "gpu_usage.json"
    path.write_text(json_module.dumps(written))
    settings = Settings(idle_stop_s=10.0)
    watch = GpuWatch([], "cpu", settings, remote=lambda: read_usage(str(path))).start()
    assert watch.idle_check() == (None, None)
    usage = watch.stop()
    assert (
        usage["gpus"] == []
        and usage["why"] == f"the GPU meter's file held figures of another shape ({said}): none counted"
    )


def test_a_meter_files_unknown_keys_are_left_out(tmp_path: Path) -> None:
    from potato_queue.agent.gpu_meter import checked_usage

    found = checked_usage({"gpus": [0], "gpu_seconds": 12.5, "kind": "forged", "event": "result"})
    assert found == {"gpus": [0], "gpu_seconds": 12.5}


def test_use_past_what_the_run_could_use_is_refused_and_the_bound_counted() -> None:
    """Issue 51: an agent's figures past its run's wall time on its GPUs (and 100 %, any GPU's memory) are
    refused, each named; the budget then counts the bound, never 1e308."""
    sent = {"gpus": ["0", "1"], "gpu_seconds": 1e308, "energy_wh": 50.0, "mean_utilization_pct": 400.0}
    usage, refused = within_run(usage_of({**sent, "peak_memory_mb": -1.0, "samples": 3}), wall_s=540.0)
    assert usage["gpu_seconds"] == 1200.0  # two GPUs for 540 s and the minute's slack
    assert usage["energy_wh"] == 50.0 and usage["mean_utilization_pct"] is None
    assert usage["peak_memory_mb"] is None  # negative: not a figure at all (usage_of)
    assert refused == [
        "gpu_seconds 1e+308 is over 1200, what 2 GPUs can use in 600 s: the bound 1200 is counted",
        "mean_utilization_pct 400 is over 100, 100 %: it is left out",
    ]
    assert usage["refused"] == refused and gpu_hours(usage) == pytest.approx(1 / 3)
    assert "refused from the agent: gpu_seconds 1e+308" in usage_words(usage)
    honest = {"gpus": ["0"], "gpu_seconds": 500.0, "energy_wh": 40.0, "mean_utilization_pct": 90.0}
    assert within_run(usage_of(honest), wall_s=500.0) == ({**usage_of(honest)}, [])
    no_gpu = usage_of({"gpus": [], "why": "CPU only", "gpu_seconds": 1e308})
    assert within_run(no_gpu, wall_s=0.0) == (no_gpu, [])
