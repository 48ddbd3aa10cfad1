"""The executor contract: what a backend type must do, and nothing it need not.

An executor knows one thing: how to get the agent for a run going on its
backend, and how to take it down. It is built with its backend's config
model; `launch(spec)` returns a handle, in the manner of submitit's
Executor -> Job. The handle says whether the run is *waiting* (for a claim,
for a scheduler), *running*, or *gone*; `kill()` is the hard stop;
`collect()` brings the model files back and says where they are.

Everything that must behave the same on every backend (the cancel flag and
the stop policy, the heartbeat and wall clocks, the run slot, writing the
run's record) lives in potato_queue.runs, never here. An executor imports
this module, the config and keys modules and the standard library; never
another executor, Celery, FastAPI or torch (tests/unit/test_house_rules.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.config import AnyBackend
from potato_queue.errors import PotatoQueueError
from potato_queue.settings import DEFAULT_SETTINGS, Settings
from potato_queue.store.keys import RunPaths
from potato_queue.wire.job import Job

__all__ = [
    "CheckReport",
    "LaunchSpec",
    "Offer",
    "AgentResult",
    "Waiting",
    "Running",
    "Gone",
    "Status",
    "RunHandle",
    "Executor",
    "BackendT",
    "ModelFilesMissing",
]


@dataclass
class CheckReport:
    """`training check` and the page's Check button: could a run start now, and what was seen."""

    ok: bool
    lines: list[str]
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, message: str, fix: str | None) -> CheckReport:
        """The report of a check that could not look: what went wrong, and the fix."""
        return cls(ok=False, lines=[message] + ([f"fix: {fix}"] if fix else []), data={"error": message, "fix": fix})


class Offer(Protocol):
    """A pull backend's run, posted for its agents to claim (the lifecycle makes it; Redis is behind it)."""

    def post(self) -> None:
        """Offer the run and wake the agents waiting for work."""

    def taken(self) -> bool:
        """Whether an agent has claimed it."""

    def withdraw(self) -> None:
        """No agent may claim it any more. Idempotent."""

    def agent_waiting(self, fresh_s: float) -> dict[str, Any] | None:
        """What an agent of the backend said, under fresh_s ago, it waits for before it claims (no GPU with
        room): {wait, host, at}; None when none waits."""


@dataclass(frozen=True)
class LaunchSpec:
    """What an executor gets to start a run: the run, not the run store or the project config."""

    run_id: str
    backend_name: str
    job: Job
    # None for a pull backend: its agent gets a run token when it claims the run. A one-time code for it where
    # the executor `shows_launch`.
    token: str | None
    server_url: str
    paths: RunPaths
    # A line in run.log, and the step line the page shows (also kept in run.log).
    log: Callable[[str], None]
    step: Callable[[str], None]
    # A pull backend's offer (None for the others).
    offer: Offer | None = None
    # What a deadline the executor sets is counted on (a pull backend's queue_timeout_s); tests hand in theirs.
    clock: Clock = REAL_CLOCK
    # Where the executor `shows_launch`: a new one-time code for the run, in place of the last one and the token it
    # bought (a requeued job's agent redeems it; the lost one's token then opens nothing).
    reissue: Callable[[], str] | None = None


@dataclass(frozen=True)
class AgentResult:
    """The agent's last word, as it posted it: the worker's exit code and where the model files are."""

    exit_code: int
    artifact_uri: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Waiting:
    """The run's worker is not training yet: a queue (no claim; a job pending in the scheduler) or a setup.

    `until_s` (epoch seconds, None: unbounded) is the wait's own deadline, and `why` says what it waits
    for, for the step line and the failure message past the deadline. A queue is not run time:
    max_wall_seconds counts from its end. A setup (`run_time`: an ssh connect, a venv build) is: the
    run has left the queue. The heartbeat clock runs only where an agent exists to beat (`beats`).
    """

    why: str
    until_s: float | None = None
    # What the run fails with past until_s (default: that it was still waiting, and why).
    expired: str | None = None
    run_time: bool = False
    beats: bool = False


@dataclass(frozen=True)
class Running:
    """What the executor started is there; the agent's heartbeats tell the rest."""


@dataclass(frozen=True)
class Gone:
    """What the executor started is gone (exited, session dropped); `why` says what is known.

    `error` is the run's error when the executor knows exactly what went wrong (ssh refused the key,
    no such Python there) and the agent never ran to say so itself; `fix` what the admin does about it.
    """

    why: str
    error: str | None = None
    fix: str | None = None


Status = Waiting | Running | Gone


class ModelFilesMissing(PotatoQueueError):
    """collect() could not bring the model files back (a stalled copy): the predictions are stored,
    and the run fails saying only the model files are missing, and where they are (`artifact_uri`)."""

    def __init__(self, message: str, artifact_uri: str | None = None) -> None:
        super().__init__(message)
        self.artifact_uri = artifact_uri


class RunHandle(ABC):
    """One launched run on a backend."""

    # How long the agent's own hard stop may take past grace before it can report: 0 where it is SIGKILL; a
    # batch job's is the scheduler's (scancel, KillWait, the end seen by a poll). The executor waits this much
    # longer for the report before its kill().
    hard_stop_s: float = 0.0

    @abstractmethod
    def poll(self) -> Status:
        """Waiting, Running or Gone: cheap, called about ten times a second."""

    @abstractmethod
    def kill(self) -> None:
        """The hard stop: when it returns, nothing of the run runs on the backend. Idempotent."""

    @abstractmethod
    def collect(self, result: AgentResult) -> str | None:
        """After the agent reported: bring the model files back, clean up, return the artifact_uri."""


# The config model of an executor's backend type (config.py): an executor is Executor[SshBackend] and so on, so
# that mypy checks what it reads of its backend, and a new backend type plugs in by the same two parameters.
BackendT = TypeVar("BackendT", bound=AnyBackend)


class Executor(ABC, Generic[BackendT]):
    """One backend type. Subclasses set `type_name`, name their config model (`Executor[SshBackend]`) and are
    built with it."""

    type_name: ClassVar[str] = ""
    # A pull backend's agent claims its run and gets the run token from the claim;
    # every other backend is handed a token in its LaunchSpec.
    pull: ClassVar[bool] = False
    # A backend that shows what a run is given to others (a Ray job's environment, on its dashboard) is handed a
    # one-time code in the token's place: its agent trades it for the token (RunTokens.redeem), once.
    shows_launch: ClassVar[bool] = False

    def __init__(self, backend_name: str, backend: BackendT, settings: Settings = DEFAULT_SETTINGS) -> None:
        """`settings`: the process's (an ssh config file of the server's own, the copy's stall limit)."""
        self.backend_name = backend_name
        self.backend = backend
        self.settings = settings

    @abstractmethod
    def check(self, model: str | None = None) -> CheckReport:
        """Could a run start on this backend now? (runs/check.py: `training check`, the Check button). With a
        Hugging Face `model`, the report's data also holds `llm_facts` for the check's fit of it: the model's
        config.json as the machine has it, the GPUs a run may get as [index, free MB] pairs (None where a
        scheduler picks them) and whether bitsandbytes imports there."""

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> RunHandle:
        """Start the run's agent (or post it for a pull agent); return once it is on its way."""

    def longest_wait_s(self) -> float:
        """How long a launched run may wait before its agent first calls (a scheduler's pending bound): its token
        lives that much longer."""
        return 0.0

    def warm(self) -> None:  # noqa: B027 - optional hook, most executors have nothing to warm
        """Get ready for the next run ahead of time (the executor process calls it at start)."""

    def close(self) -> None:  # noqa: B027 - optional hook, most executors hold nothing
        """Release what the executor keeps between runs (a warm agent, a connection)."""
