"""Who is up: the server's address, the executors alive, the queue's length, and whether Redis was emptied.

Each process says so itself, refreshed every few seconds with a short expiry
(processes/), so a stopped one does not linger and all of it comes back after
Redis is emptied.
"""

from __future__ import annotations

import redis

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.store.keys import Keys
from potato_queue.store.records import as_text

__all__ = ["Presence"]


class Presence:
    """One project's presence keys (the store's `presence`)."""

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock = REAL_CLOCK) -> None:
        self.redis, self.keys, self.clock = client, keys, clock

    def ping(self) -> None:
        """Raises redis.RedisError when Redis does not answer: /healthz asks Redis itself, not any key of ours,
        since an emptied Redis that answers is up."""
        self.redis.ping()

    def record_server_url(self, url: str, local_url: str, ttl_s: float) -> None:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.server_url, url, ex=max(1, int(ttl_s)))
            pipe.set(self.keys.server_local_url, local_url, ex=max(1, int(ttl_s)))
            pipe.execute()

    def server_url(self) -> str | None:
        """Where `potato-queue serve` said agents reach it: its public URL (None: no server running)."""
        url = as_text(self.redis.get(self.keys.server_url))
        return None if url is None else str(url)

    def server_local_url(self) -> str | None:
        """The server's bound address, for executors beside it: behind a TLS proxy the public URL is https,
        which neither the local agent nor an ssh forward (plain http through a socket) should go through."""
        url = as_text(self.redis.get(self.keys.server_local_url)) or self.server_url()
        return None if url is None else str(url)

    def record_executor(self, name: str, ttl_s: float) -> None:
        self.redis.set(self.keys.executor(name), repr(self.clock.now_s()), ex=max(1, int(ttl_s)))

    def executors_seen(self) -> list[str]:
        """The executors up now (`<host>:<pid>`), as they last said so within their expiry."""
        head = len(self.keys.executor(""))
        return sorted(as_text(key)[head:] for key in self.redis.scan_iter(match=self.keys.executors, count=1000))

    def queue_length(self) -> int:
        """Runs waiting in the Celery queue for an executor."""
        return int(self.redis.llen(self.keys.queue))

    def first_look_since_empty(self) -> bool:
        """True once after Redis was emptied (or first used): time to reseed it from the run folders."""
        return bool(self.redis.set(self.keys.alive, "1", nx=True))
