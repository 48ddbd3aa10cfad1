"""The executor contract and the supervise loop every backend shares.

An executor only knows how to start the agent for a run, whether it is still
there, how to stop it, and how to bring artifacts back. Everything that must
behave the same on every backend (cancel, heartbeat timeout, wall limit, the
run slot) is decided here, once a tick.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from potato_queue.config import ProjectConfig
from potato_queue.keys import RunPaths
from potato_queue.store import RunStore

__all__ = ["RunContext", "Outcome", "CheckReport", "Executor", "supervise", "TICK_S"]

TICK_S = 0.1
# After a cancel, the agent gets grace_seconds to stop its worker and report;
# this much more covers the report's trip back before we stop it ourselves.
CANCEL_MARGIN_S = 3.0


@dataclass
class RunContext:
    """What an executor needs to know about the run it is starting."""

    run_id: str
    config: ProjectConfig
    store: RunStore
    backend_name: str
    backend: Any  # the backend's config model; None for local
    server_url: str
    token: str
    job: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)  # the executor's own handles
    # When the run started (epoch seconds): max_wall_seconds counts from here,
    # bundle building and the agent's start included.
    started_s: float = field(default_factory=time.time)

    @property
    def paths(self) -> RunPaths:
        return self.store.paths(self.run_id)

    def log(self, message: str) -> None:
        self.store.log(self.run_id, message)

    def step(self, text: str) -> None:
        """The step line the page shows, also kept in run.log."""
        self.store.set_live(self.run_id, step=text)
        self.log(text)


@dataclass(frozen=True)
class Outcome:
    """How supervision ended: the agent's exit code, or why we stopped it."""

    exit_code: int | None = None
    state: str | None = None  # "failed" / "cancelled" when decided here
    error: str | None = None


@dataclass
class CheckReport:
    ok: bool
    lines: list[str]
    data: dict[str, Any] = field(default_factory=dict)


class Executor(ABC):
    """One backend type. Subclasses are small: start, alive, stop, collect."""

    type_name: str = ""

    @abstractmethod
    def check(self, config: ProjectConfig, backend_name: str) -> CheckReport:
        """Could a run start on this backend now? (`training check`, the Check button)"""

    @abstractmethod
    def start(self, ctx: RunContext) -> None:
        """Start the agent for the run; return once it is on its way."""

    @abstractmethod
    def alive(self, ctx: RunContext) -> bool:
        """Is the agent (or the session that carries it) still there?"""

    @abstractmethod
    def stop(self, ctx: RunContext, grace_seconds: float) -> None:
        """Stop the agent and everything it started; after it returns nothing of the run runs."""

    @abstractmethod
    def collect(self, ctx: RunContext) -> None:
        """Bring artifacts back into the run's artifacts/ and clean up."""

    def heartbeat_timeout_s(self, ctx: RunContext) -> float:
        return float(getattr(ctx.backend, "heartbeat_timeout_s", None) or ctx.config.model_training.heartbeat_timeout_s)


def _agent_result(ctx: RunContext) -> Outcome | None:
    code = ctx.store.live(ctx.run_id).get("agent_exit_code")
    return None if code is None else Outcome(exit_code=int(code))


def _stop(executor: Executor, ctx: RunContext, grace_s: float, state: str, error: str) -> Outcome:
    ctx.log(error)
    executor.stop(ctx, grace_s)
    return Outcome(state=state, error=error)


def supervise(executor: Executor, ctx: RunContext, *, renew_lease: Callable[[], bool],
              tick_s: float = TICK_S) -> Outcome:
    """Watch a started run until its agent reports, or cancel/limits/silence end it."""
    mt = ctx.config.model_training
    grace_s = float(mt.grace_seconds)
    started = time.monotonic()
    cancel_seen: float | None = None
    heartbeat_limit_s = executor.heartbeat_timeout_s(ctx)
    while True:
        now = time.monotonic()
        if not renew_lease():
            return _stop(executor, ctx, grace_s, "failed", "This executor lost the run slot (Redis unreachable or emptied); the run was stopped")
        outcome = _agent_result(ctx)
        if outcome is not None:
            return outcome
        if cancel_seen is None and ctx.store.cancel_requested(ctx.run_id):
            cancel_seen = now
            ctx.step("cancelling: asking the worker to stop")
        if cancel_seen is not None and now - cancel_seen > grace_s + CANCEL_MARGIN_S:
            return _stop(executor, ctx, 0, "cancelled", f"cancelled; the agent did not report within {grace_s:g} s, so it was stopped")
        if not executor.alive(ctx):
            return _gone(ctx)
        age = ctx.store.heartbeat_age_s(ctx.run_id)
        silent_s = now - started if age is None else age
        if silent_s > heartbeat_limit_s:
            return _stop(executor, ctx, 0, "failed", f"No word from the agent on {ctx.backend_name} for {int(heartbeat_limit_s)} seconds")
        if mt.max_wall_seconds and time.time() - ctx.started_s > mt.max_wall_seconds and cancel_seen is None:
            return _stop(executor, ctx, grace_s, "failed",
                         f"The run did not finish within max_wall_seconds ({mt.max_wall_seconds:g} s) and was stopped")
        ctx.store.wait_result(ctx.run_id, tick_s)


def _gone(ctx: RunContext) -> Outcome:
    # The result may be in flight while the process exits: look once more.
    time.sleep(0.5)
    outcome = _agent_result(ctx)
    if outcome is not None:
        return outcome
    tail = _tail(ctx.paths.agent_log, 5)
    error = "The agent stopped without reporting a result" + (f"; its last output: {tail}" if tail else "")
    ctx.log(error)
    return Outcome(state="failed", error=error)


def _tail(path: Any, lines: int) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])
