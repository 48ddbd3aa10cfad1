"""`training check` of a ray backend: the head's version, the auth result, the nodes and their GPUs and CPUs,
whether a job with the backend's resources can be placed now, or ever, and, when it can be at all, what a run's
worker would find where Ray puts it: a short job with the run's resources runs host/check.py (the ssh check's
question) with the node's `python`. A check job that Ray cannot place within CHECK_PENDING_WAIT_S (the cluster
busy) is taken out of the queue and the nodes go unlooked at."""

from __future__ import annotations

import secrets
from typing import Any

from potato_queue.backends.models import RayBackend
from potato_queue.code_package import host_source
from potato_queue.executors.base import CheckReport
from potato_queue.executors.rayjobs.client import RayError, RayJobs
from potato_queue.executors.rayjobs.text import (
    PENDING,
    TERMINAL,
    JobState,
    asked_resources,
    check_facts,
    check_job_request,
    removal_request,
)
from potato_queue.host import check as host_check
from potato_queue.host.gpus import describe
from potato_queue.host.nvidia_smi import NVIDIA_SMI_QUERY, parse_gpus

__all__ = ["ray_check_report", "placement", "CHECK_JOB_WAIT_S"]

CHECK_JOB_WAIT_S = 60.0  # measured: about 3 s on 2 cores; a node's first import of torch takes longer
CHECK_PENDING_WAIT_S = 10.0


def _asked(backend: RayBackend) -> dict[str, float]:
    """The job's entrypoint resources (text.asked_resources) by the names Ray gives them on a node."""
    asked = asked_resources(backend)
    names = {"entrypoint_num_gpus": "GPU", "entrypoint_num_cpus": "CPU", "entrypoint_memory": "memory"}
    return {**{names[k]: v for k, v in asked.items() if k in names}, **asked.get("entrypoint_resources", {})}


def placement(backend: RayBackend, nodes: list[dict[str, Any]], usage: dict[str, list[float]]) -> tuple[bool, bool]:
    """(could ever be placed: a live node has every resource asked, free now: the cluster has them free)."""
    asked = {name: amount for name, amount in _asked(backend).items() if amount > 0}
    alive = [node for node in nodes if node.get("state") == "ALIVE"]
    ever = any(all(node.get("resources_total", {}).get(k, 0) >= v for k, v in asked.items()) for node in alive)
    free = {name: total - used for name, (used, total) in ((k, v[:2]) for k, v in usage.items() if len(v) >= 2)}
    return ever, ever and all(free.get(k, 0) >= v for k, v in asked.items())


def _node_line(node: dict[str, Any]) -> str:
    total = node.get("resources_total", {})
    role = "head" if node.get("is_head_node") else "worker"
    return (
        f"  {node.get('node_ip', '?')} ({role}, {node.get('state', '?')}): {total.get('GPU', 0):g} GPU, "
        f"{total.get('CPU', 0):g} CPU"
    )


def ray_check_report(name: str, backend: RayBackend, jobs: RayJobs) -> CheckReport:
    try:
        version = jobs.version()
        nodes, usage = jobs.nodes(), jobs.usage()
    except RayError as exc:
        return CheckReport.failed(exc.message, exc.fix)
    asked = ", ".join(f"{k} {v:g}" for k, v in _asked(backend).items())
    ever, now = placement(backend, nodes, usage)
    lines = [f"{name}: Ray {version.get('ray_version', '?')} at {backend.address} (auth: accepted)"]
    lines += [f"{len(nodes)} node(s):", *(_node_line(node) for node in nodes)]
    problems = []
    if not ever:
        problems.append(
            f"no live node has what a run asks ({asked}): a run would wait PENDING until pending_timeout_s "
            f"({backend.pending_timeout_s:g} s); fix: add such a node, or lower the backend's num_gpus, num_cpus, "
            "memory_mb or resources"
        )
    lines.append(
        f"a run asks {asked}: "
        + ("free now, across the cluster" if now else "placed once a node frees them" if ever else "never")
    )
    if backend.server_url is None:
        lines.append(
            "server_url: not set, so the nodes dial the address potato-queue serve is bound to, which only a node "
            "on this machine reaches; set it to where the nodes reach this server"
        )
    else:
        lines.append(f"server_url: {backend.server_url} (the nodes fetch the agent and the bundle there)")
    node: dict[str, Any] | None = None
    if ever:
        node_lines, node, problem = _node_check(backend, jobs)
        lines += node_lines
        problems += [problem] if problem else []
    else:
        lines.append("the nodes' Python and packages: not looked at (no node has what a run asks)")
    lines += [f"problem: {problem}" for problem in problems]
    data = {
        "ray_version": version.get("ray_version"),
        "address": backend.address,
        "nodes": nodes,
        "asked": _asked(backend),
        "placeable_now": now,
        "placeable": ever,
        "node": node,
        "problems": problems,
    }
    return CheckReport(ok=not problems, lines=lines, data=data)


def _node_check(backend: RayBackend, jobs: RayJobs) -> tuple[list[str], dict[str, Any] | None, str | None]:
    """(lines, what host/check.py saw, a problem): the check job, where a run would be placed."""
    job_id = f"potato-queue-check-{secrets.token_hex(4)}"
    asked = {"env": {}, "query": NVIDIA_SMI_QUERY, "packages": host_check.TRAINING_PACKAGES}
    body = check_job_request(backend, host_source(host_check), asked, job_id)
    try:
        jobs.submit(body)
        state = _ended(jobs, job_id)
        logs = jobs.logs(job_id).replace(body["entrypoint"], "(the check)")  # Ray echoes the command first
        facts = check_facts(logs)
    except RayError as exc:
        return [], None, f"the check job could not run: {exc.message}"
    if state is not None and state.status == PENDING:
        busy = f"the check job waited {CHECK_PENDING_WAIT_S:g} s for a run's resources, all in use"
        return [f"the nodes' Python and packages: not looked at ({busy})"], None, None
    if facts is None:
        said = f"ended {state.status}" if state is not None else f"did not end within {CHECK_JOB_WAIT_S:g} s"
        tail = logs.strip()[-600:]
        return (
            [],
            None,
            (
                f"the check job {job_id} {said} without an answer from the node's python ({backend.python})"
                + (f": {tail}" if tail else "")
                + "; fix: set the backend's python to an interpreter the nodes have (3.8 or newer)"
            ),
        )
    return _node_lines(facts), facts, None


def _ended(jobs: RayJobs, job_id: str) -> JobState | None:
    """The check job once it ended; still PENDING after CHECK_PENDING_WAIT_S, taken out of the queue; None after
    CHECK_JOB_WAIT_S, stopped."""
    state = jobs.wait_for(job_id, _placed, CHECK_PENDING_WAIT_S)
    if state is not None and state.status == PENDING:
        jobs.submit(removal_request(job_id))
        return state
    state = jobs.wait_for(job_id, _over, CHECK_JOB_WAIT_S - CHECK_PENDING_WAIT_S)
    if _over(state):
        return state
    jobs.stop(job_id)
    return None


def _placed(state: JobState | None) -> bool:
    return state is not None and state.status != PENDING


def _over(state: JobState | None) -> bool:
    return state is not None and state.status in TERMINAL


def _node_lines(facts: dict[str, Any]) -> list[str]:
    """What a run's worker would find on the node, in the words of the ssh check."""
    where = f"{facts.get('hostname', '?')}, CUDA_VISIBLE_DEVICES={facts.get('cuda_visible_devices') or 'unset'}"
    lines = [f"where a run would go ({where}): Python {facts['python']} ({facts.get('executable', '?')})"]
    gpus, archs = parse_gpus(facts.get("nvidia_smi") or ""), facts.get("arch_list")
    lines += [f"  {describe(gpu, archs)}" for gpu in gpus] or ["  no GPU (no nvidia-smi on the node's PATH)"]
    missing = sorted(name for name, present in facts["packages"].items() if not present)
    if missing:
        lines.append(f"training packages missing from {facts.get('executable', '?')}: {', '.join(missing)}")
    return lines
