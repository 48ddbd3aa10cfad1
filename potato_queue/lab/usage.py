"""What a run cost on its GPUs: the agent's `usage` event (agent/gpu_watch.py) as the record keeps it.

run.json's `gpu_usage` is `{gpus, gpu_seconds, energy_wh, mean_utilization_pct, peak_memory_mb, samples,
sample_s}` for a run whose GPUs the agent sampled, `{gpus: [], why}` for one it measured none of (a CPU-only
host, device cpu, a SLURM job's compute node), and absent where no agent said either (a run that never
started its worker). One home for reading it: the bounds on what an agent may send (`usage_of`), the words
(`usage_words`), and the figures Potato's run metrics and /metrics carry (`usage_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from potato_queue.bounds import MAX_LIVE_TEXT_CHARS, shortened

__all__ = ["usage_of", "usage_words", "usage_metrics", "gpu_hours", "energy_kwh", "MAX_GPUS", "NUMBERS"]

MAX_GPUS = 64
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
    return f"{len(gpus)} {label} ({', '.join(gpus)}): {', '.join(parts)}"


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
