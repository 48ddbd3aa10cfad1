"""retain_runs: the bulky files of old runs are removed once a run ends, off the run's path.

A run's bundle (a copy of the project's annotations) and its model files are
the large part of its folder. The newest `model_training.retain_runs`
succeeded runs keep everything, and so do the newest `retain_runs` runs that
failed or were cancelled (a retry trains on the bundle): each kind is counted
apart, so many cancelled runs never evict a succeeded run's model. Older
finished ones lose their bundle, their model files and the local agent's
copies, and keep their record, logs, events and predictions. Never touched:
a run not yet finished, and
the latest successful run (whose model and predictions the project uses,
and decision-calibrate recalibrates), however old. The executor prunes in a
thread of its own (Pruner), so the next run never waits for the deletes.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

from potato_queue.run import FINAL_STATES, RunState
from potato_queue.runs.record_retention import prune_old_records
from potato_queue.store import RunStore
from potato_queue.store.records import utc_now

__all__ = ["prune_old_runs", "Pruner"]

_log = logging.getLogger("potato_queue.runs")


def _bulky(store: RunStore, run_id: str) -> list[Path]:
    return [p for p in store.paths(run_id).bulky if p.exists()]


def _to_prune(store: RunStore, retain: int) -> list[str]:
    """The finished runs with bulky files beyond what retain_runs keeps, oldest first.

    Succeeded runs and the others (failed, cancelled: kept for a retry) are counted apart, so forty
    cancelled retries do not push out the model files of the runs the project uses."""
    kept: dict[bool, int] = {True: 0, False: 0}
    latest = store.latest_succeeded()
    out = []
    for run_id in reversed(store.index.bulky_runs()):  # newest first
        try:
            state = store.read(run_id).get("state")
        except KeyError:
            store.index.unmark_bulky(run_id)
            continue  # gone, or unreadable: not ours to judge
        if state not in FINAL_STATES or store.publishing(run_id):
            continue  # one being uploaded to the Hugging Face Hub is pruned at a later run's end
        succeeded = state == RunState.SUCCEEDED
        kept[succeeded] += 1  # the latest success counts among the newest too, though it is never pruned
        if kept[succeeded] > retain and run_id != latest:
            out.append(run_id)
    return out[::-1]


def prune_old_runs(store: RunStore, retain: int) -> list[str]:
    """Remove the bundles and model files of finished runs beyond the newest `retain` succeeded ones and the
    newest `retain` others; the ids pruned.

    Cheap at every run's end, however long the project's history: only the runs in the store's
    index of folders with bulky files are looked at.
    """
    pruned = _to_prune(store, retain)
    for run_id in pruned:
        for path in _bulky(store, run_id):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        store.index.unmark_bulky(run_id)
        # A line in run.log, not a rewrite of run.json: the record stays as the run left it (and no fsync).
        store.log(
            run_id,
            f"bundle and model files removed at {utc_now(store.clock)}: model_training.retain_runs keeps "
            f"those of the newest {retain} succeeded runs and the newest {retain} others",
        )
    return pruned


class Pruner:
    """retain_runs in a thread of its own: `request(run_id)` after a run ends returns at once. One prune at
    a time; a run that ends while one goes asks for one more, which follows it."""

    def __init__(self, store: RunStore, retain: int) -> None:
        self.store, self.retain = store, retain
        self._lock = threading.Lock()
        self._wanted: str | None = None  # the run whose end asked, for the warning's place
        self._thread: threading.Thread | None = None

    def request(self, run_id: str) -> None:
        with self._lock:
            self._wanted = run_id
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="prune", daemon=True)
                self._thread.start()

    def wait(self, timeout_s: float | None = None) -> None:
        """Until no prune is going (an executor's shutdown, a test)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            with self._lock:
                run_id, self._wanted = self._wanted, None
                if run_id is None:
                    self._thread = None
                    return
            try:
                prune_old_runs(self.store, self.retain)
                prune_old_records(self.store, self.store.config.model_training.retain_run_records_days)
            except Exception as exc:  # housekeeping: never what ends a run, nor this thread
                _log.warning("old runs could not be pruned: %s", exc)
                self.store.log(run_id, f"warning: old runs could not be pruned (retain_runs): {exc}")
