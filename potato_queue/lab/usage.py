"""What a run cost on its GPUs: the agent's `usage` event (agent/gpu_watch.py) as the record keeps it.

run.json's `gpu_usage` is `{gpus, gpu_seconds, energy_wh, mean_utilization_pct, peak_memory_mb, samples,
sample_s}` for a run whose GPUs the agent sampled, `{gpus: [], why}` for one it measured none of (a CPU-only
host, device cpu, a SLURM job's compute node), and absent where no agent said either (a run that never
started its worker). One home for reading it: the bounds on what an agent may send (`usage_of`, and
`within_run`: what the run could have used), the words (`usage_words`), and the figures Potato's run metrics and
/metrics carry (`usage_metrics`).

A figure past what the run could use is refused, not clipped silently: GPU-seconds past the run's wall time on
its GPUs and energy past MAX_GPU_WATTS on each are replaced by that bound (the budget counts the bound: the run
did hold its GPUs that long), utilization past 100 % and memory past MAX_GPU_MEMORY_MB are left out; each
refusal is kept in `refused` (the record, the page) and said in run.log.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from potato_queue.bounds import MAX_LIVE_TEXT_CHARS, shortened

__all__ = [
    "usage_of",
    "within_run",
    "usage_words",
    "usage_metrics",
    "gpu_hours",
    "energy_kwh",
    "MAX_GPUS",
    "MAX_GPU_WATTS",
    "MAX_GPU_MEMORY_MB",
    "USAGE_SLACK_S",
    "NUMBERS",
]

MAX_GPUS = 64
# Above the power limit of any GPU made (1000 W a B200, 1400 W an MI355X): a run's energy past this many watts on
# each of its GPUs for its whole wall time was not drawn.
MAX_GPU_WATTS = 1500.0
# Above any GPU's memory (288 GB a B300): a peak past it was not measured.
MAX_GPU_MEMORY_MB = 512 * 1024
# The server's clock starts a run's wall time when it dispatches it, before the agent samples; the agent's last
# sample reaches the server a moment after it was taken. A minute covers that lag on every backend.
USAGE_SLACK_S = 60.0
MAX_REFUSED = 4  # the refusals kept in a usage record (one per figure)
NUMBERS = ("gpu_seconds", "energy_wh", "mean_utilization_pct", "peak_memory_mb", "samples", "sample_s")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def usage_of(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A `usage` event as an agent (anyone holding the run's token) may send it: known fields, bounded."""
    gpus = raw.get("gpus")
    gpus = [shortened(str(g), 40) for g in (gpus if isinstance(gpus, list) else [])[:MAX_GPUS]]
    if not gpus:
        why = raw.get("why")
        return {"gpus": [], "why": shortened(str(why), MAX_LIVE_TEXT_CHARS) if why else "no GPU was measured"}
    return {"gpus": gpus, **{name: _number(raw.get(name)) for name in NUMBERS}}


def within_run(usage: dict[str, Any], wall_s: float) -> tuple[dict[str, Any], list[str]]:
    """(the usage with each figure past what the run could use refused, the refusals in words) for a run that
    has lasted `wall_s` on the server's clock: at most its GPUs for its wall time, MAX_GPU_WATTS each, 100 %
    busy, MAX_GPU_MEMORY_MB."""
    gpus = len(usage.get("gpus") or [])
    if not gpus:
        return usage, []
    seconds = max(0.0, wall_s) + USAGE_SLACK_S
    held_s = seconds * gpus
    limits = {
        "gpu_seconds": (held_s, f"what {gpus} GPU{'s' if gpus > 1 else ''} can use in {seconds:.0f} s", True),
        "energy_wh": (held_s * MAX_GPU_WATTS / 3600, f"{MAX_GPU_WATTS:g} W on each GPU for {seconds:.0f} s", True),
        "mean_utilization_pct": (100.0, "100 %", False),
        "peak_memory_mb": (float(MAX_GPU_MEMORY_MB), "any GPU's memory", False),
    }
    out, refused = dict(usage), []
    for name, (bound, meaning, counted) in limits.items():
        value = out.get(name)
        if value is None or value <= bound:
            continue
        out[name] = round(bound, 3) if counted else None
        kept = f"the bound {bound:.6g} is counted" if counted else "it is left out"
        refused.append(f"{name} {value:.6g} is over {bound:.6g}, {meaning}: {kept}")
    if refused:
        out["refused"] = refused[:MAX_REFUSED]
    return out, refused


def gpu_hours(usage: Mapping[str, Any] | None) -> float:
    """The run's GPU-hours (0 for a run that measured none)."""
    return (_number((usage or {}).get("gpu_seconds")) or 0.0) / 3600.0


def energy_kwh(usage: Mapping[str, Any] | None) -> float:
    """The run's energy in kWh (0 where no GPU reported its power)."""
    return (_number((usage or {}).get("energy_wh")) or 0.0) / 1000.0


def usage_words(usage: Mapping[str, Any] | None) -> str:
    """`1 GPU (0): 0.52 GPU-hours, 151.3 Wh, 87% busy on average, 30720 MB at most`, or why none was measured."""
    if not usage:
        return "GPU use not reported"
    gpus = usage.get("gpus") or []
    if not gpus:
        return f"no GPU measured: {usage.get('why') or 'no GPU was measured'}"
    parts = [f"{gpu_hours(usage):.3g} GPU-hours"]
    energy = usage.get("energy_wh")
    parts.append(f"{energy:.3g} Wh" if energy is not None else "energy not reported (no power reading)")
    busy = usage.get("mean_utilization_pct")
    if busy is not None:
        parts.append(f"{busy:g}% busy on average")
    if usage.get("peak_memory_mb") is not None:
        parts.append(f"{usage['peak_memory_mb']:.0f} MB at most")
    label = "GPU" if len(gpus) == 1 else "GPUs"
    refused = usage.get("refused") or []
    said = f" (refused from the agent: {'; '.join(refused)})" if refused else ""
    return f"{len(gpus)} {label} ({', '.join(gpus)}): {', '.join(parts)}{said}"


def usage_metrics(usage: Mapping[str, Any] | None) -> dict[str, float]:
    """The figures as Potato's run metrics name them (nothing for a run that measured no GPU)."""
    if not usage or not usage.get("gpus"):
        return {}
    out = {"gpu_hours": round(gpu_hours(usage), 6)}
    if usage.get("energy_wh") is not None:
        out["gpu_energy_wh"] = float(usage["energy_wh"])
    if usage.get("mean_utilization_pct") is not None:
        out["gpu_mean_utilization_pct"] = float(usage["mean_utilization_pct"])
    return out
