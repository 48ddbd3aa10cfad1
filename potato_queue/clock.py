"""The clock a run's supervision reads and waits on: real time, or, in tests, a clock that is set by hand.

Every rule that decides a run's fate by the clock (heartbeat silence, the
first contact, max_wall_seconds, a wait's deadline, cancel's grace) reads
`Clock.now_s` and waits with `Clock.wait`. `ManualClock` makes those rules
testable in milliseconds: waiting moves it forward instead of sleeping (the
model is dramatiq's StubBroker, shipped with the library for its users' tests).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Clock", "ManualClock", "REAL_CLOCK"]


class Clock:
    """Real time: epoch seconds, and a wait that ends early when `woken` returns (the store's BLPOP)."""

    def now_s(self) -> float:
        return time.time()

    def wait(self, seconds: float, woken: Callable[[float], None] | None = None) -> None:
        """Wait up to `seconds`; `woken(seconds)` blocks until then or until what it waits for happens."""
        if woken is None:
            time.sleep(max(0.0, seconds))
        else:
            woken(seconds)


REAL_CLOCK = Clock()


class ManualClock(Clock):
    """A clock that moves only when something waits on it (or `advance` is called): a wait of 30 s takes
    no time. `on_wait` runs at every wait, with the new time: a test's scripted agent acts there."""

    def __init__(self, start_s: float = 1_800_000_000.0) -> None:
        self._now_s = start_s
        self._lock = threading.Lock()
        self.on_wait: Callable[[float], None] | None = None

    def now_s(self) -> float:
        with self._lock:
            return self._now_s

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now_s += max(0.0, seconds)

    def wait(self, seconds: float, woken: Callable[[float], None] | None = None) -> None:
        self.advance(seconds)
        if self.on_wait is not None:
            self.on_wait(self.now_s())
