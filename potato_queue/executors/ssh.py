"""The ssh backend: a GPU server reached by ssh, with nothing installed there by hand (SSH-1..12).

The run's agent starts over one ssh session (remote/session.py): the bootstrap
there checks the interpreter, takes the code when it is missing, builds the
venv once per `packages` list, picks the GPU (host/gpus.py) and execs the
agent, whose worker runs on that host. `training check` runs host/check.py
there and decides the GPU as a run would.
"""

from __future__ import annotations

from typing import Any

from potato_queue.config import SshBackend
from potato_queue.errors import PotatoQueueError
from potato_queue.executors.base import CheckReport, Executor, LaunchSpec, RunHandle
from potato_queue.executors.remote.bootstrap import boot_header
from potato_queue.executors.remote.session import failed_check, host_facts, session_lines, start_agent
from potato_queue.host.check import TRAINING_PACKAGES
from potato_queue.host.gpus import GpuBusy, GpuRefused, choose, describe, has_kernels
from potato_queue.host.nvidia_smi import NVIDIA_SMI_QUERY, parse_gpus

__all__ = ["SshExecutor", "check_report", "llm_facts"]

# What `training check` looks for in the host's interpreter (the trainers' import names).


def check_report(backend: SshBackend, facts: dict[str, Any]) -> CheckReport:
    """The check's report from what host/check.py saw, deciding the GPU as a run would."""
    host = backend.host
    gpus, archs = parse_gpus(facts.get("nvidia_smi") or ""), facts.get("arch_list")
    lines = [f"{host}: Python {facts['python']} ({facts['executable']})", *session_lines(host, facts)]
    lines += [f"  {describe(gpu, archs)}" for gpu in gpus] or [f"  no GPU (no nvidia-smi on {host}'s PATH)"]
    ok, gpu_line = True, ""
    try:
        gpu_line = choose(backend.gpus, gpus, backend.min_free_gpu_mb, archs, host).line
        lines.append(f"a run now: {gpu_line}")
    except GpuBusy as busy:
        ok, gpu_line = False, str(busy)
        lines.append(
            f"a run now would not start: {busy} (it would wait up to setup_timeout_s, "
            f"{backend.setup_timeout_s:g} s, for one)"
        )
    except GpuRefused as refused:
        ok, gpu_line = False, str(refused)
        lines.append(f"a run now would not start: {refused}")
    missing = sorted(name for name, present in facts["packages"].items() if not present)
    if missing:
        venv = (
            f"; the backend's packages go into a venv at the first run: {', '.join(backend.packages)}"
            if backend.packages
            else ""
        )
        lines.append(f"training packages missing from {facts['executable']}: {', '.join(missing)}{venv}")
    data = {
        "host": host,
        "python": facts["python"],
        "executable": facts["executable"],
        "gpus": [gpu._asdict() | {"usable": has_kernels(gpu, archs)} for gpu in gpus],
        "gpu": gpu_line,
        "missing_packages": missing,
        "transport": facts["transport"],
        "banner": facts.get("banner"),
    }
    return CheckReport(ok=ok, lines=lines, data=data)


def llm_facts(facts: dict[str, Any], setting: str) -> dict[str, Any]:
    """What the check's LLM fit needs of the host (Executor.check): the GPUs a run may get (`gpus`: auto, none,
    or pinned ones), those whose kernels run the host's torch only."""
    gpus = [gpu for gpu in parse_gpus(facts.get("nvidia_smi") or "") if has_kernels(gpu, facts.get("arch_list"))]
    if setting == "none":
        gpus = []
    elif setting != "auto":
        gpus = [gpu for gpu in gpus if str(gpu.index) in setting.split(",")]
    # A GPU whose free memory nvidia-smi does not tell (MIG on) cannot be held against the model's need.
    known = [[gpu.index, gpu.free_mb] for gpu in gpus if gpu.free_mb is not None]
    return {
        "model_config": facts.get("model_config"),
        "gpus": known,
        "bitsandbytes": bool(facts["packages"].get("bitsandbytes")),
    }


class SshExecutor(Executor[SshBackend]):
    type_name = "ssh"

    def check(self, model: str | None = None) -> CheckReport:
        """SSH-6: the host's Python, each GPU, the GPU a run would get, training packages it lacks."""
        asked: dict[str, Any] = {"env": self.backend.env, "query": NVIDIA_SMI_QUERY, "packages": TRAINING_PACKAGES}
        if model is not None:
            asked.update(model=model, packages=[*TRAINING_PACKAGES, "bitsandbytes"])
        try:
            facts = host_facts(self.backend, self.backend_name, asked, self.settings)
        except PotatoQueueError as exc:
            return failed_check(exc)
        report = check_report(self.backend, facts)
        if model is not None:
            report.data["llm_facts"] = llm_facts(facts, self.backend.gpus)
        return report

    def launch(self, spec: LaunchSpec) -> RunHandle:
        header = boot_header(
            self.backend,
            packages=self.backend.packages,
            num_threads=self.backend.num_threads,
            gpus=self.backend.gpus,
            min_free_gpu_mb=self.backend.min_free_gpu_mb,
        )
        return start_agent(spec, self.backend, self.settings, header, assignment={})
