"""What SLURM says of a submitted job, as text in and text out: squeue's and scontrol's lines, the job's
state in words for run.log, and why the scheduler ended it (ERR-9's message and fix).

Standard library only, Python 3.8+: copied to login nodes. Apart from sbatch.py, which writes what is
submitted (job.sh, sbatch's flags): this is what the launcher's monitor (agent/launchers/slurm_monitor.py)
reads back while it follows the job, each function tested on real command output.
"""

import re
from typing import Dict, List, NamedTuple, Optional, Tuple

from potato_queue.wire.sbatch import SlurmSettings

__all__ = [
    "SQUEUE_FORMAT",
    "SLURM_ENDED_STATES",
    "QUEUED_STATES",
    "QueueState",
    "parse_squeue",
    "parse_scontrol",
    "describe_state",
    "requeue_line",
    "end_fields",
    "end_reason",
]

SQUEUE_FORMAT = "%T|%r|%N"
# Job states after which SLURM will not run the job again (scontrol's JobState).
SLURM_ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
# squeue's states of a job waiting to run (again, after a requeue).
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


class QueueState(NamedTuple):
    state: str  # PENDING, RUNNING, COMPLETING...
    reason: str  # Priority, Resources, None
    node: str  # empty while pending


def parse_squeue(stdout: str) -> Optional[QueueState]:
    """The job's line of `squeue -h -j ID -o '%T|%r|%N'`; None when squeue does not list it."""
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0]:
            return QueueState(parts[0].strip(), parts[1].strip(), parts[2].strip())
    return None


def parse_scontrol(stdout: str) -> Dict[str, str]:
    """`scontrol show job -o ID`'s fields as {name: value}; {} for a job SLURM no longer knows."""
    fields = {}  # type: Dict[str, str]
    for match in re.finditer(
        r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)", stdout.strip().splitlines()[0] if stdout.strip() else ""
    ):
        fields.setdefault(match.group(1), match.group(2))
    return fields


def describe_state(job_id: str, state: QueueState) -> str:
    """`SLURM job 4242: PENDING (Priority)`, `SLURM job 4242: RUNNING on node07`."""
    if state.state == "PENDING":
        reason = "not scheduled yet" if state.reason in ("", "None") else state.reason
        return "SLURM job {}: PENDING ({})".format(job_id, reason)
    if state.node:
        return "SLURM job {}: {} on {}".format(job_id, state.state, state.node)
    return "SLURM job {}: {}".format(job_id, state.state)


def requeue_line(resumed_log: str) -> Optional[str]:
    """run.log's line for a requeued job's worker that resumed: `preempted, requeued, resumed at step N`,
    from the worker's own `resumed at step N from the checkpoint in ...`; None for any other line."""
    found = re.match(r"^resumed at step (\d+) ", resumed_log)
    return "preempted, requeued, resumed at step {}".format(found.group(1)) if found else None


_DUE_TO = re.compile(r"\*\*\* JOB \S+ ON (\S+) CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))?(?:,[^*]*)? \*\*\*")
# The cgroup plugins' oom-kill, and jobacct_gather/linux's OverMemoryKill (its job ends FAILED, and
# slurm.out's CANCELLED line has no DUE TO: only "exceeded memory limit" says why).
_OOM = re.compile(r"oom-kill|out-of-memory|Out Of Memory|exceeded (?:job )?memory limit", re.IGNORECASE)
_REASONS = {
    # state: (what happened, the fix)
    "TIMEOUT": (
        "it reached its time limit",
        "raise the backend's `time`{time}, or train for fewer steps (params such as epochs)",
    ),
    "NODE_FAIL": (
        "its node {node} failed",
        "start the run again; if it recurs, tell the cluster's admins, or "
        "keep the job off that node with the backend's `exclude`",
    ),
    "PREEMPTED": (
        "it was preempted by a job of higher priority",
        "use a partition or qos whose jobs are not preempted, or start the run again",
    ),
    "OUT_OF_MEMORY": ("it ran out of memory", "raise the backend's `mem`{mem}, or train a smaller model or batch"),
    "CANCELLED": (
        "it was cancelled from outside potato-queue (scancel)",
        "start the run again; Cancel run stops a run and also ends its job",
    ),
    "DEADLINE": ("it reached its deadline", "start the run again with a later deadline"),
    "BOOT_FAIL": ("its node {node} failed to boot", "start the run again; tell the cluster's admins if it recurs"),
}
_SLURM_OUT_STATES = {"TIME LIMIT": "TIMEOUT", "NODE FAILURE": "NODE_FAIL", "PREEMPTION": "PREEMPTED"}


def end_fields(job: Dict[str, str]) -> List[str]:
    """scontrol's fields that say how a job ended, as `Name=value`, those it has."""
    return ["{}={}".format(key, job[key]) for key in ("JobState", "Reason", "ExitCode") if job.get(key)]


def _state_from_slurm_out(slurm_out: str) -> Tuple[Optional[str], str]:
    """The end state slurmstepd wrote into slurm.out, and the node, where scontrol cannot tell (a purged job)."""
    if _OOM.search(slurm_out):
        return "OUT_OF_MEMORY", ""
    match = _DUE_TO.search(slurm_out)
    if match is None:
        return None, ""
    return _SLURM_OUT_STATES.get(match.group(2) or "", "CANCELLED" if not match.group(2) else None), match.group(1)


def end_reason(
    job_id: str,
    job: Dict[str, str],
    slurm_out: str,
    settings: SlurmSettings,
    stopped_by_us: bool,
    waiting_again: bool = False,
) -> Optional[Tuple[str, str, str]]:
    """Why the scheduler ended the job, from scontrol's fields or slurm.out, as (error code, ERR-9's message,
    the fix); None when it did not.

    A job we cancelled, one that completed, or one whose worker failed on its own (FAILED) is not
    the scheduler's doing: the worker's own error says what happened. A job *waiting_again* (requeued,
    and not started since) ran no worker to fail: slurm.out holds only its earlier runs' lines.
    """
    state, node = job.get("JobState", ""), job.get("NodeList") or job.get("BatchHost") or ""
    if waiting_again:
        return (
            _reason(job_id, state, node, settings, stopped_by_us) if state in _REASONS else _not_run_again(job_id, job)
        )
    if state not in _REASONS:
        from_out, out_node = _state_from_slurm_out(slurm_out)
        state, node = from_out or state, node or out_node
    return _reason(job_id, state, node, settings, stopped_by_us)


def _reason(
    job_id: str, state: str, node: str, settings: SlurmSettings, stopped_by_us: bool
) -> Optional[Tuple[str, str, str]]:
    if state not in _REASONS or (state == "CANCELLED" and stopped_by_us):
        return None
    what, fix = _REASONS[state]
    node = node or "?"
    limit = settings.sbatch.get("--time")
    mem = settings.sbatch.get("--mem")
    details = {
        "node": node,
        "time": " (now {})".format(limit) if limit else "",
        "mem": " (now {})".format(mem) if mem else "",
    }
    message = "SLURM job {} ended before the worker finished: {}".format(job_id, what.format(**details))
    return "slurm_" + state.lower(), message, fix.format(**details)


def _not_run_again(job_id: str, job: Dict[str, str]) -> Optional[Tuple[str, str, str]]:
    """A requeued job that SLURM ended before it ran again (say, `Killing non-startable batch job`, when it
    was started within the second of its requeue): scontrol's fields are all there is to say."""
    if job.get("JobState") == "COMPLETED":
        return None
    known = ", ".join(end_fields(job))
    return (
        "slurm_not_run_again",
        "SLURM job {} ended before the worker finished: it was requeued, then ended before it ran again ({})".format(
            job_id, known or "scontrol no longer knows the job"
        ),
        "retry the run: it resumes from its checkpoint; if this recurs, ask the cluster's admins why SLURM "
        "could not start the job again (slurmctld's log names it)",
    )
