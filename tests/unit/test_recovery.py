"""Recovery's rule for a run whose executor died, in process: a real Redis and run folder, a set clock."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import redis

from potato_queue.clock import ManualClock
from potato_queue.run import RunState
from potato_queue.runs.recovery import EXECUTOR_STOPPED, ORPHAN_QUIET_S, sweep_orphans
from potato_queue.store import RunStore
from potato_queue.store.lease import LEASE_TTL_S
from potato_queue.validate import load_checked
from tests.lifecycle_helpers import make_project

pytestmark = pytest.mark.unit


def running_run(tmp_path: Path, redis_url: str, seconds_later: float) -> tuple[RunStore, str]:
    """A run an executor had moved to `running` (its files written now), seen `seconds_later`."""
    clock = ManualClock(time.time() + seconds_later)
    store = RunStore(load_checked(make_project(tmp_path)), redis.Redis.from_url(redis_url), clock=clock)
    record = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    assert store.transition(record["run_id"], RunState.STARTING) and store.transition(
        record["run_id"], RunState.RUNNING
    )
    return store, record["run_id"]


def test_a_run_quiet_past_orphan_quiet_s_with_nobody_on_the_slot_fails_saying_why(
    tmp_path: Path, redis_server_url: str
) -> None:
    store, run_id = running_run(tmp_path, redis_server_url, ORPHAN_QUIET_S + 1)
    sweep_orphans(store)
    record = store.get(run_id)
    assert (record["state"], record["error"]) == (RunState.FAILED, EXECUTOR_STOPPED)
    assert EXECUTOR_STOPPED in store.paths(run_id).run_log.read_text()
    assert store.index.unfinished() == []


def test_a_run_whose_files_changed_lately_is_left_running(tmp_path: Path, redis_server_url: str) -> None:
    store, run_id = running_run(tmp_path, redis_server_url, ORPHAN_QUIET_S - 5)
    sweep_orphans(store)
    assert store.get(run_id)["state"] == RunState.RUNNING


def test_a_quiet_run_whose_executor_holds_the_slot_is_left_running(tmp_path: Path, redis_server_url: str) -> None:
    """A long silent stretch of a live run (its executor renews the slot) is not an orphan."""
    store, run_id = running_run(tmp_path, redis_server_url, ORPHAN_QUIET_S + 60)
    holder = store.slot_lease()
    assert holder.try_take()
    try:
        sweep_orphans(store)
    finally:
        holder.release()
    assert store.get(run_id)["state"] == RunState.RUNNING


def test_a_quiet_run_whose_executor_touched_supervised_lately_is_left_running(
    tmp_path: Path, redis_server_url: str
) -> None:
    """After a Redis outage longer than the lease, the slot is free and run.log has been quiet, but the
    executor deciding the run's end lives: it touches `supervised` on disk every second, Redis or not."""
    store, run_id = running_run(tmp_path, redis_server_url, ORPHAN_QUIET_S + 60)
    supervised = store.paths(run_id).supervised
    supervised.touch()
    lately = store.clock.now_s() - 2
    os.utime(supervised, (lately, lately))
    sweep_orphans(store)
    assert store.get(run_id)["state"] == RunState.RUNNING


def test_a_slot_lapsed_while_its_holder_stalled_says_so_even_when_another_took_it_since(
    tmp_path: Path, redis_server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled executor wakes after the lease: whether the slot still lies empty or its own sweep (another
    Lease of the same process) took it first, the loss is the stall's, and the run's error says that."""
    store, _ = running_run(tmp_path, redis_server_url, 0)
    holder, sweep = store.slot_lease(), store.slot_lease()
    assert holder.try_take()
    try:
        woke_s = time.monotonic() + LEASE_TTL_S + 1  # the stall, without waiting it out
        monkeypatch.setattr(time, "monotonic", lambda: woke_s)
        store.redis.delete(store.keys.slot)  # its key expired meanwhile
        assert sweep.try_take()
        assert holder.renew() is False and holder.lapsed is True
    finally:
        sweep.release()
