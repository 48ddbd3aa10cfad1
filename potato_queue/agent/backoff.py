"""The agent's one retry policy: every retrying loop of the agent goes through `Backoff` (and `retry`).

Standard library only, Python 3.8+: this file is copied to bare hosts. Its own
module because it is shared by callers that are not HTTP requests of the
transport: the event sender, the heartbeat and the control long-poll
(relay.py) retry through it too, so a server that is away is met the same way
by every call: delays from 0.2 s doubling to 5 s, the first failure and every
10th logged, Unreachable once the caller's deadline, try count or stop event
says so.
"""

import threading
import time
from typing import Callable, Optional, TypeVar

from potato_queue.agent.errors import Retryable, Unreachable

__all__ = ["Backoff", "retry", "problem_of", "FIRST_DELAY_S", "MAX_DELAY_S"]

FIRST_DELAY_S = 0.2
MAX_DELAY_S = 5.0
LOG_EVERY = 10

Log = Callable[[str], None]
T = TypeVar("T")


def problem_of(exc: BaseException) -> str:
    """An exception in words for a log line: its type and message."""
    return "{}: {}".format(type(exc).__name__, exc)


def _no_log(message: str) -> None:
    pass


class Backoff:
    """The agent's one retry policy: how long to wait after a failure, what to log, when to give up.

    give_up_s None, max_tries None and no stop: retry for ever (the long-lived
    loops, where AGT-7's silence_s decides that the server is lost). `stop`
    makes the waits end early, and the policy give up, once it is set.
    """

    def __init__(
        self,
        what: str,
        log: Optional[Log] = None,
        give_up_s: Optional[float] = None,
        max_tries: Optional[int] = None,
        stop: Optional[threading.Event] = None,
        target: str = "the server",
    ) -> None:
        self.what = what
        self.target = target
        self.max_tries = max_tries
        self.failures = 0  # since the last success
        self.problem = "no try made"
        self._log = log or _no_log
        self._deadline = None if give_up_s is None else time.monotonic() + give_up_s
        self._stop = stop
        self._delay_s = FIRST_DELAY_S

    def failed(self, problem: str) -> bool:
        """Count a failure and wait before the next try; False (at once) when it is time to give up."""
        self.failures += 1
        self.problem = problem
        if self._out_of_patience():
            return False
        if self.failures == 1 or self.failures % LOG_EVERY == 0:
            tries = " (try {} of {})".format(self.failures, self.max_tries) if self.max_tries else ""
            self._log("{}: {}{}; retrying in {:g} s".format(self.what, problem, tries, self._delay_s))
        if self._stop is not None:
            self._stop.wait(self._delay_s)
        else:
            time.sleep(self._delay_s)
        self._delay_s = min(self._delay_s * 2, MAX_DELAY_S)
        return not (self._stop is not None and self._stop.is_set())

    def _out_of_patience(self) -> bool:
        if self.max_tries is not None and self.failures >= self.max_tries:
            return True
        if self._deadline is not None and time.monotonic() + self._delay_s > self._deadline:
            return True
        return self._stop is not None and self._stop.is_set()

    def succeeded(self) -> None:
        """An answer came: the next failure starts from the first delay again."""
        self.failures = 0
        self._delay_s = FIRST_DELAY_S

    def unreachable(self) -> Unreachable:
        """The exception to raise once the policy gave up."""
        return Unreachable("{}: no answer from {} ({})".format(self.what, self.target, self.problem))


def retry(attempt: Callable[[], T], policy: Backoff) -> T:
    """attempt() until it returns; Retryable goes through the policy, anything else (ApiError) propagates.

    Unreachable once the policy gives up.
    """
    while True:
        try:
            result = attempt()
        except Retryable as exc:
            if not policy.failed(exc.problem):
                raise policy.unreachable() from None
            continue
        policy.succeeded()
        return result
