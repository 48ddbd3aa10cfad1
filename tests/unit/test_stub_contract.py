"""The executor contract in process, for every backend type: the real lifecycle, a stub agent, a manual clock.

Each case runs RunLife (bundle, job, supervision, finalize, the states in a real
Redis and a real run folder) against tests/stub_backend.py's stub of one backend
type, on a ManualClock: the clocks are checked to the tick, in milliseconds, on
every type. tests/e2e/runs/test_contract.py runs the same behaviours end to end, with the
real executors and real processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from potato_queue.clock import ManualClock
from potato_queue.executors.base import Executor
from potato_queue.run import RunState
from potato_queue.runs.lifecycle import RunLife
from potato_queue.runs.supervise import CANCEL_MARGIN_S, TICK_S
from potato_queue.store import RunStore
from potato_queue.validate import load_checked
from tests.lifecycle_helpers import make_project
from tests.stub_backend import (
    CONNECT_S,
    PENDING_S,
    PUSH_TYPES,
    TYPES,
    PullAgentExecutor,
    Script,
    StubAgent,
    StubExecutor,
    StubExecutors,
    in_hands_s,
)

pytestmark = pytest.mark.unit

BACKENDS: dict[str, dict[str, Any]] = {
    "ssh": {"type": "ssh", "host": "gpu-box", "remote_dir": "/srv/runs"},
    "slurm": {"type": "slurm", "host": "login", "remote_dir": "/srv/runs"},
    "agent": {"type": "agent"},
}
# How late a clock may fire: one supervision tick, and the scripted agent's one-second beat.
SLACK_S = TICK_S + 1.0


@dataclass
class Ran:
    """A finished run: its record, when it ended on the clock, the stub's agent and executor."""

    record: dict[str, Any]
    ended_s: float  # seconds from the launch
    agent: StubAgent
    executor: Executor
    log: str


Runner = Callable[..., Ran]


@pytest.fixture
def run_stub(tmp_path: Path, redis_server_url: str) -> Iterator[Runner]:
    def run(kind: str, script: Script, **training: Any) -> Ran:
        name = kind if kind in BACKENDS else "local"
        backend = {**BACKENDS.get(kind, {}), **training.pop("backend_settings", {})}
        folder = tmp_path / kind
        folder.mkdir(exist_ok=True)
        config = load_checked(make_project(folder, backends={name: backend} if backend else {}, **training))
        clock = ManualClock()
        store = RunStore(config, redis.Redis.from_url(redis_server_url), clock=clock)
        store.presence.record_server_url("http://127.0.0.1:9", "http://127.0.0.1:9", 3600)
        agent = StubAgent(script, store, clock, kind)
        executor: Executor
        if kind == "agent":
            agent.token = store.agents.issue(name)
            executor = PullAgentExecutor(name, config.model_training.backend_config(name))
            executor.agent = agent  # type: ignore[attr-defined]
        else:
            executor = StubExecutor(kind, name, agent, config.model_training.backend_config(name))
        record = store.create(trainer="majority-baseline", schemas=["sentiment"], backend=name)
        held = store.transition(record["run_id"], RunState.QUEUED if executor.pull else RunState.STARTING, record)
        assert held is not None
        lease = store.slot_lease()
        assert lease.try_take()
        try:
            RunLife(config, store, StubExecutors(executor), held, lease, clock.now_s()).run()  # type: ignore[arg-type]
        finally:
            lease.release()
        return Ran(
            dict(store.get(held["run_id"])),
            clock.now_s() - agent.launched_s,
            agent,
            executor,
            store.paths(held["run_id"]).run_log.read_text(),
        )

    yield run


def _name(kind: str) -> str:
    return kind if kind in BACKENDS else "local"


def _heartbeat(kind: str, seconds: float) -> dict[str, Any]:
    """heartbeat_timeout_s where the backend type reads it: its own backend's setting, else the local one."""
    return (
        {"backend_settings": {"heartbeat_timeout_s": seconds}} if kind in BACKENDS else {"heartbeat_timeout_s": seconds}
    )


@pytest.mark.parametrize("kind", TYPES)
def test_a_run_succeeds_collects_and_is_scored(run_stub: Runner, kind: str) -> None:
    script = Script()
    ran = run_stub(kind, script)
    record = ran.record
    assert record["state"] == RunState.SUCCEEDED and record["exit_code"] == 0, ran.log
    assert record["held_out"]["sentiment"]["test"]["accuracy"] == 1.0, "the stub predicted the gold labels"
    assert record["prelabels"]["said"].startswith("published "), record["prelabels"]
    done_s = in_hands_s(kind, script) + script.finish_s  # type: ignore[operator]
    assert done_s <= ran.ended_s <= done_s + SLACK_S, ran.ended_s
    if kind == "agent":
        assert "claimed by the agent on stub" in ran.log
        assert record["artifact_uri"] is None  # the model stays on the machine behind NAT
    else:
        assert record["artifact_uri"] == "stub://model" and ran.agent.killed == 0


@pytest.mark.parametrize("kind", TYPES)
def test_cancel_within_grace_ends_cancelled_with_the_workers_exit_4(run_stub: Runner, kind: str) -> None:
    cancel_at_s = in_hands_s(kind, Script()) + 2
    ran = run_stub(kind, Script(finish_s=1000, cancel_at_s=cancel_at_s), grace_seconds=5)
    assert (ran.record["state"], ran.record["exit_code"]) == (RunState.CANCELLED, 4), ran.log
    assert "cancel requested" in ran.log
    assert ran.ended_s <= cancel_at_s + 1 + SLACK_S, "the agent stopped within a second of being told"


@pytest.mark.parametrize("kind", TYPES)
def test_an_agent_deaf_to_cancel_is_stopped_after_grace(run_stub: Runner, kind: str) -> None:
    cancel_at_s = in_hands_s(kind, Script()) + 2
    ran = run_stub(kind, Script(finish_s=1000, stop_after_s=None, cancel_at_s=cancel_at_s), grace_seconds=3)
    assert ran.record["state"] == RunState.CANCELLED, ran.log
    assert ran.record["error"] == "cancelled; the agent did not report within 3 s, so it was stopped"
    waited_s = ran.ended_s - cancel_at_s
    assert 3 + CANCEL_MARGIN_S <= waited_s <= 3 + CANCEL_MARGIN_S + SLACK_S, waited_s
    if kind != "agent":
        assert ran.agent.killed >= 1, "the executor's hard stop ran"


@pytest.mark.parametrize("kind", PUSH_TYPES)
def test_an_agent_that_vanishes_fails_the_run_at_once(run_stub: Runner, kind: str) -> None:
    vanish_s = in_hands_s(kind, Script()) + 3
    ran = run_stub(kind, Script(finish_s=1000, vanish_s=vanish_s), **_heartbeat(kind, 60))
    assert ran.record["state"] == RunState.FAILED
    assert ran.record["error"].startswith("The agent stopped without reporting a result (the agent process exited)")
    assert ran.ended_s <= vanish_s + SLACK_S, "a push backend sees its agent go: no heartbeat timeout is waited for"


def test_an_agent_behind_nat_that_vanishes_is_known_only_by_its_silence(run_stub: Runner) -> None:
    vanish_s = in_hands_s("agent", Script()) + 3
    ran = run_stub("agent", Script(finish_s=1000, vanish_s=vanish_s), **_heartbeat("agent", 30))
    assert (ran.record["state"], ran.record["error"]) == (
        RunState.FAILED,
        "No word from the agent on agent for 30 seconds",
    )
    assert vanish_s + 29 <= ran.ended_s <= vanish_s + 30 + SLACK_S, ran.ended_s


@pytest.mark.parametrize("kind", TYPES)
def test_silence_fails_the_run_after_heartbeat_timeout_s(run_stub: Runner, kind: str) -> None:
    silent_s = in_hands_s(kind, Script()) + 5
    ran = run_stub(kind, Script(finish_s=1000, silent_from_s=silent_s), **_heartbeat(kind, 30))
    assert (ran.record["state"], ran.record["error"]) == (
        RunState.FAILED,
        f"No word from the agent on {_name(kind)} for 30 seconds",
    )
    assert silent_s + 29 <= ran.ended_s <= silent_s + 30 + SLACK_S, ran.ended_s


@pytest.mark.parametrize("kind", TYPES)
def test_max_wall_seconds_stops_a_run_whose_agent_still_beats(run_stub: Runner, kind: str) -> None:
    """A worker hung mid-training while its agent keeps beating: only the wall limit ends the run, counted
    from the moment it left its queue (a claim, a pending job; an ssh setup is run time), then grace for the
    agent to report."""
    ran = run_stub(kind, Script(finish_s=10_000, stop_after_s=None), max_wall_seconds=100, grace_seconds=2)
    assert ran.record["state"] == RunState.FAILED, ran.log
    assert ran.record["error"] == "The run did not finish within max_wall_seconds (100 s) and was stopped"
    # A local or ssh run left the queue when it started (its connection counts); a claim or a pending
    # job's start is where the others' queue ends.
    waited_s = 0.0 if kind in ("local", "ssh") else in_hands_s(kind, Script())
    limit_s = waited_s + 100 + 2 + CANCEL_MARGIN_S
    assert limit_s - SLACK_S <= ran.ended_s <= limit_s + SLACK_S, (ran.ended_s, limit_s)


@pytest.mark.parametrize("kind", PUSH_TYPES)
def test_an_agent_that_never_makes_contact_fails_after_heartbeat_timeout_s(run_stub: Runner, kind: str) -> None:
    ran = run_stub(kind, Script(contact_s=None), **_heartbeat(kind, 20))
    assert ran.record["state"] == RunState.FAILED
    assert ran.record["error"] == f"The agent on {_name(kind)} made no contact within 20 seconds of its start"
    started_s = CONNECT_S.get(kind, 0.0)  # the wait for the connection is not the agent's silence
    assert started_s + 20 <= ran.ended_s <= started_s + 20 + SLACK_S, ran.ended_s


def test_a_run_no_agent_claims_fails_at_queue_timeout_s_saying_how_to_start_one(run_stub: Runner) -> None:
    ran = run_stub("agent", Script(contact_s=None), backend_settings={"queue_timeout_s": 300})
    assert ran.record["state"] == RunState.FAILED
    assert ran.record["error"].startswith("No agent on agent asked for work within queue_timeout_s (300 s); fix: ")
    assert 300 <= ran.ended_s <= 300 + SLACK_S, ran.ended_s


def test_a_pending_slurm_job_is_waiting_not_silent_and_its_wait_is_not_run_time(run_stub: Runner) -> None:
    """The job waits PENDING_S in the queue with a 10-second heartbeat timeout and a 15-second wall limit:
    neither clock runs while it waits, and the run then succeeds."""
    ran = run_stub("slurm", Script(finish_s=5), **_heartbeat("slurm", 10), max_wall_seconds=15)
    assert ran.record["state"] == RunState.SUCCEEDED, ran.log
    assert ran.ended_s >= PENDING_S


@pytest.mark.parametrize("kind", ["slurm", "agent"])
def test_an_agent_silent_while_its_job_is_pending_fails_for_its_silence(run_stub: Runner, kind: str) -> None:
    """The agent reports its SLURM job pending, then dies (a login node rebooted): a pending job is a queue,
    not a pass from the heartbeat clock."""
    script = Script(finish_s=1000, pending_s=10_000)
    silent_s = in_hands_s(kind, Script(pending_s=0)) + 3
    script.silent_from_s = silent_s
    ran = run_stub(kind, script, **_heartbeat(kind, 30))
    assert (ran.record["state"], ran.record["error"]) == (
        RunState.FAILED,
        f"No word from the agent on {kind} for 30 seconds",
    ), ran.log
    assert silent_s + 29 <= ran.ended_s <= silent_s + 30 + SLACK_S, ran.ended_s


@pytest.mark.parametrize("kind", ["slurm", "agent"])
def test_a_job_pending_past_pending_timeout_s_is_stopped_and_the_run_fails_naming_it(
    run_stub: Runner, kind: str
) -> None:
    script = Script(finish_s=1000, pending_s=10_000)
    ran = run_stub(kind, script, backend_settings={"pending_timeout_s": 600}, grace_seconds=5)
    assert ran.record["state"] == RunState.FAILED, ran.log
    assert ran.record["error"] == (
        "The SLURM job waited in the scheduler's queue for more than pending_timeout_s (600 s) (SLURM job 42: "
        f"PENDING (Priority)); it was cancelled. Fix: raise pending_timeout_s of backend {kind}, or ask for less "
        "(partition, gres, time) so that the scheduler can start it sooner"
    )
    contacted_s = in_hands_s(kind, Script(pending_s=0))
    assert ran.agent.told_to_stop_s is not None, "the agent was asked to stop (it cancels its job)"
    assert contacted_s + 600 <= ran.ended_s <= contacted_s + 600 + 1 + SLACK_S, ran.ended_s
    if kind == "slurm":
        assert ran.agent.killed >= 1, "the hard stop ran too (its scancel)"


@pytest.mark.parametrize("kind", ["ssh", "slurm"])
def test_a_setup_that_hangs_fails_at_setup_timeout_s_naming_its_phase(run_stub: Runner, kind: str) -> None:
    ran = run_stub(kind, Script(), backend_settings={"setup_timeout_s": 2})
    assert ran.record["state"] == RunState.FAILED
    assert ran.record["error"] == (
        "The setup on gpu-box did not finish within setup_timeout_s (2 s): it was still connecting to gpu-box. "
        f"Fix: raise setup_timeout_s of backend {kind} (a first venv build with large packages can take many "
        "minutes), or see agent.log in the run's folder for where it hung"
    )
    assert 2 <= ran.ended_s <= 2 + SLACK_S and ran.agent.killed >= 1, ran.ended_s


def test_max_wall_seconds_counts_an_ssh_setup_and_stops_it_at_once(run_stub: Runner) -> None:
    """The seed: max_wall_seconds stops any run; the setup is run time, and nobody is there to be asked."""
    ran = run_stub("ssh", Script(), max_wall_seconds=3, grace_seconds=20)
    assert ran.record["state"] == RunState.FAILED
    assert ran.record["error"] == (
        "The run did not finish within max_wall_seconds (3 s) and was stopped (still connecting to gpu-box)"
    )
    assert 3 <= ran.ended_s <= 3 + SLACK_S, "no grace is waited for: no agent was there yet"


@pytest.mark.parametrize("kind", ["ssh", "slurm"])
def test_cancel_during_the_setup_stops_it_at_once(run_stub: Runner, kind: str) -> None:
    ran = run_stub(kind, Script(cancel_at_s=1), grace_seconds=20)
    assert (ran.record["state"], ran.record["error"]) == (
        RunState.CANCELLED,
        "cancelled while connecting to gpu-box; the setup was stopped",
    )
    assert ran.ended_s <= 1 + SLACK_S and ran.agent.killed >= 1, "no grace: nothing there could be asked to stop"


@pytest.mark.parametrize("kind", TYPES)
def test_an_agent_that_reports_before_the_first_look_still_succeeds(run_stub: Runner, kind: str) -> None:
    """Contact and result in one moment (an agent with its worker started ahead, a tiny run): the run once
    stayed `queued` for good on a pull backend, its collection refused by the state machine."""
    ran = run_stub(kind, Script(finish_s=0.0, pending_s=0.0))
    assert ran.record["state"] == RunState.SUCCEEDED, ran.log
