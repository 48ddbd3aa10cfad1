"""What an executor process does with a wake-up: take the slot, start the oldest queued run.

One run at a time per project, in creation order, across any number of
executor processes (API-1): whoever holds the slot (runs.lease) starts the
OLDEST queued run, not necessarily the one its message named. A lost,
duplicated or redelivered message therefore never reorders or repeats a
run: messages are wake-ups, run states are the truth. The candidates come
from the store's index of unfinished runs, not from listing run folders.
"""

from __future__ import annotations

import logging
import time

import redis

from potato_queue.config import LOCAL, ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.executors import Executors
from potato_queue.run import RunRecord, RunState
from potato_queue.runs.lifecycle import RunLife
from potato_queue.runs.recovery import fail_orphans
from potato_queue.runs.retention import Pruner
from potato_queue.store import RunStore
from potato_queue.store.records import utc_of

__all__ = ["Dispatcher"]

QUEUE_LOOK_S = 1.0
_log = logging.getLogger("potato_queue.runs")
IN_FLIGHT_WAIT_S = 1.0


class Dispatcher:
    """One executor process's side of the queue: its store and its executors (kept warm between runs)."""

    def __init__(self, config: ProjectConfig, client: redis.Redis) -> None:
        self.config = config
        self.store = RunStore(config, client)
        self.executors = Executors(config)
        self.pruner = Pruner(self.store, config.model_training.retain_runs)
        # The first local run gets a warm agent too, not only the ones after it.
        self.executors.get(LOCAL).warm()

    def _anything_queued(self) -> bool:
        return any(state == RunState.QUEUED for _, state in self.store.index.unfinished())

    def _take_oldest_queued(self) -> tuple[RunRecord, float] | None | bool:
        """The record of the run now `starting` and when it started (epoch s); None if nothing is
        queued; False to wait (a run is in flight)."""
        unfinished = self.store.index.unfinished()
        if fail_orphans(self.store, unfinished):
            return False
        for run_id, state in unfinished:
            if state == RunState.QUEUED:
                started_s = self.store.clock.now_s()
                record = self._hold(run_id, started_s)
                if record is not None:
                    return record, started_s
        return None

    def _hold(self, run_id: str, started_s: float) -> RunRecord | None:
        """The run's record once it is this executor's: `starting`, or, on a pull backend, still
        `queued` until its agent claims it (AGT-4). None when the run is no longer queued."""
        try:
            record = self.store.read(run_id)
        except KeyError:
            # Its folder was removed by hand (or its run.json): no run to start, and one that never leaves the
            # index would stop the queue behind it.
            _log.warning("queued run %s has no run.json any more: left out of the queue", run_id)
            self.store.forget(run_id)
            return None
        try:
            pull = self.executors.get(record["backend"]).pull
        except PotatoQueueError:
            pull = False  # RunLife fails it with the registry's message
        if pull:
            return self.store.transition(run_id, RunState.QUEUED, record)
        return self.store.transition(run_id, RunState.STARTING, record, started_at=utc_of(started_s))

    def execute_next(self, *, poll_s: float = 0.05) -> str | None:
        """Wait for the slot, then run the oldest queued run. Returns the run id it ran, if any."""
        lease = self.store.slot_lease()
        last_look = 0.0
        while not lease.try_take():
            if time.monotonic() - last_look > QUEUE_LOOK_S:  # anything left to wait for?
                if not self._anything_queued():
                    return None
                last_look = time.monotonic()
            time.sleep(poll_s)
        try:
            while True:
                chosen = self._take_oldest_queued()
                if chosen is not False:
                    break
                time.sleep(IN_FLIGHT_WAIT_S)
                lease.renew()
            if chosen is None or isinstance(chosen, bool):
                return None
            record, started_s = chosen
            RunLife(self.config, self.store, self.executors, record, lease, started_s).run()
            self.pruner.request(record["run_id"])  # the old runs' files go while the next run starts
            return str(record["run_id"])
        finally:
            lease.release()

    def close(self) -> None:
        self.pruner.wait(30)
        self.executors.close()
