"""The run slot: one run at a time per project, across any number of executors (API-1).

A Redis key holding the holder's token (SET NX PX), renewed in every phase of
a run: by supervision's loop, and from a thread (`kept`) while a phase that
takes as long as the project is large runs (the bundle's build, the splits,
the predictions into Potato's store). An executor that dies or stalls loses
it within LEASE_TTL_S; the next one takes over.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import redis

from potato_queue.store.records import as_text

__all__ = ["Lease", "LEASE_TTL_S", "LEASE_RENEW_S"]

LEASE_TTL_S = 10.0
LEASE_RENEW_S = 1.0


class Lease:
    """The run slot: a Redis key holding our token, renewed at most once a second."""

    def __init__(
        self, client: redis.Redis, key: str, *, ttl_s: float = LEASE_TTL_S, renew_s: float = LEASE_RENEW_S
    ) -> None:
        self.client, self.key = client, key
        self.ttl_s, self.renew_s = ttl_s, renew_s
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._renewed = 0.0
        self.lapsed = False  # the last renew found the key expired: not renewed within LEASE_TTL_S

    def try_take(self) -> bool:
        taken = bool(self.client.set(self.key, self.token, nx=True, px=int(self.ttl_s * 1000)))
        self._renewed = time.monotonic() if taken else 0.0
        return taken

    def take_within(self, timeout_s: float, poll_s: float = 0.01) -> bool:
        """try_take until it succeeds or `timeout_s` passes: for a lock held for milliseconds at a time (a
        holder that died lets go within ttl_s, so a timeout_s past that is never waited out but by a stall)."""
        deadline = time.monotonic() + timeout_s
        while not self.try_take():
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def renew(self) -> bool:
        """False once someone else holds the slot; a slot emptied by a Redis flush is taken back."""
        if time.monotonic() - self._renewed < self.renew_s:
            return True
        try:
            holder = self.client.get(self.key)
            # Not renewed within LEASE_TTL_S (this process stalled, or Redis did not answer): the slot was free
            # meanwhile, so it is lost, whether it still lies empty or another taker (the executor's own sweep,
            # woken in the same instant) holds it now.
            self.lapsed = time.monotonic() - self._renewed >= self.ttl_s
            if holder is None:
                return not self.lapsed and self.try_take()  # emptied by a flush while ours: taken back
            if as_text(holder) != self.token:
                return False
            self.client.pexpire(self.key, int(self.ttl_s * 1000))
        except redis.RedisError:
            return time.monotonic() - self._renewed < self.ttl_s
        self._renewed = time.monotonic()
        return True

    @contextlib.contextmanager
    def kept(self, alive: Callable[[], None] = lambda: None) -> Iterator[None]:
        """Renewed from a thread each renew_s while the block runs, `alive()` called with each renewal: a
        phase that takes as long as the project is large is not a stall. A stall of the whole process
        stops the thread too, so it still loses the slot."""
        done = threading.Event()

        def keep() -> None:
            while not done.wait(self.renew_s):
                self.renew()
                alive()

        thread = threading.Thread(target=keep, daemon=True, name=f"lease-{self.key}")
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def release(self) -> None:
        try:
            if self.client.get(self.key) == self.token.encode():
                self.client.delete(self.key)
        except redis.RedisError:
            pass
