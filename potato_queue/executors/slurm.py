"""The slurm backend: a cluster behind its scheduler, through its login node (SLURM-1..8).

The run's agent starts on the login node over one ssh session, as for ssh
(remote/session.py; code by hash, no venv and no GPU choice there). The agent
submits only the worker, with sbatch (agent/launchers/slurm.py), and follows
it through the job folder on storage the compute nodes share. The hard stop
adds a `scancel` of the run's job, found by its name, before the host's
processes end: a frozen or killed agent never leaves an allocation behind.
`training check` asks the login node for SLURM's commands, where remote_dir
really is, job_python and sinfo's view of the partition.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from potato_queue.config import SlurmBackend
from potato_queue.errors import PotatoQueueError
from potato_queue.executors.base import CheckReport, Executor, LaunchSpec, RunHandle
from potato_queue.executors.remote.bootstrap import boot_header
from potato_queue.executors.remote.session import failed_check, host_facts, session_lines, start_agent
from potato_queue.wire.isolated import passed_env
from potato_queue.wire.sbatch import NO_SBATCH_FIX, hard_stop_s, job_name, no_sbatch

__all__ = ["SlurmExecutor", "slurm_check_report", "parse_sinfo", "default_partition", "NODE_LOCAL"]

NODE_LOCAL = ("/tmp", "/var/tmp")
_GPU_COUNT = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


def _gpus(gres: str) -> int:
    return sum(int(count) for count in _GPU_COUNT.findall(gres))


def parse_sinfo(text: str) -> list[dict[str, Any]]:
    """`sinfo -h -N -O NodeList:|,Partition:|,StateLong:|,Gres:|,GresUsed:|` as one dict per node line."""
    nodes = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) >= 5 and parts[0]:
            total, used = _gpus(parts[3]), _gpus(parts[4])
            nodes.append(
                {
                    "node": parts[0],
                    "partition": parts[1].rstrip("*"),
                    "state": parts[2],
                    "gpus": total,
                    "free_gpus": max(0, total - used),
                }
            )
    return nodes


def default_partition(text: str) -> str | None:
    """The partition sinfo marks with `*`: where a job without --partition goes."""
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) >= 2 and parts[1].endswith("*"):
            return parts[1].rstrip("*")
    return None


def _partition_line(backend: SlurmBackend, facts: dict[str, Any]) -> str:
    nodes = parse_sinfo(facts.get("sinfo") or "")
    partition = backend.sbatch_setting("partition")
    if not partition:  # sinfo listed every partition's nodes: a node in three partitions is still one node
        partition = default_partition(facts.get("sinfo") or "")
        nodes = [node for node in nodes if node["partition"] == partition] if partition else nodes
        partition = f"{partition} (the default)" if partition else "the default partition"
    if not nodes:
        return f"sinfo shows no node in {partition}" + (f": {facts['sinfo_error']}" if facts.get("sinfo_error") else "")
    states = sorted({node["state"] for node in nodes})
    free = sum(node["free_gpus"] for node in nodes if node["state"] in ("idle", "mixed"))
    total = sum(node["gpus"] for node in nodes)
    return f"partition {partition}: {len(nodes)} node(s), {', '.join(states)}; {free} of {total} GPUs free"


def slurm_check_report(backend: SlurmBackend, facts: dict[str, Any]) -> CheckReport:
    """SLURM-5: sbatch, squeue and scancel on PATH, remote_dir not node-local, the Pythons, the partition."""
    host, slurm = backend.host, facts["slurm"]
    lines = [f"{host}: Python {facts['python']} ({facts['executable']}) runs the agent", *session_lines(host, facts)]
    problems: list[str] = []
    tools = slurm["tools"]
    if not tools.get("sbatch"):
        problems.append(f"{no_sbatch(host)}; fix: {NO_SBATCH_FIX}")
    for name in ("squeue", "scancel"):
        if not tools.get(name):
            problems.append(
                f"{host} has no {name} on PATH, so runs cannot be followed or cancelled; fix: {NO_SBATCH_FIX}"
            )
    lines += [f"  {name}: {tools[name] or 'not on PATH'}" for name in ("sbatch", "squeue", "scancel", "scontrol")]
    real = slurm["remote_dir"]
    if any(real == top or real.startswith(top + "/") for top in NODE_LOCAL):
        problems.append(
            f"remote_dir {backend.remote_dir} is {real} on {host}, which is local to each node; fix: set "
            "remote_dir to a folder on storage the compute nodes share"
        )
    else:
        missing = "" if slurm.get("remote_dir_exists") else "not there yet, the first run makes it; "
        lines.append(f"remote_dir: {real} ({missing}it must be on storage the compute nodes share)")
    seen = f"on the login node: {slurm['job_python']}" if slurm["job_python"] else "not on the login node's PATH"
    lines.append(
        f"job_python: {backend.job_python} runs the worker on the compute nodes ({seen}; the check cannot see "
        "the compute nodes' packages: a missing one fails the first run with its import error in run.log)"
    )
    lines.append(_partition_line(backend, slurm))
    lines += [f"problem: {problem}" for problem in problems]
    data = {
        "host": host,
        "python": facts["python"],
        "executable": facts["executable"],
        "tools": tools,
        "remote_dir": real,
        "job_python": backend.job_python,
        "job_python_on_login_node": slurm["job_python"],
        "nodes": parse_sinfo(slurm.get("sinfo") or ""),
        "problems": problems,
        "transport": facts["transport"],
        "banner": facts.get("banner"),
    }
    return CheckReport(ok=not problems, lines=lines, data=data)


class SlurmExecutor(Executor[SlurmBackend]):
    type_name = "slurm"

    def check(self, model: str | None = None) -> CheckReport:
        asked: dict[str, Any] = {
            "env": self.backend.env,
            "query": [],
            "packages": [],
            "slurm": {
                "remote_dir": self.backend.remote_dir,
                "job_python": self.backend.job_python,
                "partition": self.backend.sbatch_setting("partition"),
            },
        }
        if model is not None:
            asked["model"] = model
        try:
            facts = host_facts(self.backend, self.backend_name, asked, self.settings)
        except PotatoQueueError as exc:
            return failed_check(exc)
        report = slurm_check_report(self.backend, facts)
        if model is not None:  # the job's GPU is SLURM's choice, not to be seen from the login node
            report.data["llm_facts"] = {"model_config": facts.get("model_config"), "gpus": None}
        return report

    def launch(self, spec: LaunchSpec) -> RunHandle:
        header = boot_header(self.backend, packages=[], num_threads=None, gpus="none", min_free_gpu_mb=0, slurm=True)
        # By name, so that even a job whose id never reached us is found; its owner's only.
        # SLURM_CONF, a PATH to scancel; on a command line the host's other accounts read, so no secret
        env = [f"{name}={value}" for name, value in passed_env(self.backend.env).items()]
        stop_job = (
            shlex.join(["env", *env, "scancel", "--name", job_name(spec.run_id), "--user"]) + ' "$(id -un)" 2>/dev/null'
        )
        return start_agent(
            spec,
            self.backend,
            self.settings,
            header,
            assignment={"slurm": self.backend.job_settings(), "host": self.backend.host},
            stop_job=stop_job,
            hard_stop_s=hard_stop_s(self.backend.poll_interval_s),
        )
