"""The run slot: one run at a time per project, across any number of executors (API-1).

A Redis key holding the holder's token (SET NX PX), renewed while a run is
supervised. An executor that dies loses it within LEASE_TTL_S; the next one
takes over.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

import redis

from potato_queue.store.records import as_text

__all__ = ["Lease", "LEASE_TTL_S", "LEASE_RENEW_S"]

LEASE_TTL_S = 10.0
LEASE_RENEW_S = 1.0


class Lease:
    """The run slot: a Redis key holding our token, renewed at most once a second."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client, self.key = client, key
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._renewed = 0.0
        self.lapsed = False  # the last renew found the key expired: not renewed within LEASE_TTL_S

    def try_take(self) -> bool:
        taken = bool(self.client.set(self.key, self.token, nx=True, px=int(LEASE_TTL_S * 1000)))
        self._renewed = time.monotonic() if taken else 0.0
        return taken

    def renew(self) -> bool:
        """False once someone else holds the slot; a slot emptied by a Redis flush is taken back."""
        if time.monotonic() - self._renewed < LEASE_RENEW_S:
            return True
        try:
            holder = self.client.get(self.key)
            # Not renewed within LEASE_TTL_S (this process stalled, or Redis did not answer): the slot was free
            # meanwhile, so it is lost, whether it still lies empty or another taker (the executor's own sweep,
            # woken in the same instant) holds it now.
            self.lapsed = time.monotonic() - self._renewed >= LEASE_TTL_S
            if holder is None:
                return not self.lapsed and self.try_take()  # emptied by a flush while ours: taken back
            if as_text(holder) != self.token:
                return False
            self.client.pexpire(self.key, int(LEASE_TTL_S * 1000))
        except redis.RedisError:
            return time.monotonic() - self._renewed < LEASE_TTL_S
        self._renewed = time.monotonic()
        return True

    def release(self) -> None:
        try:
            if self.client.get(self.key) == self.token.encode():
                self.client.delete(self.key)
        except redis.RedisError:
            pass
