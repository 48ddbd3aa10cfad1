"""The store's indexes of runs in Redis: the unfinished ones (what executors look at), the ones whose
folders hold bulky files (what retain_runs looks at) and all of them by age (the newest).

Each is a sorted set scored by the run's creation (ms), rebuilt from the run folders after Redis was
emptied (RunStore.reseed_from_disk).
"""

from __future__ import annotations

import redis

from potato_queue.run import FINAL_STATES, RunState
from potato_queue.store.keys import Keys
from potato_queue.store.records import as_text

__all__ = ["RunIndex"]


class RunIndex:
    """One project's run indexes (the store's `index`)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = client, keys

    def unfinished(self) -> list[tuple[str, str]]:
        """(run id, state) of every run not yet final, oldest first: one ZRANGE and one pipeline."""
        ids = [as_text(r) for r in self.redis.zrange(self.keys.unfinished, 0, -1)]
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for run_id in ids:
            pipe.hget(self.keys.run(run_id), "state")
        states = [as_text(s) for s in pipe.execute()]
        out = []
        for run_id, state in zip(ids, states, strict=True):
            if state in FINAL_STATES:
                self.redis.zrem(self.keys.unfinished, run_id)  # a final state written before the index existed
            else:
                out.append((run_id, state or RunState.QUEUED))
        return out

    def mark_bulky(self, run_id: str, created_ms: float) -> None:
        """The run's folder now holds a bundle or model files: retain_runs will look at it."""
        self.redis.zadd(self.keys.bulky, {run_id: created_ms}, nx=True)

    def unmark_bulky(self, run_id: str) -> None:
        """The run's bundle and model files are gone (pruned, or never there)."""
        self.redis.zrem(self.keys.bulky, run_id)

    def bulky_runs(self) -> list[str]:
        """The runs whose folders hold a bundle or model files, oldest first."""
        return [as_text(r) for r in self.redis.zrange(self.keys.bulky, 0, -1)]

    def newest_runs(self, n: int) -> list[str]:
        """The ids of the newest `n` runs, newest first."""
        return [as_text(r) for r in self.redis.zrevrange(self.keys.runs, 0, n - 1)] if n > 0 else []
