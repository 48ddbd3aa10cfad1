"""What the ray executor sends to Ray's Jobs API and reads back: pure functions, unit-tested.

A run is one Ray job, `potato-queue-<run_id>`. Its entrypoint is host/ray_entry.py given as `-c` text: Ray
shows a job's entrypoint, metadata and runtime_env on its dashboard to anyone who can open it, so nothing in
them opens anything once the run has started (the environment's one-time code is spent by the entry at once).
Entrypoint resources are always set, so that the job never lands on the head node by default and sees only
the GPUs Ray gives it (CUDA_VISIBLE_DEVICES). Ray's stop is SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S;
it is set per job to the project's grace and a margin, so that a trainer saves its checkpoint first.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from typing import Any

from potato_queue.backends.models import RayBackend
from potato_queue.code_package import host_source
from potato_queue.host import ray_entry

__all__ = [
    "PENDING",
    "RUNNING",
    "STOPPED",
    "TERMINAL",
    "STOP_WAIT_ENV",
    "STOP_MARGIN_S",
    "CODE_ENV",
    "JobState",
    "submission_id",
    "entrypoint",
    "job_request",
    "job_state",
    "asked_resources",
    "asked_words",
    "pending_expired",
    "REMOVED",
    "NOT_WAITING",
    "removal_id",
    "removal_request",
    "removal_by_hand",
    "check_job_request",
    "check_facts",
]

PENDING, RUNNING, STOPPED = "PENDING", "RUNNING", "STOPPED"
TERMINAL = (STOPPED, "SUCCEEDED", "FAILED")
STATES = (PENDING, RUNNING, *TERMINAL)
STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
# Past the grace: the agent's own hard stop and its report, before Ray's SIGKILL.
STOP_MARGIN_S = 15.0
# What Ray 2.60 says of a job whose node died (measured: a worker node killed mid-job).
NODE_LOST_TYPE = "JOB_SUPERVISOR_ACTOR_DIED"
NODE_LOST_SAID = "its node has died"
CODE_ENV = "POTATO_QUEUE_RUN_CODE"  # host/ray_entry.py's CODE_ENV
# Ray 2.60's job supervisor actor (dashboard/modules/job/common.py): a PENDING job is this actor not yet placed.
SUPERVISOR_PREFIX = "_ray_internal_job_actor_"
SUPERVISOR_NAMESPACE = "SUPERVISOR_ACTOR_RAY_NAMESPACE"
REMOVED = "potato-queue removed the job"
NOT_WAITING = "is not waiting to be placed"  # what the removal job says of a job Ray has placed already
# Run by the head's own Python, the one that runs Ray (ray_entry.py's Python need not have Ray): it kills the
# supervisor of a job still waiting to be placed, which Ray then marks FAILED, so the job never starts. A job
# whose supervisor runs already is left to Ray's stop, which the executor asked for first.
REMOVER_SOURCE = f"""import sys
if sys.argv[2]:
    sys.path.insert(0, sys.argv[2])
import ray
from ray.util.state import list_actors
name = {SUPERVISOR_PREFIX!r} + sys.argv[1]
ray.init(namespace={SUPERVISOR_NAMESPACE!r}, logging_level="ERROR", log_to_driver=False)
states = {{a.state for a in list_actors(filters=[("name", "=", name)], raise_on_missing_output=False)}}
if not states & {{"DEPENDENCIES_UNREADY", "PENDING_CREATION"}}:
    print("job %s {NOT_WAITING} (%s): nothing to remove" % (sys.argv[1], sorted(states)))
    sys.exit(0)
try:
    ray.kill(ray.get_actor(name), no_restart=True)
except ValueError:
    pass
print({REMOVED!r}, sys.argv[1])
"""
# The head's Python as its supervisor runs it: /proc's exe is the interpreter with any venv link resolved, so the
# folder holding Ray comes from the libraries the supervisor has loaded (Ray's nodes are Linux).
_HEAD_PYTHON = (
    "lib=$(grep -o '/[^ ]*/ray/_raylet[^ ]*[.]so' /proc/$PPID/maps 2>/dev/null | head -n 1); "
    'exec "$(readlink /proc/$PPID/exe 2>/dev/null || echo python3)" -I -c'
)


@dataclass(frozen=True)
class JobState:
    """A Ray job as GET /api/jobs/{id} tells it."""

    status: str
    message: str
    exit_code: int | None = None
    error_type: str | None = None

    def node_lost(self) -> bool:
        """Whether the job failed because the node it ran on died (a spot node reclaimed, a machine lost):
        Ray says so of the job's supervisor, and the run is requeued where its trainer checkpoints."""
        return self.error_type == NODE_LOST_TYPE and NODE_LOST_SAID in self.message


def submission_id(run_id: str, attempt: int = 0) -> str:
    """The run's Ray job: found by its name after an executor restart, and named on the dashboard (`attempt`:
    the requeues after a lost node, each a job of its own: Ray's job ids are never reused)."""
    return f"potato-queue-{run_id}" + (f"-{attempt + 1}" if attempt else "")


def entrypoint(backend: RayBackend, server_url: str, run_id: str, code_sha256: str) -> str:
    """The job's shell command: the node's Python, isolated (no working folder on its path), runs the entry."""
    argv = [backend.python, "-I", "-c", host_source(ray_entry), server_url, run_id, code_sha256, backend.workdir]
    return shlex.join(argv)


def asked_resources(backend: RayBackend) -> dict[str, Any]:
    """The entrypoint resources of every run of the backend (never none: a job without them runs on the head)."""
    asked: dict[str, Any] = {"entrypoint_num_gpus": backend.num_gpus, "entrypoint_num_cpus": backend.num_cpus}
    if backend.memory_mb is not None:
        asked["entrypoint_memory"] = int(backend.memory_mb * 1024 * 1024)
    if backend.resources:
        asked["entrypoint_resources"] = dict(backend.resources)
    return asked


def job_request(
    backend: RayBackend, server_url: str, run: tuple[str, str], code_sha256: str, grace_s: float, attempt: int = 0
) -> dict[str, Any]:
    """POST /api/jobs/'s body for the run (`run`: its id and its one-time code; `attempt`: its requeues)."""
    run_id, code = run
    env = {CODE_ENV: code, STOP_WAIT_ENV: str(math.ceil(grace_s + STOP_MARGIN_S))}
    return {
        "entrypoint": entrypoint(backend, server_url, run_id, code_sha256),
        "submission_id": submission_id(run_id, attempt),
        "runtime_env": {"env_vars": env},
        "metadata": {"potato_queue_run": run_id},
        **asked_resources(backend),
    }


def removal_id(job_id: str) -> str:
    return f"{job_id}-removal"


def removal_request(job_id: str) -> dict[str, Any]:
    """The job that removes `job_id` from Ray's queue. It asks for no resources, so Ray runs it on the head
    (where Ray's own Python is), and it shows only the job's id."""
    command = f'{_HEAD_PYTHON} {shlex.quote(REMOVER_SOURCE)} {shlex.quote(job_id)} "${{lib%/ray/*}}"'
    return {
        "entrypoint": command,
        "submission_id": removal_id(job_id),
        "entrypoint_num_cpus": 0,
        "metadata": {"potato_queue_removes": job_id},
    }


def removal_by_hand(job_id: str) -> str:
    """The command that removes a waiting job, for an admin on the head when the removal job could not."""
    actor = f'ray.get_actor("{SUPERVISOR_PREFIX}{job_id}", namespace="{SUPERVISOR_NAMESPACE}")'
    return shlex.join(["python", "-c", f"import ray; ray.init(); ray.kill({actor}, no_restart=True)"])


def check_job_request(backend: RayBackend, check_source: str, asked: dict[str, Any], job_id: str) -> dict[str, Any]:
    """`training check`'s job: host/check.py (its question on stdin) run by the node's `python` where a run
    would be placed (the same resources), so that it sees what a run's worker would."""
    question = shlex.quote(json.dumps(asked))
    command = f"printf '%s\\n' {question} | {shlex.join([backend.python, '-I', '-c', check_source])}"
    return {
        "entrypoint": command,
        "submission_id": job_id,
        "metadata": {"potato_queue": "check"},
        **asked_resources(backend),
    }


def check_facts(logs: str) -> dict[str, Any] | None:
    """host/check.py's answer in the check job's log (after Ray's own lines): its last line that is a JSON
    object with the interpreter in it; None when there is none."""
    for line in reversed(logs.splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and isinstance(found.get("python"), str) and isinstance(found.get("packages"), dict):
            return found
    return None


def job_state(reply: Any) -> JobState:
    """GET /api/jobs/{id}'s reply, checked: a status Ray does not define is refused, not guessed at."""
    if not isinstance(reply, dict) or reply.get("status") not in STATES:
        status = reply.get("status") if isinstance(reply, dict) else reply
        raise ValueError(f"Ray answered a job status this version does not know: {str(status)[:100]!r}")
    code = reply.get("driver_exit_code")
    exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
    error_type = reply.get("error_type") if isinstance(reply.get("error_type"), str) else None
    return JobState(reply["status"], str(reply.get("message") or "")[:2000], exit_code, error_type)


def asked_words(backend: RayBackend) -> str:
    """What a run of the backend asks Ray for, in the config's own words: "num_gpus=1, num_cpus=1"."""
    words = [f"num_gpus={backend.num_gpus:g}", f"num_cpus={backend.num_cpus:g}"]
    words += [f"memory_mb={backend.memory_mb:g}"] if backend.memory_mb is not None else []
    return ", ".join(words + [f"{name}={amount:g}" for name, amount in backend.resources.items()])


def pending_expired(backend: RayBackend, job_id: str, said: str) -> str:
    """ERR: why a run whose Ray job never left PENDING failed, and what to do."""
    asked = asked_words(backend)
    return (
        f"Ray job {job_id} was still PENDING on {backend.head} after pending_timeout_s "
        f"({backend.pending_timeout_s:g} s): Ray said {said!r}; it asked for {asked}; fix: free or add a node "
        "with those resources (potato-queue training check shows the cluster's), or lower num_gpus, num_cpus, "
        "memory_mb or resources on the backend"
    )
