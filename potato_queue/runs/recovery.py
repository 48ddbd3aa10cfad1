"""Recovery: runs a dead executor left in flight, and a Redis that came back empty.

- An in-flight run whose files have not changed for ORPHAN_QUIET_S while
  nobody holds the run slot has lost its executor (killed, machine
  restarted): it ends `failed`, saying so, and the next queued run proceeds.
  A live executor touches the run's `supervised` file every second, Redis or
  not: after a Redis outage longer than the lease, the sweep must not take
  the executor deciding the run's end for a dead one.
- After Redis was emptied (flushed, restarted without persistence), the run
  folders are the truth: live states and the unfinished index are seeded
  from them, and an executor is woken for every queued run.

Nothing here imports Celery: the caller hands in `enqueue`.
"""

from __future__ import annotations

from collections.abc import Callable

from potato_queue.run import IN_FLIGHT, RunState
from potato_queue.store import RunStore

__all__ = ["ORPHAN_QUIET_S", "EXECUTOR_STOPPED", "fail_orphans", "sweep_orphans", "reconcile"]

ORPHAN_QUIET_S = 15.0
EXECUTOR_STOPPED = (
    "The executor supervising this run stopped (killed or restarted) before the run finished; start the run again"
)


def _orphaned(store: RunStore, run_id: str) -> bool:
    paths = store.paths(run_id)
    files = (paths.run_log, paths.events, paths.run_json, paths.supervised)
    newest = max((p.stat().st_mtime for p in files if p.exists()), default=0)
    return store.clock.now_s() - newest > ORPHAN_QUIET_S


def fail_orphans(store: RunStore, unfinished: list[tuple[str, str]]) -> bool:
    """Fail the in-flight runs whose executor is gone (call with the slot held); True if one is still live."""
    live = False
    for run_id, state in unfinished:
        if state not in IN_FLIGHT:
            continue
        if not _orphaned(store, run_id):
            live = True
        else:
            store.transition(run_id, RunState.FAILED, error=EXECUTOR_STOPPED, said=EXECUTOR_STOPPED)
    return live


def sweep_orphans(store: RunStore) -> None:
    """From the executor's background thread: runs left in flight by a dead executor end failed,
    even when nothing is queued to make an executor look; records held while their folder could not
    be written are written once it can be."""
    store.write_held_records()
    unfinished = store.index.unfinished()
    if not any(state in IN_FLIGHT for _, state in unfinished):
        return
    lease = store.slot_lease()
    if lease.try_take():  # nobody is supervising a run right now
        try:
            fail_orphans(store, unfinished)
        finally:
            lease.release()


def reconcile(store: RunStore, enqueue: Callable[[str], None]) -> int:
    """After Redis was emptied: seed it from the run folders and wake an executor per queued run."""
    woken = store.reseed_from_disk()
    for run_id in woken:
        enqueue(run_id)
        store.log(run_id, "queued again from disk (Redis had lost the queue)")
    return len(woken)
