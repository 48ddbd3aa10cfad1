"""The monthly budget read from the run store: refuse a run that would pass a cap (before it is created), and
what each cap has used and has left (the page, the API, `training check`). The arithmetic is lab/budget.py's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import redis

from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict, Invalid
from potato_queue.lab.budget import caps, estimate_since, month_of, month_words, over, standing
from potato_queue.lab.usage import energy_kwh, gpu_hours
from potato_queue.run import FINAL_STATES, RunRecord
from potato_queue.store import RunStore
from potato_queue.store.lease import LEASE_TTL_S
from potato_queue.store.records import epoch_of, utc_now

__all__ = ["check_budget", "budget_checked", "budget_standing", "strike_usage", "RECENT_RUNS", "MAX_REASON_CHARS"]

# The newest runs an estimate looks through for its trainer's on its backend.
RECENT_RUNS = 200
MAX_REASON_CHARS = 500  # why a run's use was struck: a sentence, kept in its record


def _records(store: RunStore, ids: list[str]) -> list[RunRecord]:
    """The records, with the use so far of those in flight (Redis); run.json alone while Redis is away."""
    records = []
    for run_id in ids:
        try:
            try:
                records.append(store.get(run_id))
            except redis.RedisError:
                records.append(store.read(run_id))
        except (KeyError, OSError, ValueError, TypeError):
            continue  # a record that cannot be read counts nothing (the runs list shows it broken)
    return records


def _month(store: RunStore) -> tuple[str, list[str], list[str]]:
    """(the month, its run ids, the newest run ids of the months an estimate reads, newest first): a run id
    starts with its UTC date."""
    month = month_of(store.clock.now_s())
    ids, since = store.run_ids(), estimate_since(month)
    recent = [i for i in ids[-RECENT_RUNS:] if i[:8] >= since]
    return month, [i for i in ids if i.startswith(month.replace("-", ""))], list(reversed(recent))


def _month_and_recent(store: RunStore) -> tuple[str, list[RunRecord], list[RunRecord]]:
    """(the month, its records, the newest records): each run.json read once, though most runs are in both."""
    month, month_ids, recent_ids = _month(store)
    read = {r["run_id"]: r for r in _records(store, list(dict.fromkeys(month_ids + recent_ids)))}
    return month, [read[i] for i in month_ids if i in read], [read[i] for i in recent_ids if i in read]


def check_budget(config: ProjectConfig, store: RunStore, trainer: str, backend: str) -> None:
    """Conflict (409, exit 1) naming the cap, its figures and the fix when this run would pass one."""
    all_caps = caps(config.model_training.budget)
    if not all_caps:
        return
    month, month_records, recent = _month_and_recent(store)
    max_wall_s = config.model_training.max_wall_seconds
    refused = over(all_caps, month_records, recent, max_wall_s, (trainer, backend), month)
    if refused is not None:
        raise Conflict(refused[0], fix=refused[1])


@contextlib.contextmanager
def budget_checked(
    config: ProjectConfig, store: RunStore, trainer: str, backend: str, wait_s: float = LEASE_TTL_S + 1.0
) -> Iterator[None]:
    """check_budget, then the block (which writes the run's record) under the project's budget lock: the
    server's, the CLI's and auto-retrain's submissions are checked one at a time, each seeing the runs the
    others wrote, so a burst cannot all fit a cap that has room for one. No lock without a cap."""
    if not caps(config.model_training.budget):
        yield
        return
    lease = store.budget_lease()
    # A holder that died lets go within LEASE_TTL_S: the default wait outlasts it, so a refusal means a
    # holder still alive but stalled (or Redis itself).
    if not lease.take_within(wait_s):
        raise Conflict(
            f"Another submission held the budget's lock for over {wait_s:g} s, so this run's budget "
            "could not be checked",
            fix="submit the run again; if this repeats, check that Redis answers (potato-queue training check)",
        )
    try:
        check_budget(config, store, trainer, backend)
        yield
    finally:
        lease.release()


def budget_standing(config: ProjectConfig, store: RunStore) -> dict[str, Any]:
    """`{month, caps: [{scope, unit, limit, used, left, said}]}`; no caps when the project sets none."""
    all_caps = caps(config.model_training.budget)
    if not all_caps:
        return {"month": None, "caps": []}
    month, month_ids, _ = _month(store)
    return {"month": month, "caps": standing(all_caps, _records(store, month_ids), month)}


def strike_usage(store: RunStore, record: RunRecord, reason: str) -> dict[str, Any]:
    """Strike an ended run's GPU use from every budget (the admin's word that it was not real use: a host that
    sent figures no run could use, a test), said in its record (`usage_struck`) and run.log. Invalid for no
    reason; Conflict for a run not ended or struck already."""
    run_id, reason = record["run_id"], " ".join(reason.split())
    if not reason or len(reason) > MAX_REASON_CHARS:
        raise Invalid(
            f"A strike needs its reason, in at most {MAX_REASON_CHARS} characters (got {len(reason)})",
            fix='say why, e.g. --reason "the host sent figures no run could use"',
        )
    if record["state"] not in FINAL_STATES:
        raise Conflict(
            f"Run {run_id} is {record['state']}: only an ended run's use can be struck",
            fix=f"wait for it to end, or cancel it (potato-queue training cancel {run_id}), then strike it",
        )
    if record.get("usage_struck"):
        raise Conflict(
            f"Run {run_id}'s GPU use was struck already, at {record['usage_struck']['at']}: "
            f"{record['usage_struck']['reason']}",
            fix="nothing to do: it counts toward no budget",
        )
    usage = record.get("gpu_usage")
    struck = {
        "at": utc_now(store.clock),
        "reason": reason,
        "gpu_hours": round(gpu_hours(usage), 6),
        "kwh": round(energy_kwh(usage), 6),
    }
    store.update(run_id, usage_struck=struck)
    month = month_words(month_of(epoch_of(record["created_at"]) or store.clock.now_s()))  # the month it counted in
    store.log(
        run_id,
        f"the run's GPU use ({struck['gpu_hours']:.3g} GPU-hours, {struck['kwh']:.3g} kWh) was struck from "
        f"the budget of {month}: {reason}",
    )
    return struck
