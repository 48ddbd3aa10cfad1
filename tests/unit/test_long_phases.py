"""A run whose preparation takes longer than the run slot's lease (a large project's bundle): in process, a real
Redis, a real run folder and Potato's real store, the stub backend (tests/stub_backend.py).

The build is made slow on purpose (the real build, then a wait past three leases, with another executor's
orphan sweep looking all the while) and the lease is short (0.3 s, not 10 s), so each case takes about a
second. The sweep's clock is set a minute ahead: every file of the run looks quiet to it, so only the slot
held stands between the run and "the executor supervising this run stopped".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from potato_queue.clock import ManualClock
from potato_queue.run import RunState
from potato_queue.runs import lifecycle
from potato_queue.runs.lifecycle import RunLife
from potato_queue.runs.recovery import EXECUTOR_STOPPED, ORPHAN_QUIET_S, sweep_orphans
from potato_queue.store import RunStore
from potato_queue.store.lease import Lease
from potato_queue.store.potato_ledger import potato_config
from potato_queue.validate import load_checked
from tests.lifecycle_helpers import make_project
from tests.stub_backend import Script, StubAgent, StubExecutor, StubExecutors

pytestmark = pytest.mark.unit

LEASE_TTL_S, LEASE_RENEW_S = 0.3, 0.05
BUILD_S = 3 * LEASE_TTL_S + 0.3


def _run(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch, during_build: Callable[[RunStore, str], None]
) -> tuple[RunStore, dict[str, Any]]:
    """One local run through RunLife, its build followed by BUILD_S of `during_build` every 50 ms."""
    config = load_checked(make_project(tmp_path))
    clock = ManualClock(time.time() + ORPHAN_QUIET_S + 60)
    store = RunStore(config, redis.Redis.from_url(redis_url), clock=clock)
    store.presence.record_server_url("http://127.0.0.1:9", "http://127.0.0.1:9", 3600)
    agent = StubAgent(Script(), store, clock, "local")
    executor = StubExecutor("local", "local", agent, config.model_training.backend_config("local"))
    record = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    held = store.transition(record["run_id"], RunState.STARTING, record)
    assert held is not None
    real_build = lifecycle.build_job

    def slow_build(*args: Any) -> Any:
        job = real_build(*args)
        until = time.monotonic() + BUILD_S
        while time.monotonic() < until:
            during_build(store, held["run_id"])
            time.sleep(0.05)
        return job

    monkeypatch.setattr(lifecycle, "build_job", slow_build)
    lease = Lease(store.redis, store.keys.slot, ttl_s=LEASE_TTL_S, renew_s=LEASE_RENEW_S)
    assert lease.try_take()
    try:
        RunLife(config, store, StubExecutors(executor), held, lease, clock.now_s()).run()  # type: ignore[arg-type]
    finally:
        lease.release()
    return store, dict(store.get(held["run_id"]))


def _potato_status(store: RunStore, run_id: str) -> str:
    from potato.training import store as potato_store

    row = potato_store.load_run(potato_config(store.config), run_id)
    assert row is not None, "the run is in Potato's training_runs"
    return str(row.status)


def _another_executors_sweep(store: RunStore, run_id: str) -> None:
    sweep_orphans(store)


def test_a_bundle_build_slower_than_the_lease_is_not_taken_for_a_stalled_executor(
    tmp_path: Path, redis_server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the slot was renewed during the build, the sweep took the free slot and failed the run as
    orphaned, and the build then wrote it back to `starting`."""
    store, record = _run(tmp_path, redis_server_url, monkeypatch, _another_executors_sweep)
    assert (record["state"], record["error"]) == (RunState.SUCCEEDED, None), record
    assert EXECUTOR_STOPPED not in store.paths(record["run_id"]).run_log.read_text()
    assert _potato_status(store, record["run_id"]) == "success"


def test_a_run_failed_while_it_was_building_stays_failed_in_run_json_and_in_potatos_row(
    tmp_path: Path, redis_server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep that decided the executor was gone (a real stall) wins: the build that finishes after it
    writes nothing back, launches nothing, and says so in run.log."""

    def stalled(store: RunStore, run_id: str) -> None:
        store.transition(run_id, RunState.FAILED, error=EXECUTOR_STOPPED, said=EXECUTOR_STOPPED)

    store, record = _run(tmp_path, redis_server_url, monkeypatch, stalled)
    assert (record["state"], record["error"]) == (RunState.FAILED, EXECUTOR_STOPPED), record
    assert "job" not in store.read(record["run_id"]), "the build's job was not written over the failed record"
    assert _potato_status(store, record["run_id"]) == "error"
    log = store.paths(record["run_id"]).run_log.read_text()
    assert "is failed now, no longer starting: this executor's step was not recorded" in log
    assert store.index.unfinished() == []
