"""A stub backend for the in-process executor contract (tests/unit/test_stub_contract.py).

The model is dramatiq's StubBroker: the real lifecycle (RunLife: the bundle,
the job, supervision, finalize, the run's states in a real Redis and run
folder), with a scripted agent instead of processes and a ManualClock instead
of real time, so a 30-second heartbeat timeout costs nothing. Each backend
type is played as its real handle behaves (executors/*.py), which is what the
lifecycle sees of it:

- local: Running from the launch; Gone once its agent process is gone.
- ssh:   Waiting ("connecting to <host>") while the session sets up, then as local.
- slurm: as ssh, and the agent reports its worker `pending` in the queue for a while.
- agent: the real AgentExecutor (executors/agent.py): the run is offered in Redis and
         the scripted agent claims it through RunService.claimed; it is never Gone
         (a machine behind NAT can only fall silent).

The end-to-end suite (tests/e2e/runs/test_contract.py) runs the real executors with real
processes, sshd and SLURM; this one pins down every clock of every type in
milliseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from potato_queue.clock import ManualClock
from potato_queue.executors.agent import AgentExecutor
from potato_queue.executors.base import (
    AgentResult,
    CheckReport,
    Executor,
    Gone,
    LaunchSpec,
    RunHandle,
    Running,
    Status,
    Waiting,
)
from potato_queue.executors.remote.session import setup_expired
from potato_queue.runs.ingest import ingest_events
from potato_queue.runs.service import RunService
from potato_queue.store import RunStore

__all__ = [
    "Script",
    "StubAgent",
    "StubExecutor",
    "StubExecutors",
    "PullAgentExecutor",
    "TYPES",
    "PUSH_TYPES",
    "in_hands_s",
    "pending_s",
]

TYPES = ("local", "ssh", "slurm", "agent")
PUSH_TYPES = ("local", "ssh", "slurm")  # the executor starts the agent, and can see it go
CONNECT_S = {"local": 0.0, "ssh": 4.0, "slurm": 4.0}
PENDING_S = 20.0  # a slurm run's job waits this long in the queue


@dataclass
class Script:
    """What the scripted agent does, in seconds from the launch (None: never)."""

    contact_s: float | None = 1.0  # first call (a pull agent: its claim)
    beat_every_s: float = 1.0
    silent_from_s: float | None = None  # no heartbeat from then on (frozen, cut off)
    vanish_s: float | None = None  # the agent process is gone (a push backend's handle sees it)
    finish_s: float | None = 6.0  # the worker's exit 0, predictions sent, result posted (after contact)
    stop_after_s: float | None = 1.0  # once told to stop: exit 4 after this long (None: deaf)
    exit_code: int = 0
    cancel_at_s: float | None = None  # the admin asks to cancel the run then (the API's cancel)
    # How long the worker waits in the scheduler's queue after the contact (None: PENDING_S on slurm, else 0);
    # an agent backend's agent may submit to SLURM too.
    pending_s: float | None = None


# A run the lifecycle never ends would make the manual clock run on forever: past this, the test fails.
NEVER_ENDS_S = 100_000.0


@dataclass
class StubAgent:
    """Acts on the run at every wait of the clock, as the real agent would through the server."""

    script: Script
    store: RunStore
    clock: ManualClock
    kind: str
    launched_s: float = 0.0
    run_id: str = ""
    backend: str = ""
    contacted: bool = False
    gone: bool = False
    killed: int = 0
    told_to_stop_s: float | None = None
    reported: bool = False
    token: str = ""  # a pull agent's backend token (the test registers it)
    last_beat_s: float = field(default=-1e9)
    job_started: bool = False

    def launch(self, run_id: str, backend: str) -> None:
        self.run_id, self.backend, self.launched_s = run_id, backend, self.clock.now_s()
        self.clock.on_wait = self.act

    def since_launch(self, now_s: float) -> float:
        return now_s - self.launched_s

    def act(self, now_s: float) -> None:
        t = self.since_launch(now_s)
        if t > NEVER_ENDS_S:
            raise AssertionError(f"the run was still supervised {NEVER_ENDS_S:g} s after its launch")
        if (
            self.script.cancel_at_s is not None
            and t >= self.script.cancel_at_s
            and not self.store.in_flight.cancel_requested(self.run_id)
        ):
            self.store.request_cancel(self.run_id)
        if self.gone or self.reported or self.killed:
            return
        if self.script.vanish_s is not None and t >= self.script.vanish_s:
            self.gone = True
            return
        if not self.contacted:
            if self.script.contact_s is not None and t >= self.script.contact_s + self.connect_s():
                self._contact()
            if not self.contacted or self.script.finish_s != 0:
                return  # finish_s 0: the result in the same moment as the contact (a worker started ahead)
        if self.script.silent_from_s is not None and t >= self.script.silent_from_s:
            return
        self._beat(now_s, t)
        if self.store.in_flight.stop_due(self.run_id):
            self._stop(now_s)
        elif self.script.finish_s is not None and t >= self.in_hands_s() + self.script.finish_s:
            self._report(self.script.exit_code, predictions=self.script.exit_code == 0)

    def connect_s(self) -> float:
        return CONNECT_S.get(self.kind, 0.0)

    def pending_s(self) -> float:
        return pending_s(self.kind, self.script)

    def in_hands_s(self) -> float:
        """When, from the launch, the worker runs: connected, contacted, and (slurm) out of the queue."""
        return in_hands_s(self.kind, self.script)

    def _contact(self) -> None:
        self.contacted = True
        runs = RunService(self.store.config, self.store)
        if self.kind == "agent":
            claimed = runs.claimed(self.backend, self.token, {"host": "stub"})
            assert claimed is not None and claimed.run_id == self.run_id
        else:
            runs.heard_from(self.run_id)  # GET job
        if self.pending_s():
            ingest_events(
                self.store,
                self.run_id,
                [{"event": "status", "state": "pending", "step": "SLURM job 42: PENDING (Priority)"}],
            )

    def _beat(self, now_s: float, t: float) -> None:
        if self.pending_s() and not self.job_started and t >= self.in_hands_s():
            self.job_started = True  # the agent says so at once, as the launcher does when squeue says RUNNING
            ingest_events(self.store, self.run_id, [{"event": "status", "state": "running", "step": "training"}])
        if now_s - self.last_beat_s < self.script.beat_every_s:
            return
        self.last_beat_s = now_s
        ingest_events(self.store, self.run_id, [])  # an empty batch is a heartbeat

    def _stop(self, now_s: float) -> None:
        if self.told_to_stop_s is None:
            self.told_to_stop_s = now_s
        if self.script.stop_after_s is not None and now_s - self.told_to_stop_s >= self.script.stop_after_s:
            self._report(4, predictions=False)

    def _report(self, exit_code: int, predictions: bool) -> None:
        if predictions:
            self._write_predictions()
        self.store.record_result(self.run_id, exit_code, None, None)
        self.reported = True

    def _write_predictions(self) -> None:
        """The test split's gold labels as predictions (what PUT predictions stores)."""
        paths = self.store.paths(self.run_id)
        rows = [json.loads(line) for line in (paths.bundle_dir / "test.jsonl").read_text().splitlines() if line]
        lines = [
            json.dumps(
                {
                    "instance_id": row["instance_id"],
                    "schema_name": name,
                    "payload": {"label": label, "confidence": 0.9},
                    "confidence": 0.9,
                }
            )
            for row in rows
            for name, label in row["targets"].items()
        ]
        paths.predictions.write_text("".join(line + "\n" for line in lines))


def pending_s(kind: str, script: Script) -> float:
    """How long a `kind` run's worker waits in the scheduler's queue."""
    return script.pending_s if script.pending_s is not None else (PENDING_S if kind == "slurm" else 0.0)


def in_hands_s(kind: str, script: Script) -> float:
    """When, from the launch, a `kind` run's worker runs: connected, contacted, and out of the queue."""
    return CONNECT_S.get(kind, 0.0) + (script.contact_s or 0.0) + pending_s(kind, script)


class StubHandle(RunHandle):
    """A push backend's handle: waiting while it connects (a setup: run time, bounded by setup_timeout_s, as
    executors/remote/session.py says), running while its agent is there, then gone."""

    def __init__(self, agent: StubAgent, host: str, setup_timeout_s: float | None) -> None:
        self.agent, self.host, self.setup_timeout_s = agent, host, setup_timeout_s
        self.collected: list[AgentResult] = []

    def poll(self) -> Status:
        if self.agent.gone or self.agent.killed:
            return Gone("the agent process exited")
        if self.agent.since_launch(self.agent.clock.now_s()) < self.agent.connect_s():
            phase = f"connecting to {self.host}"
            if self.setup_timeout_s is None:
                return Waiting(phase, run_time=True)
            return Waiting(
                phase,
                self.agent.launched_s + self.setup_timeout_s,
                setup_expired(self.host, self.agent.backend, self.setup_timeout_s, phase),
                run_time=True,
            )
        return Running()

    def kill(self) -> None:
        self.agent.killed += 1

    def collect(self, result: AgentResult) -> str | None:
        self.collected.append(result)
        return "stub://model"


class StubExecutor(Executor):
    """A push backend type (local, ssh, slurm) as its handle behaves, with the scripted agent behind it."""

    def __init__(self, kind: str, backend_name: str, agent: StubAgent, backend: Any = None) -> None:
        super().__init__(backend_name, backend)
        self.type_name, self.agent = kind, agent  # type: ignore[misc]
        self.handles: list[StubHandle] = []

    def check(self) -> CheckReport:
        return CheckReport(ok=True, lines=[f"{self.backend_name}: a stub {self.type_name} backend"])

    def launch(self, spec: LaunchSpec) -> RunHandle:
        self.agent.launch(spec.run_id, spec.backend_name)
        handle = StubHandle(self.agent, "gpu-box", getattr(self.backend, "setup_timeout_s", None))
        self.handles.append(handle)
        return handle


class StubExecutors:
    """The registry RunLife asks (executors.Executors' one method), holding the one executor under test."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def get(self, backend_name: str) -> Executor:
        return self.executor


class PullAgentExecutor(AgentExecutor):
    """The real agent executor, whose launch also starts the scripted agent's clock."""

    agent: StubAgent

    def launch(self, spec: LaunchSpec) -> RunHandle:
        handle = super().launch(spec)
        self.agent.launch(spec.run_id, spec.backend_name)
        return handle
