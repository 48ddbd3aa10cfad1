"""Watching a launched run: the clocks and the stop policy, the same on every backend.

The clocks (API-4, AGT-4, AGT-7), one bound for every phase, so that no run
holds the run slot forever:
- a run is `running` from its agent's first contact; heartbeat silence is
  counted from the last contact, never from the launch, and in every phase in
  which an agent exists, a job pending in the scheduler's queue included;
- before the first contact, an executor's handle may say *waiting*: for a
  claim, for the scheduler (a queue), or for its setup (an ssh connect, a
  venv build). Each wait has its own deadline (queue_timeout_s,
  pending_timeout_s, setup_timeout_s). A handle that says *running* while its
  agent has not made contact yet gets heartbeat_timeout_s to make it;
- max_wall_seconds counts from the run's start (bundle, launch and setup
  included), or, for a run that waited in a queue, from the end of its wait.

The stop policy, written once: ask the agent to stop (the cancel flag it
long-polls), give it grace_seconds to stop its worker and report, then the
executor's hard stop, `kill()`. The hard stop never waits on Redis: with
Redis unreachable nobody can be asked, and kill() comes at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.executors.base import AgentResult, Gone, RunHandle, Status, Waiting
from potato_queue.run import FINAL_STATES, RunState, RunView
from potato_queue.store import RunStore
from potato_queue.store.lease import LEASE_TTL_S

__all__ = [
    "Outcome",
    "Watch",
    "supervise",
    "stop_run",
    "pending_expired",
    "redis_lost",
    "redis_emptied",
    "executor_stalled",
    "TICK_S",
    "CANCEL_MARGIN_S",
]

TICK_S = 0.1
# Looks come every TICK_S, or a Redis timeout (3 s) apart: a longer gap means this executor itself did not run
# (stopped, starved), so it saw nothing of the agent meanwhile.
LOOK_GAP_S = 5.0
# After asking the agent to stop, it gets grace_seconds to stop its worker and
# report (and its handle's hard_stop_s, for the agent's own hard stop); this much
# more covers the report's trip back before kill().
CANCEL_MARGIN_S = 3.0
# The result may be in flight while what the executor started exits.
GONE_SETTLE_S = 0.5


@dataclass(frozen=True)
class Outcome:
    """How supervision ended: the agent's result, and/or the state decided here and why."""

    result: AgentResult | None = None
    state: RunState | None = None  # failed or cancelled, when decided here
    error: str | None = None


@dataclass
class Watch:
    """One run under supervision: what the loop needs, and what it has seen so far."""

    run_id: str
    backend_name: str
    handle: RunHandle
    store: RunStore
    grace_s: float
    heartbeat_timeout_s: float
    max_wall_s: float | None
    started_s: float  # epoch seconds: the run's start
    launched_s: float  # epoch seconds: launch() returned
    renew_lease: Callable[[], bool]
    on_first_contact: Callable[[], None]
    log: Callable[[str], None]
    step: Callable[[str], None]
    last_output: Callable[[], str]  # the agent's last lines, for a run whose agent vanished
    # A SLURM job's time in the scheduler's queue, as its agent reports it (None: no bound).
    pending_timeout_s: float | None = None
    contacted: bool = False
    cancel_seen_s: float | None = None
    waiting_why: str | None = None
    waited_in_queue: bool = False  # the last wait was a queue's (its end starts the wall clock)
    pending_since_s: float | None = None
    redis_error: str | None = None  # the last look at the store failed (a Redis blip, so far)
    # When the executor could see again, after a Redis blip or a stall of its own (the agent's beats could not be
    # recorded, or read): silence counts from then (epoch s).
    seeing_since_s: float = 0.0
    looked_s: float | None = None  # the last look that worked (epoch s)
    lease_lapsed: Callable[[], bool] = lambda: False  # the slot expired unrenewed (Lease.lapsed)
    alive: Callable[[], None] = lambda: None  # each tick: this executor lives (RunPaths.supervised, on disk)
    clock: Clock = REAL_CLOCK  # every rule here reads it (tests hand in a ManualClock)


def _result(view: RunView) -> AgentResult | None:
    if view.exit_code is None:
        return None
    return AgentResult(view.exit_code, view.artifact_uri, view.message)


def _report_within_s(watch: Watch, grace_s: float) -> float:
    """How long after the ask to stop the agent's report may come: grace, the agent's hard stop, the trip."""
    return grace_s + watch.handle.hard_stop_s + CANCEL_MARGIN_S


def stop_run(watch: Watch, grace_s: float, state: RunState, error: str) -> Outcome:
    """Ask the agent to stop, wait up to grace_s (+ margin) for its report, then kill(): always, Redis or not."""
    _say(watch, error)
    result = None
    try:
        if grace_s > 0:
            watch.store.in_flight.signal_stop(watch.run_id)
            deadline = watch.clock.now_s() + _report_within_s(watch, grace_s)
            while result is None and watch.clock.now_s() < deadline and not isinstance(watch.handle.poll(), Gone):
                _wait(watch, TICK_S)
                result = _result(watch.store.view(watch.run_id))
    except redis.RedisError:
        pass  # nobody can be asked: the hard stop follows at once
    finally:
        watch.handle.kill()
    if result is None:
        try:
            result = _result(watch.store.view(watch.run_id))
        except redis.RedisError:
            pass
    return Outcome(result=result, state=state, error=error)


def _say(watch: Watch, line: str) -> None:
    """A line in run.log that never stands in the way of a stop (its disk error goes through Redis)."""
    try:
        watch.log(line)
    except redis.RedisError:
        pass


def redis_lost(error: str) -> str:
    """Why a run stopped when Redis stayed unreachable longer than the run slot's lease."""
    return (
        f"Redis was unreachable ({error}) for longer than the run slot's lease ({LEASE_TTL_S:g} s), so the run "
        "was stopped (a run may not go on without its slot); fix: check that Redis is running and reachable "
        "from the executor, then start the run again"
    )


def executor_stalled() -> str:
    """Why a run stopped when its executor did not renew the run slot in time, and Redis was not the cause."""
    return (
        f"This executor did not renew the run slot within its lease ({LEASE_TTL_S:g} s): it was stalled (stopped, "
        "or starved of CPU or memory), and the slot was free meanwhile, so the run was stopped; fix: check the "
        "executor's machine (load, swap, a process left stopped), then start the run again"
    )


def redis_emptied() -> str:
    """Why a run stopped when Redis lost its data mid-run: its token went too, so its agent is refused."""
    return (
        "Redis lost its data during the run (restarted without persistence, or flushed), and the run's token "
        "with it, so the run was stopped; fix: start the run again, and give Redis persistence (appendonly yes) "
        "so that a Redis restart does not stop a run"
    )


def pending_expired(backend_name: str, limit_s: float, step: str) -> str:
    """A SLURM job that stayed pending past pending_timeout_s."""
    return (
        f"The SLURM job waited in the scheduler's queue for more than pending_timeout_s ({limit_s:g} s) "
        f"({step}); it was cancelled. Fix: raise pending_timeout_s of backend {backend_name}, or ask for "
        "less (partition, gres, time) so that the scheduler can start it sooner"
    )


def _gone(watch: Watch, gone: Gone) -> Outcome:
    watch.clock.wait(GONE_SETTLE_S)
    result = _result(watch.store.view(watch.run_id))
    if result is not None:
        return Outcome(result=result)
    watch.handle.kill()
    if gone.error is not None:
        error = gone.error + (f"; fix: {gone.fix}" if gone.fix else "")
    else:
        tail = watch.last_output()
        error = f"The agent stopped without reporting a result ({gone.why})" + (
            f"; its last output: {tail}" if tail else ""
        )
    watch.log(error)
    return Outcome(state=RunState.FAILED, error=error)


def _overdue(watch: Watch, view: RunView, status: object, now_s: float) -> str | None:
    """The failure message when a clock has run out, else None."""
    if isinstance(status, Waiting):
        if watch.waiting_why != status.why:
            watch.waiting_why = status.why
            watch.step(status.why)
        watch.waited_in_queue = not status.run_time
        if _past_deadline(status, now_s):
            return status.expired or f"The run was still waiting past its deadline: {status.why}"
        if not status.beats:
            return None
    limit_s = watch.heartbeat_timeout_s
    if view.heartbeat_at is None:
        if now_s - max(watch.launched_s, watch.seeing_since_s) > limit_s:
            return f"The agent on {watch.backend_name} made no contact within {limit_s:g} seconds of its start"
        return None
    if now_s - max(view.heartbeat_at, watch.seeing_since_s) > limit_s:
        return f"No word from the agent on {watch.backend_name} for {limit_s:g} seconds"
    return None


def _past_deadline(status: Waiting, now_s: float) -> bool:
    return status.until_s is not None and now_s > status.until_s


def _pending(watch: Watch, view: RunView, status: Status, now_s: float) -> Status:
    """The agent runs, its worker waits for the scheduler: a queue whose agent beats, bounded by pending_timeout_s."""
    if view.pending_step is None or isinstance(status, Waiting):
        watch.pending_since_s = None
        return status
    if watch.pending_since_s is None:
        watch.pending_since_s = now_s
    limit_s = watch.pending_timeout_s
    until_s = None if limit_s is None else watch.pending_since_s + limit_s
    expired = None if limit_s is None else pending_expired(watch.backend_name, limit_s, view.pending_step)
    return Waiting(view.pending_step, until_s, expired, beats=True)


def _slot_lost(watch: Watch) -> Outcome:
    """The run slot was not renewed in time: Redis did not answer, this executor stalled, or another took it."""
    if watch.redis_error is not None:
        return stop_run(watch, 0, RunState.FAILED, redis_lost(watch.redis_error))
    if watch.lease_lapsed():
        return stop_run(watch, watch.grace_s, RunState.FAILED, executor_stalled())
    return stop_run(
        watch,
        watch.grace_s,
        RunState.FAILED,
        "This executor lost the run slot (Redis emptied, or another executor took it); the run was stopped",
    )


def _tick(watch: Watch) -> Outcome | None:
    """One look at the run: an Outcome when supervision is over, else None."""
    watch.alive()
    if not watch.renew_lease():
        return _slot_lost(watch)
    try:
        return _look(watch)
    except redis.RedisError as exc:
        watch.redis_error = str(exc)  # a blip: the run goes on while the slot is still ours (the lease)
        return None


def _look(watch: Watch) -> Outcome | None:
    view = watch.store.view(watch.run_id)
    if not watch.renew_lease():
        # Stalled between the renew and this view (the agent's result, or a clock, may have come meanwhile):
        # the slot was free, so the stall decides, as it would have a moment earlier. Mostly a no-op: the
        # lease is renewed once a second.
        return _slot_lost(watch)
    now_s = watch.clock.now_s()
    if watch.redis_error is not None or (watch.looked_s is not None and now_s - watch.looked_s > LOOK_GAP_S):
        watch.seeing_since_s = now_s
    watch.redis_error, watch.looked_s = None, now_s
    if not watch.contacted and view.heartbeat_at is not None:
        # Before the result: an agent quick enough to report before the first look has still made contact,
        # and a run must be `running` before it can be collected.
        watch.contacted = True
        watch.on_first_contact()
    result = _result(view)
    if result is not None:
        return Outcome(result=result)
    if view.state in FINAL_STATES:  # a run still queued (unclaimed) is cancelled by the API directly
        watch.handle.kill()
        return Outcome(state=RunState(view.state), error=None)
    if view.disk_error:
        return stop_run(watch, watch.grace_s, RunState.FAILED, f"{view.disk_error}; the run was stopped")
    if watch.contacted and not view.has_token:  # issued before contact, revoked only with a final state
        return stop_run(watch, 0, RunState.FAILED, redis_emptied())
    if watch.cancel_seen_s is None and view.cancel_requested:
        watch.cancel_seen_s = now_s
        watch.step("cancelling: asking the worker to stop")
    if watch.cancel_seen_s is not None and now_s - watch.cancel_seen_s > _report_within_s(watch, watch.grace_s):
        return stop_run(
            watch,
            0,
            RunState.CANCELLED,
            f"cancelled; the agent did not report within {watch.grace_s:g} s, so it was stopped",
        )
    status = watch.handle.poll()
    if isinstance(status, Gone):
        return _gone(watch, status)
    if watch.cancel_seen_s is not None and isinstance(status, Waiting) and not watch.contacted:
        # Nobody to ask yet: a setup is stopped, a scheduler's queued job withdrawn (the handle's kill).
        stopped = "the setup was stopped" if status.run_time else "it never started"
        return stop_run(watch, 0, RunState.CANCELLED, f"cancelled while {status.why}; {stopped}")
    status = _pending(watch, view, status, now_s)
    if not isinstance(status, Waiting) and watch.waiting_why is not None:
        # The wait is over (a claim, a job started, a setup done): an agent's time to make its first contact
        # counts from now (a first venv build longer than heartbeat_timeout_s is no silence), and, after a
        # queue, the wall clock too.
        if watch.waited_in_queue:
            watch.started_s = now_s
        watch.seeing_since_s = now_s  # a requeued job's new agent: the last one's silence is not its own
        watch.waiting_why = None
        if not watch.contacted:
            watch.launched_s = now_s
    return _clocks(watch, view, status, now_s)


def _clocks(watch: Watch, view: RunView, status: Status, now_s: float) -> Outcome | None:
    """The heartbeat's silence, a wait's deadline and the wall clock: the run stopped when one ran out."""
    overdue = _overdue(watch, view, status, now_s)
    if overdue is not None:
        # An agent that beats is asked to stop (it cancels its pending job); a silent one is not waited for.
        grace_s = watch.grace_s if isinstance(status, Waiting) and status.beats and _past_deadline(status, now_s) else 0
        return stop_run(watch, grace_s, RunState.FAILED, overdue)
    if isinstance(status, Waiting) and not status.run_time:
        return None  # the wall clock starts when the run leaves its queue, not while it waits in one
    if watch.max_wall_s and now_s - watch.started_s > watch.max_wall_s and watch.cancel_seen_s is None:
        still = f" (still {status.why})" if isinstance(status, Waiting) else ""
        grace_s = watch.grace_s if watch.contacted else 0  # nobody to ask before the agent's first call
        return stop_run(
            watch,
            grace_s,
            RunState.FAILED,
            f"The run did not finish within max_wall_seconds ({watch.max_wall_s:g} s) and was stopped{still}",
        )
    return None


def _sleep_s(watch: Watch, tick_s: float) -> float:
    """Up to a tick, but no later than the wall limit: it is then met to the millisecond, not the tick."""
    if not watch.max_wall_s or watch.cancel_seen_s is not None:
        return tick_s
    return max(0.001, min(tick_s, watch.started_s + watch.max_wall_s - watch.clock.now_s() + 0.001))


def _wait(watch: Watch, seconds: float) -> None:
    """Up to `seconds`, waking as soon as the agent's result arrives (a plain wait while Redis is away)."""

    def woken(wait_s: float) -> None:
        try:
            watch.store.in_flight.wait_result(watch.run_id, wait_s)
        except redis.RedisError:
            watch.clock.wait(wait_s)

    watch.clock.wait(seconds, woken)


def supervise(watch: Watch, tick_s: float = TICK_S) -> Outcome:
    """Watch a launched run until its agent reports, or cancel, a clock or its loss ends it."""
    while True:
        outcome = _tick(watch)
        if outcome is not None:
            return outcome
        _wait(watch, _sleep_s(watch, tick_s))
