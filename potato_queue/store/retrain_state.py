"""Auto-retrain's Redis side: the lock one check holds while it decides, and the last check's outcome.

The lock makes two beat processes (or two executors taking their ticks) start
one run between them; the outcome is kept so that `training runs`, the API and
the page can say what auto-retrain waits for without deciding anything.
"""

from __future__ import annotations

import redis

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.store.keys import Keys
from potato_queue.store.lease import Lease
from potato_queue.store.records import as_text

__all__ = ["RetrainState"]


class RetrainState:
    """One project's auto-retrain state (the store's `retrain`)."""

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock = REAL_CLOCK) -> None:
        self.redis, self.keys, self.clock = client, keys, clock

    def check_lock(self) -> Lease:
        """A fresh handle on the check's lock (each caller takes its own: a handle keeps its holder's token)."""
        return Lease(self.redis, self.keys.retrain_lock)

    def record_check(self, reason: str, annotations: int) -> None:
        """The outcome of the check that just ended, stamped with the store's clock."""
        self.redis.hset(
            self.keys.retrain_status,
            mapping={"checked_at": repr(self.clock.now_s()), "reason": reason, "annotations": annotations},
        )

    def last_check(self) -> dict[str, str]:
        """The last check's fields as text (checked_at, reason, annotations); empty before any check."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.keys.retrain_status).items()}
