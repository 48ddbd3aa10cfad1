"""The runs offered to an agent backend, and an agent's claim of one.

The executor offers a run (a sorted set per backend, oldest first) and wakes
the claims waiting for it; an agent's claim pops the oldest in the same Lua
step that checks its backend token's digest, so a token replaced a moment ago
claims nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import redis

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.store.keys import Keys
from potato_queue.store.plumbing import CLAIM, async_twin
from potato_queue.store.records import as_text
from potato_queue.store.tokens import WAKE_EVERYONE, token_digest

__all__ = ["Offers", "DENIED", "DRAIN"]

DENIED = "denied"
DRAIN = "drain"  # the claim's answer while the backend drains: no run


class Offers:
    """One project's offers (the store's `offers`): the executor's side (offer, is_offered, withdraw) and
    the agent's (claim)."""

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock = REAL_CLOCK) -> None:
        self.redis, self.keys, self.clock = client, keys, clock
        self._claim = client.register_script(CLAIM)

    def offer(self, backend: str, run_id: str) -> None:
        """Post a run for the backend's agents and wake the claims waiting for it."""
        pipe = self.redis.pipeline()
        pipe.zadd(self.keys.offers(backend), {run_id: self.clock.now_s()}, nx=True)
        pipe.publish(self.keys.offered, backend)
        pipe.execute()

    async def announcements(self, subscribed: Callable[[], None]) -> AsyncIterator[str]:
        """Each message on the offers channel, as it is published: a backend's name (an offer), or WAKE_EVERYONE
        and the name (a register). `subscribed()` is called once the subscription holds, so that a claim that
        looks only after it cannot miss an offer made in between."""
        # An asyncio twin: a blocking subscription would hold a thread-pool thread for the server's life.
        twin = async_twin(self.redis)
        pubsub = twin.pubsub()
        try:
            await pubsub.subscribe(self.keys.offered)
            subscribed()
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    data = message["data"]
                    yield data.decode() if isinstance(data, bytes) else data
        finally:
            await pubsub.aclose()
            await twin.aclose()

    def is_offered(self, backend: str, run_id: str) -> bool:
        return self.redis.zscore(self.keys.offers(backend), run_id) is not None

    def withdraw(self, backend: str, run_id: str) -> None:
        self.redis.zrem(self.keys.offers(backend), run_id)

    def claim(self, backend: str, token: str, agent: dict[str, Any]) -> str | None:
        """The oldest run offered to `backend` (now the caller's), None when none is, DENIED for a token
        that is not (or no longer) this backend's, DRAIN (no run) while the backend's drain switch is on or
        when the agent says it drains (its word kept, with its host, pid and the time, for `training check`
        until an agent claims again). Marks the backend as seen either way."""
        drains = ""
        if agent.get("draining"):
            drains = json.dumps({"host": agent.get("host"), "pid": agent.get("pid"), "at": self.clock.now_s()})
        return self._call(backend, token, agent, "", drains) or None

    def waiting(self, backend: str, token: str, agent: dict[str, Any], gpu_wait: dict[str, Any]) -> bool:
        """An agent of `backend` waits for a free GPU before it claims: it is seen, and its wait kept (with
        its host and the time) for the offered runs' step line. False for a token that is not the backend's."""
        wait = json.dumps({"wait": gpu_wait, "host": agent.get("host"), "at": self.clock.now_s()})
        return self._call(backend, token, agent, wait) != DENIED

    def agent_waiting(self, backend: str, fresh_s: float) -> dict[str, Any] | None:
        """The last wait an agent of `backend` reported ({wait, host, at}), when it is under fresh_s old and no
        agent claimed since: an agent that stopped while it waited is not waited for any more."""
        raw = self.redis.hget(self.keys.agent_token(backend), "gpu_wait")
        if raw is None:
            return None
        said = json.loads(as_text(raw))
        return said if self.clock.now_s() - float(said["at"]) < fresh_s else None

    def switch_drain(self, backend: str, on: bool) -> None:
        """The server's drain switch for `backend`: on, its agents finish their run and claim no new one (the
        claims waiting now are woken, to be told so); off, they may claim again."""
        pipe = self.redis.pipeline()
        if on:
            pipe.set(self.keys.agent_drain(backend), repr(self.clock.now_s()), nx=True)
        else:
            pipe.delete(self.keys.agent_drain(backend))
        pipe.publish(self.keys.offered, WAKE_EVERYONE + backend)  # every claim waiting now is told
        pipe.execute()

    def drain_switched(self, backend: str) -> float | None:
        """When the server's drain switch for `backend` was switched on; None while it is off."""
        raw = self.redis.get(self.keys.agent_drain(backend))
        return None if raw is None else float(as_text(raw))

    def _call(self, backend: str, token: str, agent: dict[str, Any], gpu_wait: str, drains: str = "") -> str:
        keys = [self.keys.agent_token(backend), self.keys.offers(backend), self.keys.agent_drain(backend)]
        args = [token_digest(token), repr(self.clock.now_s()), json.dumps(agent), gpu_wait, drains]
        return str(as_text(self._claim(keys=keys, args=args)))
