"""Cancellation: SIGTERM/SIGINT set a flag that trainers poll.

The agent and the executors cancel a run by sending SIGTERM to the worker's
process group and SIGKILL after a grace period. Once the trainer's loop runs
(its first ``should_stop()`` poll arms the flag), the first signal only sets
the flag: the trainer stops at its next check, with whatever it wants to
save, and the worker exits 4. Before that (reading the bundle, importing
torch, loading a model) there is nothing to save, and a signal raises
:class:`Cancelled` at once rather than making the cancel wait out the grace.
A second signal always raises at once, for a trainer stuck in one long call.
"""

import signal
import threading
from types import FrameType
from typing import Optional

from .errors import Cancelled

__all__ = ["StopFlag", "install_signal_handlers"]


class StopFlag:
    """A thread-safe "please stop" flag with the signal that set it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""
        self.count = 0
        # Set by the trainer's first poll: from then on a signal waits for the trainer to stop.
        self.armed = False

    def set(self, reason: str = "") -> None:
        """Request a stop."""
        if reason and not self.signal_name:
            self.signal_name = reason
        self._event.set()

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        return self._event.is_set()

    def poll(self) -> bool:
        """What a trainer calls (through ``ctx.should_stop()``): whether to stop; arms the flag."""
        self.armed = True
        return self.is_set()

    def __call__(self) -> bool:
        return self.is_set()


def install_signal_handlers(flag: StopFlag) -> None:
    """Route SIGTERM and SIGINT to *flag* (main thread only; else a no-op)."""

    def handle(signum: int, frame: Optional[FrameType]) -> None:
        flag.count += 1
        name = signal.Signals(signum).name
        flag.set(name)
        if not flag.armed:
            raise Cancelled("Cancelled by %s before the trainer's loop began" % name)
        if flag.count > 1:
            raise Cancelled("Cancelled by a second %s" % name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, handle)
        except (ValueError, OSError):
            pass  # not the main thread: cancellation falls back to SIGKILL
