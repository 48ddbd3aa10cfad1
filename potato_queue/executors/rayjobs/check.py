"""`training check` of a ray backend: the head's version, the auth result, the nodes and their GPUs and CPUs,
and whether a job with the backend's resources can be placed now, or ever."""

from __future__ import annotations

from typing import Any

from potato_queue.backends.models import RayBackend
from potato_queue.executors.base import CheckReport
from potato_queue.executors.rayjobs.client import RayError, RayJobs
from potato_queue.executors.rayjobs.text import asked_resources

__all__ = ["ray_check_report", "placement"]


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
    lines += [f"problem: {problem}" for problem in problems]
    data = {
        "ray_version": version.get("ray_version"),
        "address": backend.address,
        "nodes": nodes,
        "asked": _asked(backend),
        "placeable_now": now,
        "placeable": ever,
        "problems": problems,
    }
    return CheckReport(ok=not problems, lines=lines, data=data)
