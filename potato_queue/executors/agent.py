"""The agent backend: a training machine the server cannot reach (behind NAT, a firewall).

Nothing is started from here: the run is offered to the backend's agents,
which long-poll the server for work (`potato-queue training agent`). The run
stays `queued` and *waiting* until one claims it, bounded by queue_timeout_s
when the backend sets one (AGT-4); from the claim on, the agent's heartbeats
are what keeps the run alive, and cancel reaches it through its control
long-poll. The model files stay on the training machine (AGT-6): the run's
artifact_uri is the `<host>:<folder>` the agent reported. An agent started with
--min-free-gpu-mb that waits for a free GPU says so (store/offers.py): the
run's step line then names its GPUs, and so does its error past queue_timeout_s.
"""

from __future__ import annotations

from typing import Any

from potato_queue.clock import Clock
from potato_queue.config import AgentBackend
from potato_queue.executors.base import (
    AgentResult,
    CheckReport,
    Executor,
    LaunchSpec,
    Offer,
    RunHandle,
    Running,
    Status,
    Waiting,
)
from potato_queue.host.gpus import GPU_REPORT_S, GpuWait, agent_wait_expired, agent_wait_line

__all__ = ["AgentExecutor", "AgentHandle", "waiting_why", "no_agent_error", "GPU_WAIT_FRESH_S"]

# An agent's report that it waits for a GPU counts this long: it says it again every GPU_REPORT_S, so an
# older one is an agent that went away while it waited.
GPU_WAIT_FRESH_S = 3 * GPU_REPORT_S
# How often the handle asks the store whether an agent waits for a GPU (poll() runs ten times a second).
GPU_LOOK_S = 1.0


def waiting_why(backend_name: str) -> str:
    return f"waiting for an agent on {backend_name}"


def no_agent_error(backend_name: str, queue_timeout_s: float) -> str:
    """ERR-10: why a run on an agent backend never started, and what to do."""
    return (
        f"No agent on {backend_name} asked for work within queue_timeout_s ({queue_timeout_s:g} s); fix: start "
        f"one on the training machine (potato-queue training agent --server URL --backend {backend_name}), "
        f"and see when one last asked with: potato-queue training check {backend_name} CONFIG"
    )


class AgentHandle(RunHandle):
    """A run offered to an agent backend: waiting until claimed, then in its agent's hands."""

    def __init__(
        self,
        offer: Offer,
        why: str,
        until_s: float | None,
        expired: str | None,
        backend_name: str,
        timeout_s: float | None,
        clock: Clock,
    ) -> None:
        self.offer, self.why, self.until_s, self.expired = offer, why, until_s, expired
        self.backend_name, self.timeout_s, self.clock = backend_name, timeout_s, clock
        self.claimed = False
        self.looked_s: float | None = None
        self.gpu_status: Waiting | None = None  # the wait while an agent waits for a GPU, else None

    def poll(self) -> Status:
        if not self.claimed:
            self.claimed = self.offer.taken()
        if self.claimed:
            # Gone is never known here: a machine behind NAT can only fall silent (the heartbeat says so).
            return Running()
        return self._gpu_wait() or Waiting(self.why, self.until_s, self.expired)

    def _gpu_wait(self) -> Waiting | None:
        """The wait as an agent that waits for a free GPU describes it (looked up once a GPU_LOOK_S)."""
        now_s = self.clock.now_s()
        if self.looked_s is None or now_s - self.looked_s >= GPU_LOOK_S:
            self.looked_s = now_s
            self.gpu_status = self._gpu_status(self.offer.agent_waiting(GPU_WAIT_FRESH_S))
        return self.gpu_status

    def _gpu_status(self, said: dict[str, Any] | None) -> Waiting | None:
        if said is None:
            return None
        wait, host = GpuWait.from_json(said["wait"]), str(said.get("host") or "an unnamed host")
        expired = None if self.timeout_s is None else agent_wait_expired(self.backend_name, host, wait, self.timeout_s)
        return Waiting(agent_wait_line(self.backend_name, host, wait), self.until_s, expired)

    def kill(self) -> None:
        # Nothing of ours runs where we could reach it; an agent that still has the run learns of its
        # end from the revoked token (401) or the control call, and stops its worker itself.
        self.offer.withdraw()

    def collect(self, result: AgentResult) -> str | None:
        self.offer.withdraw()
        return result.artifact_uri


class AgentExecutor(Executor[AgentBackend]):
    type_name = "agent"
    pull = True

    def check(self, model: str | None = None) -> CheckReport:
        # A pull backend: its registration lives in the server's store, and runs/check.py reads it there. The
        # agent's machine is not asked anything: hf-llm-lora checks its fit there before it loads the weights.
        return CheckReport(ok=True, lines=[f"{self.backend_name}: an agent backend (runs wait for its agent)"])

    def launch(self, spec: LaunchSpec) -> RunHandle:
        if spec.offer is None:
            raise ValueError("an agent run needs its offer")
        timeout_s = self.backend.queue_timeout_s
        until_s = spec.clock.now_s() + timeout_s if timeout_s else None
        expired = no_agent_error(self.backend_name, timeout_s) if timeout_s else None
        why = waiting_why(self.backend_name)
        spec.offer.post()
        spec.step(why)
        return AgentHandle(spec.offer, why, until_s, expired, self.backend_name, timeout_s or None, spec.clock)
