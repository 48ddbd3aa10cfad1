"""The project's monthly caps on GPU-hours and energy (model_training.budget), as pure arithmetic on records.

A cap is the project's (every backend's runs) or one backend's, per calendar month in UTC. What a month has
used is its runs' measured use (lab/usage.py), a run in flight counting what it has used so far. A new run
is refused before it starts when used + its estimate would pass a cap; its estimate is the mean of the last
runs of its trainer on its backend that reported their use in the last ESTIMATE_MONTHS months, or, with none,
max_wall_seconds on one GPU (energy then has no estimate: no run has said what this trainer draws). A run whose
use is past max_wall_seconds on its GPUs is left out of an estimate (an outlier, or a figure from before the
bounds). A run whose use the admin struck (`usage_struck`: `training budget --strike`) counts nothing.
runs/budget.py reads the records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from potato_queue.config import BudgetConfig
from potato_queue.lab.usage import energy_kwh, gpu_hours
from potato_queue.run import FINAL_STATES

__all__ = [
    "Cap",
    "Estimate",
    "caps",
    "month_of",
    "month_words",
    "used",
    "estimate",
    "held",
    "over",
    "standing",
    "counted",
    "estimate_since",
    "ESTIMATE_RUNS",
    "ESTIMATE_MONTHS",
]

ESTIMATE_RUNS = 5  # the last this many measured runs of a trainer on a backend make its estimate
ESTIMATE_MONTHS = 3  # ... of this month and the two before: a trainer's older runs say little of it today
UNITS = {"gpu_hours": "GPU-hours", "kwh": "kWh"}


@dataclass(frozen=True)
class Cap:
    unit: str  # "gpu_hours" or "kwh"
    limit: float
    backend: str | None  # None: the project's, every backend's runs

    @property
    def key(self) -> str:
        scope = "budget" if self.backend is None else f"budget.backends.{self.backend}"
        return f"model_training.{scope}.{self.unit}_per_month"

    def scope_words(self) -> str:
        return "the project" if self.backend is None else f"backend {self.backend}"


@dataclass(frozen=True)
class Estimate:
    gpu_hours: float
    kwh: float
    basis: str  # what it was worked out from, in words

    def of(self, unit: str) -> float:
        return self.gpu_hours if unit == "gpu_hours" else self.kwh


def caps(budget: BudgetConfig) -> list[Cap]:
    """Every cap the config sets."""
    found = []
    for backend, limits in [(None, budget), *budget.backends.items()]:
        if limits.gpu_hours_per_month is not None:
            found.append(Cap("gpu_hours", limits.gpu_hours_per_month, backend))
        if limits.kwh_per_month is not None:
            found.append(Cap("kwh", limits.kwh_per_month, backend))
    return found


def month_of(now_s: float) -> str:
    """`2026-12`: the calendar month (UTC) an instant is in."""
    return datetime.fromtimestamp(now_s, timezone.utc).strftime("%Y-%m")


def month_words(month: str) -> str:
    """`December 2026`."""
    return datetime.strptime(month, "%Y-%m").strftime("%B %Y")


def estimate_since(month: str) -> str:
    """`20261001`: the first day of the oldest month an estimate reads runs of (a run id starts with its date)."""
    year, number = (int(part) for part in month.split("-"))
    index = year * 12 + number - 1 - (ESTIMATE_MONTHS - 1)
    return f"{index // 12:04d}{index % 12 + 1:02d}01"


def counted(record: Mapping[str, Any]) -> bool:
    """Whether the run's use counts toward a budget: not when the admin struck it."""
    return not record.get("usage_struck")


def _amount(unit: str, usage: Mapping[str, Any] | None) -> float:
    return gpu_hours(usage) if unit == "gpu_hours" else energy_kwh(usage)


def _plausible(usage: Mapping[str, Any], max_wall_s: float | None) -> bool:
    """A run's use an estimate may learn from: at most max_wall_seconds on its GPUs (no bound without it)."""
    return not max_wall_s or gpu_hours(usage) <= max_wall_s * max(1, len(usage.get("gpus") or [])) / 3600


def used(cap: Cap, month_records: Iterable[Mapping[str, Any]]) -> float:
    """What the month's runs in the cap's scope used of its unit."""
    return sum(
        _amount(cap.unit, r.get("gpu_usage"))
        for r in month_records
        if (cap.backend is None or r.get("backend") == cap.backend) and counted(r)
    )


def estimate(recent: Iterable[Mapping[str, Any]], trainer: str, backend: str, max_wall_s: float | None) -> Estimate:
    """A new run's use, from the newest-first `recent` records (ESTIMATE_MONTHS' worth: runs/budget.py): the
    ended runs of its trainer on its backend that reported a plausible use (a run in flight has used only part
    of its)."""
    measured = [
        r["gpu_usage"]
        for r in recent
        if r.get("trainer") == trainer
        and r.get("backend") == backend
        and r.get("state") in FINAL_STATES
        and isinstance(r.get("gpu_usage"), Mapping)
        and counted(r)
        and _plausible(r["gpu_usage"], max_wall_s)
    ][:ESTIMATE_RUNS]
    if measured:
        n = len(measured)
        return Estimate(
            sum(gpu_hours(u) for u in measured) / n,
            sum(energy_kwh(u) for u in measured) / n,
            f"the mean of the last {n} {trainer} run{'s' if n > 1 else ''} on {backend}",
        )
    if max_wall_s:
        return Estimate(
            max_wall_s / 3600,
            0.0,
            f"max_wall_seconds ({max_wall_s:g} s) on one GPU: no {trainer} run on {backend} reported its use yet",
        )
    return Estimate(
        0.0, 0.0, f"nothing: no {trainer} run on {backend} reported its use yet, and max_wall_seconds is not set"
    )


def held(
    cap: Cap, month_records: Sequence[Mapping[str, Any]], recent: Sequence[Mapping[str, Any]], max_wall_s: float | None
) -> tuple[float, int]:
    """(what the month's runs not yet ended will still use of the cap's unit, by their estimates less what they
    used so far; how many they are): a burst of submissions cannot all pass a cap that has room for one."""
    total, count = 0.0, 0
    for r in month_records:
        if r.get("state") in FINAL_STATES or (cap.backend is not None and r.get("backend") != cap.backend):
            continue
        if not counted(r):
            continue
        guess = estimate(recent, str(r.get("trainer")), str(r.get("backend")), max_wall_s).of(cap.unit)
        total += max(0.0, guess - _amount(cap.unit, r.get("gpu_usage")))
        count += 1
    return total, count


def over(
    all_caps: list[Cap],
    month_records: Sequence[Mapping[str, Any]],
    recent: Sequence[Mapping[str, Any]],
    max_wall_s: float | None,
    new_run: tuple[str, str],
    month: str,
) -> tuple[str, str] | None:
    """(what is wrong, the fix) for the first cap the new run (trainer, backend) would pass; None when it fits."""
    trainer, backend = new_run
    guess = estimate(recent, trainer, backend, max_wall_s)
    for cap in all_caps:
        if cap.backend not in (None, backend):
            continue
        spent, unit = used(cap, month_records), UNITS[cap.unit]
        holding, runs = held(cap, month_records, recent, max_wall_s)
        if spent + holding + guess.of(cap.unit) <= cap.limit:
            continue
        still = f", {holding:.3g} more held by {runs} run{'s' if runs > 1 else ''} not ended" if runs else ""
        message = (
            f"The run would pass the {unit} budget of {cap.scope_words()} for {month_words(month)}: {spent:.3g} of "
            f"{cap.limit:g} {unit} used{still}, and this run is estimated at {guess.of(cap.unit):.3g} {unit} "
            f"({guess.basis})"
        )
        fix = f"raise {cap.key}, wait for next month, or run on a backend with room left"
        return message, fix
    return None


def standing(all_caps: list[Cap], month_records: Sequence[Mapping[str, Any]], month: str) -> list[dict[str, Any]]:
    """Each cap with what the month used and what is left (the page, the API, `training check`)."""
    out = []
    for cap in all_caps:
        spent = used(cap, month_records)
        unit = UNITS[cap.unit]
        out.append(
            {
                "scope": cap.backend or "project",
                "unit": cap.unit,
                "limit": cap.limit,
                "used": round(spent, 6),
                "left": round(max(0.0, cap.limit - spent), 6),
                "said": f"{cap.scope_words()}: {spent:.3g} of {cap.limit:g} {unit} used in {month_words(month)}, "
                f"{max(0.0, cap.limit - spent):.3g} left",
            }
        )
    return out
