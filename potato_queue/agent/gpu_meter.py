"""A SLURM job's GPUs, measured on its compute node: `python -m potato_queue.agent.gpu_meter --out FILE`.

job.sh starts it beside the worker where the node has nvidia-smi (the agent, on the login node, cannot see
the job's GPUs) and stops it before the job's exit_code is written; the agent then reads FILE (its `usage`
event's fields: gpu_watch.py). A requeued job runs it again, and its figures are added to the earlier
spell's. Standard library only, Python 3.8+: it runs from the job's shared copy of the code.
"""

import argparse
import json
import os
import signal
import time
from typing import Any, Dict, List, Optional

from potato_queue.agent.gpu_watch import GpuWatch, run_gpus
from potato_queue.wire.files import write_atomic
from potato_queue.wire.job import GpuWatch as GpuWatchSettings

__all__ = ["checked_usage", "combine", "read_usage", "settings_of", "meter_main"]

STOP_LOOK_S = 0.1  # how soon a SIGTERM is acted on


def combine(before: Optional[Dict[str, Any]], now: Dict[str, Any]) -> Dict[str, Any]:
    """Two spells of one run's use as one (a requeued SLURM job runs its worker, and its meter, again)."""
    if not before or not before.get("gpus"):
        return now
    if not now.get("gpus"):
        return before

    def total(name: str) -> Optional[float]:
        values = [u.get(name) for u in (before, now) if u.get(name) is not None]
        return round(sum(values), 6) if values else None

    weighted = [(u.get("mean_utilization_pct"), u.get("samples") or 0) for u in (before, now)]
    weights = sum(n for mean, n in weighted if mean is not None)
    peaks = [u["peak_memory_mb"] for u in (before, now) if u.get("peak_memory_mb") is not None]
    return {
        "gpus": sorted(set(before["gpus"]) | set(now["gpus"])),
        "gpu_seconds": total("gpu_seconds"),
        "energy_wh": total("energy_wh"),
        "mean_utilization_pct": round(sum(m * n for m, n in weighted if m is not None) / weights, 1)
        if weights
        else None,
        "peak_memory_mb": max(peaks) if peaks else None,
        "samples": (before.get("samples") or 0) + (now.get("samples") or 0),
        "sample_s": now.get("sample_s"),
    }


# What a meter writes, and nothing else is taken from the file: the run's own trainer can write the job
# folder, so a key or a value of another shape is a word of why nothing was measured, never an exception.
_FIGURES = ("gpu_seconds", "energy_wh", "mean_utilization_pct", "peak_memory_mb", "samples", "sample_s", "idle_s")
_MAX_GPUS = 64
_MAX_WHY = 500


def _figure_problem(name: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        return "{} is {!r}, not a number of 0 or more".format(name, value)
    return None


def checked_usage(found: Any) -> Optional[Dict[str, Any]]:
    """A meter file's figures, its known keys only; where one is of another shape, no figures and why."""
    if not isinstance(found, dict):
        return None
    gpus, why = found.get("gpus"), found.get("why")
    problem = None
    if (
        not isinstance(gpus, list)
        or len(gpus) > _MAX_GPUS
        or not all(isinstance(g, (int, str)) and not isinstance(g, bool) for g in gpus)
    ):
        problem = "gpus is {!r}, not a list of GPUs".format(gpus)[:_MAX_WHY]
    elif why is not None and not isinstance(why, str):
        problem = "why is {!r}, not text".format(why)[:_MAX_WHY]
    problem = problem or next((p for p in (_figure_problem(n, found.get(n)) for n in _FIGURES) if p), None)
    if problem is not None:
        return {
            "gpus": [],
            "why": "the GPU meter's file held figures of another shape ({}): none counted".format(problem),
        }
    usage = {name: found[name] for name in ("gpus", *_FIGURES) if name in found}
    if why is not None:
        usage["why"] = why[:_MAX_WHY]
    return usage


def read_usage(path: str) -> Optional[Dict[str, Any]]:
    """What a meter wrote to `path` (checked_usage); None when it wrote nothing (or nothing whole)."""
    try:
        with open(path, encoding="utf-8") as fh:
            found = json.load(fh)
    except (OSError, ValueError):
        return None
    return checked_usage(found)


def _write_usage(path: str, usage: Dict[str, Any]) -> None:
    write_atomic(path, json.dumps(usage), durable=False)  # whole: the agent may read it at any moment


def settings_of(spec_path: Optional[str]) -> "tuple[GpuWatchSettings, str]":
    """The run's gpu_watch and its device (`limits.device`) from its spec.json; the defaults where it names
    none."""
    try:
        with open(spec_path or "", encoding="utf-8") as fh:
            spec = json.load(fh)
        settings = GpuWatchSettings.from_dict(spec.get("gpu_watch") or {})
        return settings, str((spec.get("limits") or {}).get("device") or "auto")
    except (OSError, ValueError, TypeError, AttributeError):
        return GpuWatchSettings(), "auto"


def meter_main(argv: Optional[List[str]] = None) -> int:
    """`python -m potato_queue.agent.gpu_meter --out FILE [--spec spec.json] [--ready FILE]`: a SLURM job's GPUs sampled on
    its compute node, beside its worker, until SIGTERM (job.sh's, or scancel's): the usage so far written to
    FILE after each sample (with `idle_s`, for the agent's idle guard) and at the end, added to what an
    earlier spell of the same job wrote there."""
    parser = argparse.ArgumentParser(prog="python -m potato_queue.agent.gpu_meter")
    parser.add_argument("--out", required=True)
    parser.add_argument("--spec", help="the run's spec.json: its gpu_watch (sample_s, idle_utilization_pct)")
    parser.add_argument("--ready", help="created once a SIGTERM would be heard (job.sh waits for it to stop it)")
    args = parser.parse_args(argv)
    stopped = []  # type: List[int]
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Only a flag: a handler that took a lock the interrupted code holds would never return.
        signal.signal(signum, lambda signum, _frame: stopped.append(signum))
    if args.ready:
        # Before this, a SIGTERM would kill the meter with nothing written: a worker that ends within the
        # meter's own start would leave no figures (seen on two loaded cores).
        os.close(os.open(args.ready, os.O_WRONLY | os.O_CREAT, 0o600))
    (settings, device), before = settings_of(args.spec), read_usage(args.out)
    indexes, why = run_gpus(device, None)
    if not indexes:
        _write_usage(args.out, combine(before, {"gpus": [], "why": why}))
        return 0
    watch = GpuWatch(indexes, None, settings).start()
    next_write_s = time.monotonic() + settings.sample_s
    while not stopped:
        time.sleep(STOP_LOOK_S)
        if time.monotonic() >= next_write_s:
            next_write_s += settings.sample_s
            idle_s = round(watch.meter.idle_s(time.monotonic()), 3)
            _write_usage(args.out, dict(combine(before, watch.usage()), idle_s=idle_s))
    _write_usage(args.out, combine(before, watch.stop()))
    return 0


if __name__ == "__main__":
    raise SystemExit(meter_main())
