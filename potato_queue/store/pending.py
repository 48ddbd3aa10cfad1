"""A run's record while its folder cannot be written: held in Redis, written once it can be.

The run folder is the truth, but a disk can fill up or a folder be made
read-only mid-run. Then a transition has already happened in Redis (its
compare-and-set comes first) and run.json cannot follow: the new record is
held in the run's live hash with the OS error, the API shows it, and the
executors' background sweep writes it as soon as the folder takes writes
again, so disk and Redis end in the same state. The store's `pending`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import redis

from potato_queue.store.keys import Keys
from potato_queue.store.records import as_text

__all__ = ["PendingRecords"]


class PendingRecords:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = client, keys

    def hold(self, run_id: str, record: dict[str, Any], error: str) -> None:
        """Keep `record` (and why it could not be written) until write_held() succeeds."""
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.run(run_id), mapping={"pending_record": json.dumps(record), "disk_error": error})
        pipe.sadd(self.keys.unwritten, run_id)
        pipe.execute()

    def note(self, run_id: str, error: str) -> None:
        """A write for the run failed (events, predictions, run.log): the executor ends the run with it."""
        self.redis.hsetnx(self.keys.run(run_id), "disk_error", error)

    def held(self, run_id: str) -> dict[str, Any] | None:
        raw = self.redis.hget(self.keys.run(run_id), "pending_record")
        return None if raw is None else json.loads(as_text(raw))

    def write_held(self, write: Callable[[str, dict[str, Any]], None]) -> list[str]:
        """Write every held record with `write(run_id, record)`; the ids written (the others stay held)."""
        written = []
        for run_id in [as_text(r) for r in self.redis.smembers(self.keys.unwritten)]:
            record = self.held(run_id)
            try:
                if record is not None:
                    write(run_id, record)
            except OSError:
                continue  # not yet: the next sweep tries again
            pipe = self.redis.pipeline()
            pipe.hdel(self.keys.run(run_id), "pending_record")
            pipe.srem(self.keys.unwritten, run_id)
            pipe.execute()
            written.append(run_id)
        return written
