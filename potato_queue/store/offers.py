"""The runs offered to an agent backend, and an agent's claim of one.

The executor offers a run (a sorted set per backend, oldest first) and wakes
the claims waiting for it; an agent's claim pops the oldest in the same Lua
step that checks its backend token's digest, so a token replaced a moment ago
claims nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from potato_queue.store.keys import Keys
from potato_queue.store.plumbing import CLAIM
from potato_queue.store.records import as_text
from potato_queue.store.tokens import token_digest

__all__ = ["Offers", "DENIED"]

DENIED = "denied"


class Offers:
    """One project's offers (the store's `offers`): the executor's side (offer, is_offered, withdraw) and
    the agent's (claim)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = client, keys
        self._claim = client.register_script(CLAIM)

    def offer(self, backend: str, run_id: str) -> None:
        """Post a run for the backend's agents and wake the claims waiting for it."""
        pipe = self.redis.pipeline()
        pipe.zadd(self.keys.offers(backend), {run_id: time.time()}, nx=True)
        pipe.publish(self.keys.offered, backend)
        pipe.execute()

    def is_offered(self, backend: str, run_id: str) -> bool:
        return self.redis.zscore(self.keys.offers(backend), run_id) is not None

    def withdraw(self, backend: str, run_id: str) -> None:
        self.redis.zrem(self.keys.offers(backend), run_id)

    def claim(self, backend: str, token: str, agent: dict[str, Any]) -> str | None:
        """The oldest run offered to `backend` (now the caller's), None when none is, DENIED for a token
        that is not (or no longer) this backend's. Marks the backend as seen either way."""
        keys = [self.keys.agent_token(backend), self.keys.offers(backend)]
        answer = as_text(self._claim(keys=keys, args=[token_digest(token), repr(time.time()), json.dumps(agent)]))
        return answer or None
