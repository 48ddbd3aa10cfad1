"""What a run is: its states, the moves between them, and the shape of its record.

A run's state is stored as text (run.json, Redis, the API's JSON); `RunState`
is that text, typed, so a state is always named through it and never spelled
again. `ALLOWED_FROM` is the one table of moves; the store's compare-and-set
applies it in Redis, so a cancel and an executor's start can never both win.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypedDict, cast

__all__ = [
    "RunState",
    "STATES",
    "FINAL_STATES",
    "IN_FLIGHT",
    "ALLOWED_FROM",
    "RECORD_VERSION",
    "RunRecord",
    "RunMarks",
    "RunView",
    "merge",
]

# run.json's shape: 2 from the version that records it (every succeeded run then has `agreement`, even empty).
# A record without `record_version` was written before: what it lacks may be what that version never recorded
# (runs/upgrades.py says so, never a false reason).
RECORD_VERSION = 2


class RunState(str, Enum):
    """A run's state, as stored and shown (the value is the text)."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    COLLECTING = "collecting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Never stored and never moved into: how a list shows a run whose run.json cannot be read.
    BROKEN = "broken"

    def __str__(self) -> str:
        return self.value


STATES: tuple[RunState, ...] = (
    RunState.QUEUED,
    RunState.STARTING,
    RunState.RUNNING,
    RunState.COLLECTING,
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.CANCELLED,
)
FINAL_STATES: frozenset[RunState] = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
IN_FLIGHT: frozenset[RunState] = frozenset({RunState.STARTING, RunState.RUNNING, RunState.COLLECTING})

_EARLY = (RunState.QUEUED, RunState.STARTING, RunState.RUNNING, RunState.COLLECTING)
# state -> the states a run may be in to move there (the store's compare-and-set checks it in Redis).
ALLOWED_FROM: dict[RunState, tuple[RunState, ...]] = {
    RunState.STARTING: (RunState.QUEUED,),
    # A pull backend's run stays queued until its agent claims it, then runs.
    RunState.RUNNING: (RunState.STARTING, RunState.QUEUED),
    RunState.COLLECTING: (RunState.STARTING, RunState.RUNNING),
    RunState.SUCCEEDED: (RunState.COLLECTING,),
    RunState.FAILED: _EARLY,
    RunState.CANCELLED: _EARLY,
    # A pull backend's dispatch keeps it queued (the claim starts it): a no-op move that still checks.
    RunState.QUEUED: (RunState.QUEUED,),
}


class RunMarks(TypedDict, total=False):
    """What a new run's record says of where it came from, beside its trainer, schemes, backend and params:
    RunStore.create's keywords (their defaults are there), which start_run and RunService.submit pass on."""

    trigger: str  # api, page, potato, auto, retry, rerun
    potato_run_id: str | None  # the Potato run it trains for (Potato records it itself)
    resume_of: str | None  # the run a retry resumes (runs/retry.py)
    rerun_of: str | None  # the run a re-run repeats (runs/rerun.py)
    run_id: str | None  # chosen before, as a retry's claim names it; else a new one


class RunRecord(TypedDict, total=False):
    """run.json: what a run is and how it went (the store writes it, the API serves it)."""

    run_id: str
    record_version: int  # RECORD_VERSION when it was written; absent: an earlier version's record
    state: str  # a RunState's text
    backend: str
    trainer: str
    schemas: list[str]
    params: dict[str, Any]
    trigger: str  # api, cli, page, retrain, potato, retry
    created_at: str  # utc_of's text
    started_at: str | None
    finished_at: str | None
    error: str | None
    metrics: dict[str, Any]
    held_out: dict[str, Any]
    exit_code: int | None
    artifact_uri: str | None
    potato_run_id: str  # a run Potato's own manager started (Potato records it)
    job: dict[str, Any]  # the job the executor built (runs/job.py)
    bundle: dict[str, Any]  # the bundle's items per split
    model_version: str | None
    prelabels: dict[str, Any]  # what finalize published into Potato
    machine_annotator: dict[str, Any]  # runs/rater.py: the machine rater in Potato it is ({id, items, replaced})
    reproducibility: dict[str, Any]  # runs/reproducibility.py: what made the run (code, data, packages, GPU, seeds)
    agreement: dict[str, Any]  # insight/agreement.py: per scheme, model-human beside human-human, and `said`
    resume_of: str  # a retry: the failed or cancelled run it retries, resuming from that run's checkpoints
    retried_by: str  # a run that was retried: its retry
    rerun_of: str  # a re-run: the run whose bundle, params and seed it runs again (runs/rerun.py)
    rerun_by: list[str]  # a run that was run again: its re-runs
    gpu_usage: dict[str, Any]  # lab/usage.py: what the agent measured of its GPUs (GPU-seconds, Wh, busy %)
    usage_struck: dict[str, Any]  # runs/budget.py: the admin struck its use from the budget ({at, reason, ...})
    hub: dict[str, Any]  # its publish to the Hugging Face Hub: state, repo_id, private, url, revision, error
    # Laid over the record from Redis while the run is not final (RunStore.get):
    step: str | None
    progress: dict[str, Any] | None
    heartbeat_at: float


def merge(record: RunRecord, fields: Mapping[str, Any]) -> RunRecord:
    """`fields` into `record`, in place: the store's writes name their fields at run time."""
    cast("dict[str, Any]", record).update(fields)
    return record


@dataclass(frozen=True)
class RunView:
    """What the supervising executor looks at every tick, read in one round trip."""

    exit_code: int | None  # the agent's result, once posted
    artifact_uri: str | None
    message: str | None
    heartbeat_at: float | None  # the agent's last contact (epoch s); None before its first
    cancel_requested: bool
    disk_error: str | None = None  # a write for the run failed: the run cannot go on
    state: str | None = None
    # The agent says the worker waits in a batch scheduler's queue (status `pending`): the run is waiting.
    pending_step: str | None = None
    has_token: bool = True  # the run's token is in Redis (gone: Redis lost its data)
