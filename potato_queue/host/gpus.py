"""Which GPU a run gets on a host, from what nvidia-smi and the host's torch say (SSH-4, ERR-3, ERR-5),
and the wait for one with min_free_gpu_mb free (an ssh run's setup, an agent before it claims).

Standard library only, Python 3.8+: this runs on the GPU host, before
anything of the trainer's is imported. Pure functions: the bootstrap and the
agent feed them nvidia-smi's rows (nvidia_smi.py reads them) and torch's arch list;
the executors turn a GpuWait into the step line and, past the wait's limit, the run's error.
"""

import re
from typing import Any, Dict, NamedTuple, Optional, Sequence

from potato_queue.host.nvidia_smi import Gpu, free_mb, free_words, is_counted, memory_words

__all__ = [
    "NO_KERNELS",
    "Choice",
    "GpuRefused",
    "GpuWait",
    "GpuBusy",
    "GPU_POLL_S",
    "GPU_REPORT_S",
    "agent_pick",
    "has_kernels",
    "describe",
    "choose",
    "agent_wait",
    "agent_gpu_problem",
    "ssh_wait_line",
    "ssh_wait_expired",
    "agent_wait_line",
    "agent_wait_expired",
]

NO_KERNELS = "(torch there has no kernels for it)"
# How often a wait for a free GPU asks nvidia-smi again: a freed GPU is taken within seconds, and
# nvidia-smi (tens of milliseconds) costs the host nothing at this rate.
GPU_POLL_S = 3.0
# How often a wait is said again (the step line, the agent's report to the server) while what it sees
# changes: free memory moves all the time, and each new step line is a line in run.log.
GPU_REPORT_S = 15.0


class Choice(NamedTuple):
    """CUDA_VISIBLE_DEVICES for the run ("" for none) and what the run log says of it."""

    visible_devices: str
    device: str  # "cuda" or "cpu"
    line: str


class GpuRefused(Exception):
    """No GPU fits the backend's gpus (or never could): the run does not start."""


class GpuWait(NamedTuple):
    """What a wait for GPU memory waits for: `min_free_mb` on a GPU; `best` the closest GPU now (None when
    nvidia-smi shows none); `pinned` the backend's `gpus` when it names GPUs (all of them must have it)."""

    min_free_mb: float
    best: Optional[Gpu]
    pinned: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        best = None if self.best is None else self.best._asdict()
        return {"min_free_mb": self.min_free_mb, "best": best, "pinned": self.pinned}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "GpuWait":
        best = data.get("best")
        return cls(float(data["min_free_mb"]), None if best is None else Gpu(**best), data.get("pinned"))


class GpuBusy(GpuRefused):
    """No GPU has min_free_gpu_mb free now, though one could: waiting may fix it (`wait` says for what)."""

    def __init__(self, message: str, wait: GpuWait) -> None:
        super().__init__(message)
        self.wait = wait


def has_kernels(gpu: Gpu, arch_list: Optional[Sequence[str]]) -> bool:
    """Whether a torch built for `arch_list` (torch.cuda.get_arch_list()) runs on this GPU: a cubin for
    the same major version and a minor no newer, or PTX for a capability no newer (JIT-compiled).
    Unknown (no arch list, no capability) counts as yes: torch will say so itself."""
    if not arch_list or gpu.compute_cap is None:
        return True
    major, minor = (int(part) for part in gpu.compute_cap.split("."))
    for arch in arch_list:
        found = re.match(r"^(sm|compute)_(\d+)(\d)a?$", arch)
        if not found:
            continue
        kind, arch_major, arch_minor = found.group(1), int(found.group(2)), int(found.group(3))
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        if kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return True
    return False


def describe(gpu: Gpu, arch_list: Optional[Sequence[str]] = None) -> str:
    """`GPU 1: NVIDIA A100, 70000 of 81920 MB free, 3 % busy`, marked when torch cannot use it."""
    busy = "" if gpu.utilization_pct is None else ", {:g} % busy".format(gpu.utilization_pct)
    text = memory_words(gpu) + busy
    return text if has_kernels(gpu, arch_list) else text + " " + NO_KERNELS


def choose(
    setting: str,
    gpus: Sequence[Gpu],
    min_free_mb: float,
    arch_list: Optional[Sequence[str]] = None,
    host: str = "this host",
) -> Choice:
    """The GPU(s) for a run by the backend's `gpus` (auto, none, "1", "0,1"); GpuRefused when none fits."""
    if setting == "none":
        return Choice("", "cpu", "gpus: none, training on CPU")
    if setting != "auto":
        return _pinned(setting, gpus, min_free_mb, arch_list, host)
    if not gpus:
        return Choice("", "cpu", "no GPU on {}: training on CPU".format(host))
    usable = [gpu for gpu in gpus if has_kernels(gpu, arch_list)]
    if not usable:
        raise GpuRefused("This host's torch has no kernels for any of its GPUs")
    counted = [gpu for gpu in usable if is_counted(gpu)] if min_free_mb > 0 else usable
    if not counted:  # waiting would not make nvidia-smi tell
        raise GpuRefused(_uncounted(usable, min_free_mb, host))
    _never_enough(counted, min_free_mb, host)
    best = _most_free(counted)
    if min_free_mb > 0 and free_mb(best) < min_free_mb:
        skipped = [gpu for gpu in usable if not is_counted(gpu)]
        raise GpuBusy(
            "No GPU has {:.0f} MB free{}".format(
                min_free_mb, "".join(" (GPU {} not counted: {})".format(gpu.index, free_words(gpu)) for gpu in skipped)
            ),
            GpuWait(min_free_mb, best),
        )
    return Choice(str(best.index), "cuda", "the run gets " + describe(best, arch_list))


def _uncounted(gpus: Sequence[Gpu], min_free_mb: float, host: str) -> str:
    """Why auto cannot hold any GPU to min_free_gpu_mb, and the ways to run anyway."""
    mig = " (a GPU with MIG on has its memory split among its MIG instances)" if any(g.mig for g in gpus) else ""
    return (
        "min_free_gpu_mb ({:.0f}) cannot be checked on {}: nvidia-smi reports no free memory for its GPUs{} "
        '({}). Fix: pin a GPU with the backend\'s gpus, like gpus: "{}" (a pinned GPU whose free memory is '
        "unknown is taken unchecked), or set min_free_gpu_mb: 0"
    ).format(min_free_mb, host, mig, "; ".join(memory_words(gpu) for gpu in gpus), gpus[0].index)


def _most_free(gpus: Sequence[Gpu]) -> Gpu:
    """The GPU with the most free memory, those whose free memory is unknown last."""
    return max(gpus, key=lambda gpu: (is_counted(gpu), free_mb(gpu), -gpu.index))


def _never_enough(gpus: Sequence[Gpu], min_free_mb: float, host: str) -> None:
    """A wait that could never end is refused at once: no GPU has min_free_mb of memory at all."""
    sized = [gpu for gpu in gpus if gpu.total_mb is not None]
    largest = max(sized, key=lambda gpu: gpu.total_mb or 0.0) if sized else None
    if largest is not None and (largest.total_mb or 0.0) < min_free_mb:
        raise GpuRefused(
            "min_free_gpu_mb ({:.0f}) is more than any GPU on {} has: the largest, GPU {}, has {:.0f} MB".format(
                min_free_mb, host, largest.index, largest.total_mb
            )
        )


def _pinned(
    setting: str, gpus: Sequence[Gpu], min_free_mb: float, arch_list: Optional[Sequence[str]], host: str
) -> Choice:
    by_index = {gpu.index: gpu for gpu in gpus}
    wanted = [int(part) for part in setting.split(",")]
    missing = [index for index in wanted if index not in by_index]
    if missing:
        have = ", ".join(str(index) for index in sorted(by_index)) or "none"
        raise GpuRefused(
            "gpus: {} asks for GPU {}, but {} has GPUs: {}".format(
                setting, ",".join(str(index) for index in missing), host, have
            )
        )
    unusable = [index for index in wanted if not has_kernels(by_index[index], arch_list)]
    if unusable:
        raise GpuRefused(
            "gpus: {} asks for GPU {}, and this host's torch has no kernels for it".format(
                setting, ",".join(str(index) for index in unusable)
            )
        )
    # A pinned GPU whose free memory nvidia-smi does not tell (MIG on) is taken unchecked: pinning is how to ask.
    counted = [by_index[index] for index in wanted if is_counted(by_index[index])]
    _never_enough(counted, min_free_mb, host)
    short = [gpu for gpu in counted if free_mb(gpu) < min_free_mb]
    if short:
        worst = min(short, key=free_mb)
        raise GpuBusy(
            "gpus: {} asks for GPU {}, which has {}, less than min_free_gpu_mb ({:.0f})".format(
                setting, worst.index, free_words(worst), min_free_mb
            ),
            GpuWait(min_free_mb, worst, setting),
        )
    unchecked = [index for index in wanted if not is_counted(by_index[index])] if min_free_mb > 0 else []
    note = (
        " (min_free_gpu_mb not checked on GPU {}: its free memory is unknown)".format(
            ",".join(str(index) for index in unchecked)
        )
        if unchecked
        else ""
    )
    return Choice(setting, "cuda", "the run gets " + "; ".join(describe(by_index[i], arch_list) for i in wanted) + note)


def agent_wait(gpus: Sequence[Gpu], min_free_mb: float) -> Optional[GpuWait]:
    """Whether an agent must wait before it claims: None when it may claim (no minimum, or a GPU has it)."""
    counted = [gpu for gpu in gpus if is_counted(gpu)]
    if min_free_mb <= 0 or any(free_mb(gpu) >= min_free_mb for gpu in counted):
        return None
    return GpuWait(min_free_mb, _most_free(counted) if counted else None)


def agent_pick(gpus: Sequence[Gpu], min_free_mb: float) -> Optional[Choice]:
    """The GPU a run an agent just claimed gets: the one with most memory free (min_free_mb of it, when the
    GPU has not filled up since the claim); None without a minimum (the agent's CUDA_VISIBLE_DEVICES holds)."""
    counted = [gpu for gpu in gpus if is_counted(gpu)]
    if min_free_mb <= 0 or not counted:
        return None
    best = _most_free(counted)
    return Choice(str(best.index), "cuda", "the run gets " + describe(best))


def agent_gpu_problem(has_nvidia_smi: bool, gpus: Sequence[Gpu], min_free_mb: float) -> Optional[str]:
    """Why an agent asked to wait for GPU memory does not start (a wait that could never end), or None."""
    if min_free_mb <= 0:
        return None
    fix = "; fix: start the agent without --min-free-gpu-mb to take runs as a CPU machine"
    if not has_nvidia_smi:
        return "--min-free-gpu-mb {:.0f} waits for a GPU, but there is no nvidia-smi on this machine's PATH{}".format(
            min_free_mb, fix + ", or put nvidia-smi on PATH"
        )
    if not gpus:
        return "--min-free-gpu-mb {:.0f} waits for a GPU, but nvidia-smi shows none this agent can use{}".format(
            min_free_mb, fix + ", or check CUDA_VISIBLE_DEVICES and the driver (nvidia-smi)"
        )
    counted = [gpu for gpu in gpus if is_counted(gpu)]
    if not counted:  # the agent would never claim
        mig = (
            (
                "; to give its runs one MIG instance, start it with CUDA_VISIBLE_DEVICES=MIG-<uuid> (nvidia-smi -L "
                "lists them)"
            )
            if any(gpu.mig for gpu in gpus)
            else ""
        )
        return (
            "--min-free-gpu-mb {:.0f} waits for free GPU memory, but nvidia-smi reports none here ({}); fix: "
            "start the agent without --min-free-gpu-mb: its runs then get the GPUs CUDA_VISIBLE_DEVICES gives it, "
            "unchecked{}"
        ).format(min_free_mb, "; ".join(memory_words(gpu) for gpu in gpus), mig)
    largest = max(counted, key=lambda gpu: gpu.total_mb or 0.0)
    if largest.total_mb is not None and largest.total_mb < min_free_mb:
        return (
            "--min-free-gpu-mb {:.0f} is more than any GPU here has: the largest, GPU {}, has {:.0f} MB; "
            "fix: lower --min-free-gpu-mb"
        ).format(min_free_mb, largest.index, largest.total_mb)
    return None


def _seen(wait: GpuWait) -> str:
    return "nvidia-smi shows no GPU" if wait.best is None else memory_words(wait.best)


def ssh_wait_line(wait: GpuWait, host: str) -> str:
    """The step line of an ssh run whose setup waits for GPU memory."""
    if wait.pinned:
        return "waiting for GPU {} on {} to have {:.0f} MB free (now: {})".format(
            wait.pinned, host, wait.min_free_mb, _seen(wait)
        )
    return "waiting for a GPU with {:.0f} MB free on {} (best now: {})".format(wait.min_free_mb, host, _seen(wait))


def ssh_wait_expired(wait: GpuWait, host: str, backend_name: str, limit_s: float) -> str:
    """Why an ssh run failed when no GPU had room within setup_timeout_s, and the three ways out."""
    what = "GPU {} on {} did not have".format(wait.pinned, host) if wait.pinned else "No GPU on {} had".format(host)
    return (
        "{} {:.0f} MB free within setup_timeout_s ({:g} s) (at the end: {}); the run did not start. "
        "Fix: free memory on a GPU of {}, lower min_free_gpu_mb of backend {}, or raise its setup_timeout_s"
    ).format(what, wait.min_free_mb, limit_s, _seen(wait), host, backend_name)


def agent_wait_line(backend_name: str, host: str, wait: GpuWait) -> str:
    """The step line of a run offered to an agent backend whose agent waits for GPU memory before it claims."""
    return "waiting for the agent on {} ({}): its GPUs have less than {:.0f} MB free (best: {})".format(
        backend_name, host, wait.min_free_mb, _seen(wait)
    )


def agent_wait_expired(backend_name: str, host: str, wait: GpuWait, limit_s: float) -> str:
    """Why a run on an agent backend failed when its agent's GPUs had no room within queue_timeout_s."""
    return (
        "No GPU of the agent on {} ({}) had {:.0f} MB free within queue_timeout_s ({:g} s) (at the end: {}), "
        "so it claimed no run. Fix: free memory on a GPU of {}, start its agent with a lower --min-free-gpu-mb, "
        "or raise queue_timeout_s of backend {}"
    ).format(backend_name, host, wait.min_free_mb, limit_s, _seen(wait), host, backend_name)
