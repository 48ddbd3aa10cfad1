"""The clocks of runs/supervise.py against a real Redis and a real run record, on a manual clock.

Time is a ManualClock (clock.py): a 30-second timeout costs no 30 s, and each
rule is checked to the tick. The handles here are scripted: they stand for backends whose executors do
not exist yet (an agent mailbox waiting for a claim, a SLURM job pending in
its queue), so that what the lifecycle does with *waiting* is pinned down
before those backends are built. The local backend's real handle goes
through all of this in tests/e2e/runs/test_contract.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from potato_queue.clock import ManualClock
from potato_queue.executors.base import AgentResult, Gone, RunHandle, Running, Status, Waiting
from potato_queue.runs.supervise import CANCEL_MARGIN_S, TICK_S, Watch, supervise
from potato_queue.store import RunStore
from potato_queue.validate import load_checked
from tests.lifecycle_helpers import make_project

pytestmark = pytest.mark.unit


class ScriptedHandle(RunHandle):
    """A backend's handle whose status the test sets."""

    def __init__(self, status: Status) -> None:
        self.status = status
        self.killed = 0

    def poll(self) -> Status:
        return self.status

    def kill(self) -> None:
        self.killed += 1

    def collect(self, result: AgentResult) -> str | None:
        return None


@pytest.fixture
def store(tmp_path: Path, redis_server_url: str) -> Iterator[RunStore]:
    config = load_checked(make_project(tmp_path))
    yield RunStore(config, redis.Redis.from_url(redis_server_url), clock=ManualClock())


def clock_of(store: RunStore) -> ManualClock:
    assert isinstance(store.clock, ManualClock)
    return store.clock


def at(store: RunStore, seconds: float, action: Callable[[], None]) -> None:
    """Do `action` once the clock reaches `seconds` from now (the next wait past it)."""
    clock, when = clock_of(store), clock_of(store).now_s() + seconds
    done: list[bool] = []
    before = clock.on_wait

    def act(now_s: float) -> None:
        if before is not None:
            before(now_s)
        if not done and now_s >= when:
            done.append(True)
            action()

    clock.on_wait = act


def watch_of(
    store: RunStore, handle: RunHandle, *, heartbeat_timeout_s: float = 30, max_wall_s: float | None = None
) -> tuple[Watch, list[float], list[str]]:
    run_id = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
    store.tokens.issue(run_id, 3600)  # as the lifecycle does before the launch
    contacts: list[float] = []
    steps: list[str] = []
    clock = store.clock
    now = clock.now_s()
    watch = Watch(
        run_id=run_id,
        backend_name="box",
        handle=handle,
        store=store,
        grace_s=2,
        heartbeat_timeout_s=heartbeat_timeout_s,
        max_wall_s=max_wall_s,
        started_s=now,
        launched_s=now,
        renew_lease=lambda: True,
        on_first_contact=lambda: contacts.append(clock.now_s()),
        log=lambda _: None,
        step=steps.append,
        last_output=lambda: "",
        clock=clock,
    )
    return watch, contacts, steps


def elapsed(store: RunStore, since_s: float) -> float:
    return store.clock.now_s() - since_s


def test_a_waiting_run_is_bounded_by_its_own_deadline_not_the_heartbeat(store: RunStore) -> None:
    began = store.clock.now_s()
    handle = ScriptedHandle(Waiting("waiting for an agent on box", until_s=began + 90))
    watch, contacts, steps = watch_of(store, handle, heartbeat_timeout_s=20)
    outcome = supervise(watch)
    assert 90 <= elapsed(store, began) <= 90 + TICK_S, "the heartbeat timeout ended a waiting run"
    assert (outcome.state, outcome.error) == (
        "failed",
        "The run was still waiting past its deadline: waiting for an agent on box",
    )
    assert steps == ["waiting for an agent on box"] and contacts == [] and handle.killed == 1


def test_an_unbounded_wait_outlasts_the_heartbeat_then_the_run_starts_at_first_contact(store: RunStore) -> None:
    handle = ScriptedHandle(Waiting("waiting for an agent on box"))
    watch, contacts, _ = watch_of(store, handle, heartbeat_timeout_s=20)
    began = store.clock.now_s()

    def claimed() -> None:
        handle.status = Running()
        store.touch_heartbeat(watch.run_id)
        at(store, 5, lambda: store.record_result(watch.run_id, 0, "box:/work", None))

    at(store, 100, claimed)  # five heartbeat timeouts while waiting
    outcome = supervise(watch)
    assert outcome.state is None and outcome.result == AgentResult(0, "box:/work", None)
    assert len(contacts) == 1 and 100 <= contacts[0] - began <= 100 + TICK_S


def test_a_pending_job_whose_agent_went_quiet_is_not_failed_by_the_heartbeat(store: RunStore) -> None:
    """SLURM's case: the agent made contact, then its job sits PENDING; the handle says waiting."""
    handle = ScriptedHandle(Waiting("SLURM job 42: PENDING (Priority)", until_s=store.clock.now_s() + 60))
    watch, contacts, _ = watch_of(store, handle, heartbeat_timeout_s=10)
    store.touch_heartbeat(watch.run_id)
    outcome = supervise(watch)
    assert outcome.error == "The run was still waiting past its deadline: SLURM job 42: PENDING (Priority)"
    assert len(contacts) == 1


def test_silence_after_contact_fails_with_no_word(store: RunStore) -> None:
    watch, _, _ = watch_of(store, ScriptedHandle(Running()), heartbeat_timeout_s=30)
    store.touch_heartbeat(watch.run_id)
    began = store.clock.now_s()
    outcome = supervise(watch)
    assert (outcome.state, outcome.error) == ("failed", "No word from the agent on box for 30 seconds")
    assert 30 <= elapsed(store, began) <= 30 + TICK_S


def test_an_agent_that_never_makes_contact_fails_saying_so(store: RunStore) -> None:
    handle = ScriptedHandle(Running())
    watch, _, _ = watch_of(store, handle, heartbeat_timeout_s=30)
    outcome = supervise(watch)
    assert outcome.error == "The agent on box made no contact within 30 seconds of its start"
    assert handle.killed == 1


def test_a_gone_handle_fails_unless_the_result_is_in(store: RunStore) -> None:
    handle = ScriptedHandle(Gone("the session dropped"))
    watch, _, _ = watch_of(store, handle)
    outcome = supervise(watch)
    assert outcome.state == "failed"
    assert outcome.error == "The agent stopped without reporting a result (the session dropped)"
    handle2 = ScriptedHandle(Gone("the agent exited"))
    watch2, _, _ = watch_of(store, handle2)
    store.record_result(watch2.run_id, 4, None, "cancel requested")
    assert supervise(watch2).result == AgentResult(4, None, "cancel requested")


def test_the_wall_clock_asks_the_agent_to_stop_then_kills(store: RunStore) -> None:
    handle = ScriptedHandle(Running())
    watch, _, _ = watch_of(store, handle, heartbeat_timeout_s=1000, max_wall_s=300)
    store.touch_heartbeat(watch.run_id)
    began = store.clock.now_s()
    outcome = supervise(watch)
    assert outcome.error == "The run did not finish within max_wall_seconds (300 s) and was stopped"
    assert store.in_flight.cancel_requested(watch.run_id) and handle.killed == 1
    # Asked at the limit to the millisecond, then grace (2 s) and the report's margin before the kill.
    assert 300 + 2 + CANCEL_MARGIN_S <= elapsed(store, began) <= 300 + 2 + CANCEL_MARGIN_S + 2 * TICK_S


def test_a_batch_jobs_hard_stop_is_waited_for_before_the_executor_kills(store: RunStore) -> None:
    """A SLURM job's agent stops a worker deaf to SIGTERM with scancel: grace, then SLURM's KillWait and a poll
    of the queue, before it can report. The executor waits that long (the handle's hard_stop_s) for the report,
    so the run keeps the worker's own end; only past it does the executor kill and say the agent was late."""
    handle = ScriptedHandle(Running())
    handle.hard_stop_s = 32.0
    watch, _, _ = watch_of(store, handle, heartbeat_timeout_s=1000)
    store.touch_heartbeat(watch.run_id)
    store.in_flight.signal_stop(watch.run_id)
    at(store, 2 + 30, lambda: store.record_result(watch.run_id, 4, None, "cancelled"))
    outcome = supervise(watch)
    assert outcome.result == AgentResult(4, None, "cancelled") and handle.killed == 0

    late = ScriptedHandle(Running())
    late.hard_stop_s = 32.0
    watch, _, _ = watch_of(store, late, heartbeat_timeout_s=1000)
    store.touch_heartbeat(watch.run_id)
    store.in_flight.signal_stop(watch.run_id)
    began = store.clock.now_s()
    outcome = supervise(watch)
    assert (outcome.state, outcome.error) == (
        "cancelled",
        "cancelled; the agent did not report within 2 s, so it was stopped",
    )
    assert late.killed == 1
    assert 2 + 32 + CANCEL_MARGIN_S <= elapsed(store, began) <= 2 + 32 + CANCEL_MARGIN_S + 2 * TICK_S


def test_a_run_waiting_past_its_wall_deadline_keeps_being_watched(tmp_path: Path, redis_server_url: str) -> None:
    """While a job waits in a scheduler its wall clock does not run, and supervise sleeps its shortest wait:
    Redis 6.2 (the embedded one) took a 1 ms BLPOP for "block forever", and nothing was checked again.
    Real time: what is checked is the real BLPOP."""
    real = RunStore(load_checked(make_project(tmp_path)), redis.Redis.from_url(redis_server_url))
    handle = ScriptedHandle(Waiting("SLURM job 3: PENDING (Resources)", until_s=time.time() + 1.0))
    watch, _, _ = watch_of(real, handle, max_wall_s=0.2)
    watch.started_s = watch.launched_s = time.time() - 5  # the wall deadline is 4.8 s gone
    began = time.monotonic()
    outcome = supervise(watch)
    assert time.monotonic() - began < 4, "supervise stopped ticking while the run waited"
    assert outcome.error == "The run was still waiting past its deadline: SLURM job 3: PENDING (Resources)"


def test_the_time_to_make_contact_counts_from_the_end_of_the_wait(store: RunStore) -> None:
    """A first setup (an ssh host building the venv) that takes longer than heartbeat_timeout_s is a wait,
    not a silence: the agent then started gets the whole heartbeat_timeout_s to make contact."""
    handle = ScriptedHandle(Waiting("setting up box: building the venv"))
    watch, _, steps = watch_of(store, handle, heartbeat_timeout_s=30)
    began = store.clock.now_s()
    at(store, 200, lambda: setattr(handle, "status", Running()))
    outcome = supervise(watch)
    assert 230 <= elapsed(store, began) <= 230 + 2 * TICK_S, "the wait's time was counted against the first contact"
    assert outcome.error == "The agent on box made no contact within 30 seconds of its start"
    assert steps[0] == "setting up box: building the venv"


def test_a_redis_blip_is_no_silence_the_agent_is_heard_again_once_redis_answers(store: RunStore) -> None:
    """While Redis does not answer, the agent's beats cannot be recorded: its silence counts from when the
    executor sees again, not from the last beat before the blip."""
    watch, _, _ = watch_of(store, ScriptedHandle(Running()), heartbeat_timeout_s=5)
    store.touch_heartbeat(watch.run_id)
    began, blind, real_view = store.clock.now_s(), [], store.view

    def view(run_id: str):  # type: ignore[no-untyped-def]
        if blind:
            raise redis.ConnectionError("Error 111 connecting to redis: Connection refused")
        return real_view(run_id)

    store.view = view  # type: ignore[method-assign]
    at(store, 1, lambda: blind.append(True))
    at(store, 8, blind.clear)
    at(store, 11, lambda: store.touch_heartbeat(watch.run_id))  # the agent's next beat that got through
    outcome = supervise(watch)
    assert (outcome.state, outcome.error) == ("failed", "No word from the agent on box for 5 seconds")
    assert 16 <= elapsed(store, began) <= 16 + 2 * TICK_S, "silence counted from the beat at 11 s, not from 0 s"


def test_a_stall_of_the_executor_itself_is_no_silence_of_the_agent(store: RunStore) -> None:
    """The executor stopped for 15 s between two looks (SIGSTOP, a suspended VM): the agent's beats meanwhile
    went unseen, so its silence counts from the first look after, not from the last beat seen before."""
    watch, _, _ = watch_of(store, ScriptedHandle(Running()), heartbeat_timeout_s=5)
    store.touch_heartbeat(watch.run_id)
    began = store.clock.now_s()
    at(store, 2, lambda: clock_of(store).advance(15))  # the executor did not run from 2 s to 17 s
    at(store, 19, lambda: store.touch_heartbeat(watch.run_id))
    outcome = supervise(watch)
    assert (outcome.state, outcome.error) == ("failed", "No word from the agent on box for 5 seconds")
    assert 24 <= elapsed(store, began) <= 24 + 2 * TICK_S, "silence counted from the beat at 19 s"


def test_the_run_stops_saying_redis_lost_its_data_when_the_runs_token_is_gone(store: RunStore) -> None:
    from potato_queue.runs.supervise import redis_emptied

    handle = ScriptedHandle(Running())
    watch, _, _ = watch_of(store, handle)
    store.touch_heartbeat(watch.run_id)
    at(store, 3, lambda: store.redis.delete(store.keys.run_token(watch.run_id)))  # as a restart without persistence
    outcome = supervise(watch)
    assert (outcome.state, outcome.error) == ("failed", redis_emptied()) and handle.killed


def test_a_slot_emptied_by_a_flush_is_taken_back_and_one_that_expired_unrenewed_is_lost(store: RunStore) -> None:
    from potato_queue.store.lease import LEASE_RENEW_S, LEASE_TTL_S

    lease = store.slot_lease()
    assert lease.try_take()
    store.redis.delete(lease.key)  # a flush
    lease._renewed -= LEASE_RENEW_S  # due for its renewal
    assert lease.renew() and not lease.lapsed
    store.redis.delete(lease.key)  # expired while this process was stopped for longer than the lease
    lease._renewed -= LEASE_TTL_S
    assert not lease.renew() and lease.lapsed
