"""Auto-retrain (API-5): on each beat tick, start a run once enough new annotations have arrived.

decide() is pure: the settings, the annotation count, the baseline, what is
in flight and the time in; a start or the reason to wait out. check() does one
tick under a Redis lock (two beat processes, or two executors taking their
ticks, start one run), counts the annotations from the project's files, and
keeps the baseline in `training/auto_retrain.json`: Potato 2.12 keeps it in
memory, so every restart of its server retrained at once. The last check's
outcome is kept in Redis for `training runs`, the API and the page.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from potato_queue.bundle import count_annotations
from potato_queue.config import AutoRetrainConfig, ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.potato_hook import TRAINER_NAME as POTATO_SCHEDULES
from potato_queue.runs.kinds import trainable_schemas
from potato_queue.runs.submit import start_run
from potato_queue.store import RunStore
from potato_queue.store.keys import retrain_state_path
from potato_queue.store.records import write_json_atomic

__all__ = ["Baseline", "Decision", "decide", "check", "last_check", "AUTO_TRIGGER"]

AUTO_TRIGGER = "auto"


@dataclass(frozen=True)
class Baseline:
    """What the last auto run started from (auto_retrain.json)."""

    annotations: int = 0
    run_id: str | None = None
    started_s: float | None = None


@dataclass(frozen=True)
class Decision:
    start: bool
    reason: str
    annotations: int
    new_annotations: int


def decide(
    settings: AutoRetrainConfig, annotations: int, baseline: Baseline, busy: tuple[str, str] | None, now_s: float
) -> Decision:
    """Start a run, or say what auto-retrain is waiting for."""
    new = max(0, annotations - baseline.annotations)

    def wait(reason: str) -> Decision:
        return Decision(False, reason, annotations, new)

    if not settings.enabled:
        return wait("auto-retrain is off (model_training.auto_retrain.enabled)")
    if busy is not None:
        return wait(f"run {busy[0]} is {busy[1]}; auto-retrain waits until it ends")
    if new < settings.update_frequency:
        return wait(
            f"waiting for {settings.update_frequency - new} more annotations "
            f"({new} of {settings.update_frequency} since the last auto run)"
        )
    if baseline.started_s is not None and now_s - baseline.started_s < settings.min_interval_s:
        left_s = settings.min_interval_s - (now_s - baseline.started_s)
        return wait(
            f"waiting {left_s:.0f} s more: min_interval_s is {settings.min_interval_s:g} s since the last "
            f"auto run ({baseline.run_id}); {new} new annotations are ready"
        )
    since = "since the last auto run" if baseline.run_id else "and no auto run yet"
    return Decision(True, f"{new} new annotations {since}", annotations, new)


def read_baseline(config: ProjectConfig) -> Baseline:
    try:
        data = json.loads(retrain_state_path(config).read_text(encoding="utf-8"))
        return Baseline(int(data["annotations"]), data.get("run_id"), data.get("started_s"))
    except FileNotFoundError:
        return Baseline()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PotatoQueueError(
            f"{retrain_state_path(config)} cannot be read ({exc})",
            fix="delete it: the next check then counts every annotation as new",
        ) from None


def check(
    config: ProjectConfig, store: RunStore, enqueue: Callable[[str], None], now_s: float | None = None
) -> Decision | None:
    """One beat tick; None when another check holds the lock (it decides for both)."""
    lock = store.retrain.check_lock()
    if not lock.try_take():
        return None
    try:
        decision = _check_locked(config, store, enqueue, store.clock.now_s() if now_s is None else now_s)
    except PotatoQueueError as exc:
        decision = Decision(
            False, f"auto-retrain did not start a run: {exc.message}" + (f" (fix: {exc.fix})" if exc.fix else ""), 0, 0
        )
    finally:
        lock.release()
    store.retrain.record_check(decision.reason, decision.annotations)
    return decision


def _check_locked(config: ProjectConfig, store: RunStore, enqueue: Callable[[str], None], now_s: float) -> Decision:
    settings = config.model_training.auto_retrain
    if not settings.enabled:
        return decide(settings, 0, Baseline(), None, now_s)
    schemas = settings.schemas or trainable_schemas(config, str(settings.trainer))
    annotations = count_annotations(config, schemas)
    baseline = read_baseline(config)
    unfinished = store.index.unfinished()
    decision = decide(settings, annotations, baseline, unfinished[0] if unfinished else None, now_s)
    if not decision.start:
        return decision
    record = start_run(
        config,
        store,
        enqueue,
        trainer=str(settings.trainer),
        schemas=schemas,
        backend=config.model_training.retrain_backend,
        params=settings.params,
        trigger=AUTO_TRIGGER,
    )
    # The baseline moves when the run is queued: a failed auto run waits for update_frequency new
    # annotations again, rather than retrying on every tick.
    write_json_atomic(retrain_state_path(config), asdict(Baseline(annotations, record["run_id"], now_s)))
    return Decision(True, f"started {record['run_id']}: {decision.reason}", annotations, decision.new_annotations)


def last_check(config: ProjectConfig, store: RunStore) -> dict[str, Any]:
    """What auto-retrain is doing, for `training runs`, the API and the page."""
    settings = config.model_training.auto_retrain
    raw = store.retrain.last_check()
    baseline = read_baseline(config) if settings.enabled else Baseline()
    if not settings.enabled:
        reason = "auto-retrain is off (model_training.auto_retrain.enabled)"
    elif settings.trainer == POTATO_SCHEDULES:
        reason = (
            f"Potato's own server schedules it (trainer {POTATO_SCHEDULES}); its runs show here with the trigger potato"
        )
    elif not raw:
        reason = "no beat has checked yet: start `potato-queue beat CONFIG` (or `up`)"
    else:
        reason = raw["reason"]
    return {
        "enabled": settings.enabled,
        "reason": reason,
        "checked_at": float(raw["checked_at"]) if raw.get("checked_at") else None,
        "annotations": int(raw["annotations"]) if raw.get("annotations") else None,
        "baseline": baseline.annotations,
        "last_run_id": baseline.run_id,
        "update_frequency": settings.update_frequency,
        "min_interval_s": settings.min_interval_s,
    }
