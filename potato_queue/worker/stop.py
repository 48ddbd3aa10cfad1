"""Cancellation: SIGTERM/SIGINT set a flag that trainers poll.

The agent and the executors cancel a run by sending SIGTERM to the worker's
process group and SIGKILL after a grace period. Once the trainer's loop runs
(its first ``should_stop()`` poll arms the flag), the first signal only sets
the flag: the trainer stops at its next check, with whatever it wants to
save, and the worker exits 4. Before that (reading the bundle, importing
torch, loading a model) there is nothing to save, and a signal raises
:class:`Cancelled` at once rather than making the cancel wait out the grace.
A second signal always raises at once, for a trainer stuck in one long call.

SIGUSR1 is a preemption (SLURM's ``--signal`` ahead of a preemption or the job's
time limit): the same stop, but the trainer saves a checkpoint first and the
worker exits 6 (EXIT_PREEMPTED) rather than 4, so that a requeued job resumes.
"""

import os
import queue
import select
import signal
import sys
import threading
import time
from types import FrameType
from typing import Optional

from potato_queue.wire.sbatch import PREEMPT_ON_TERM_VAR

from .errors import Cancelled, Preempted

__all__ = [
    "term_is_preemption",
    "StopFlag",
    "install_signal_handlers",
    "ignore_stop_signals",
    "stop_when_orphaned",
    "stop_from_parent",
    "ORPHAN_POLL_S",
    "ORPHAN_GRACE_S",
]

ORPHAN_POLL_S = 0.5
# After its agent is gone, the worker stops as on a cancel; this long later it exits, stopped or not.
ORPHAN_GRACE_S = 10.0


class StopFlag:
    """A thread-safe "please stop" flag with the signal that set it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""
        self.count = 0
        # Set by the trainer's first poll: from then on a signal waits for the trainer to stop.
        self.armed = False
        # Set once the run's exit code is decided: a signal then only notes the stop. Raised in the last
        # flush, a second SIGTERM (SLURM resumes a stopped job with SIGCONT and SIGTERM together) turned a
        # decided "cancelled" (4) into a traceback and exit 1.
        self.finishing = False
        self.preempted = False  # the stop is a preemption (SIGUSR1), not a cancel

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


def term_is_preemption() -> bool:
    """Whether a SIGTERM here is a preemption: in a requeueable job, and not the agent's cancel."""
    marker = os.environ.get(PREEMPT_ON_TERM_VAR)
    return bool(marker) and not os.path.exists(marker)


def install_signal_handlers(flag: StopFlag) -> None:
    """Route SIGTERM and SIGINT to *flag* (main thread only; else a no-op)."""

    def handle(signum: int, frame: Optional[FrameType]) -> None:
        flag.count += 1
        name = signal.Signals(signum).name
        if flag.count == 1:
            flag.preempted = signum == signal.SIGUSR1 or (signum == signal.SIGTERM and term_is_preemption())
        flag.set(name)
        if flag.finishing:
            return
        stopped, verb = (Preempted, "Preempted") if flag.preempted else (Cancelled, "Cancelled")
        if not flag.armed:
            raise stopped("%s by %s before the trainer's loop began" % (verb, name))
        if flag.count > 1:
            raise stopped("%s by a second %s" % (verb, name))

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        try:
            signal.signal(sig, handle)
        except (ValueError, OSError):
            pass  # not the main thread: cancellation falls back to SIGKILL


def ignore_stop_signals() -> None:
    """Once the exit code is decided and reported. The interpreter's shutdown puts back the default handlers,
    and SLURM's scancel resumes a stopped job with SIGCONT and then SIGTERM: a SIGTERM landing during the
    shutdown killed a decided "cancelled" (4) as 143."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):
            pass  # not the main thread: nothing of ours was installed


def stop_when_orphaned(poll_s: float = ORPHAN_POLL_S, grace_s: float = ORPHAN_GRACE_S) -> None:
    """Stop this worker when the agent that started it dies (its parent changes).

    An agent killed with SIGKILL (the OOM killer, a user's kill -9) cannot
    stop its worker, and on a machine behind NAT nothing else can: the worker
    would hold the GPU for nobody. It stops itself as on a cancel (SIGTERM to
    itself), then exits after grace_s if the trainer has not stopped.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def stop_from_parent(grace_s: float = ORPHAN_GRACE_S) -> None:
    """A data-parallel rank's stops: its parent worker's, one line a signal on the rank's stdin (ranks.py).

    The rank shares the worker's process group, so a cancel sent to the group (the agent's, SLURM's)
    reaches it too; taken as well, it would count twice and cut short what the first one lets the trainer
    save. So the rank ignores the stop signals themselves and takes each once, from its parent: a reader
    thread rings the main thread (SIGUSR2), whose handler does what install_signal_handlers' would have
    done with that signal. End of stdin is the parent gone: the rank stops as on a cancel and exits after
    grace_s if still running. Call after install_signal_handlers, in the main thread.
    """
    handle = signal.getsignal(signal.SIGTERM)
    names = queue.Queue()  # type: queue.Queue[str]

    def take(line: str, frame: Optional[FrameType]) -> None:
        name = line.strip() if line.strip() in ("SIGTERM", "SIGINT", "SIGUSR1") else "SIGTERM"
        if callable(handle):
            handle(signal.Signals[name], frame)

    def ring(signum: int, frame: Optional[FrameType]) -> None:
        while not names.empty():
            take(names.get_nowait(), frame)

    def read() -> None:
        for line in sys.stdin:
            names.put(line)
            os.kill(os.getpid(), signal.SIGUSR2)
        names.put("SIGTERM")  # orphaned: the parent worker is gone
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(grace_s)
        os._exit(128 + signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, ring)
    # A stop the parent forwarded while this rank was starting is waiting on stdin: taken here and noted, not
    # raised (raised, it would escape before run() says how the rank ended: a traceback and exit 1). The flag
    # is set: run()'s check before fitting raises it.
    while select.select([sys.stdin], [], [], 0)[0]:
        line = sys.stdin.readline()
        if not line:
            break  # the parent is gone: the reader sees the end too
        try:
            take(line, None)
        except (Cancelled, Preempted):
            pass
    threading.Thread(target=read, name="parent-stops", daemon=True).start()
