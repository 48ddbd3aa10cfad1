"""Which GPU a run gets on a host, from what nvidia-smi and the host's torch say (SSH-4, ERR-3, ERR-5).

Standard library only, Python 3.8+: this runs on the GPU host, before
anything of the trainer's is imported. Pure functions: the bootstrap feeds
them nvidia-smi's CSV and torch's arch list.
"""

import re
from typing import List, NamedTuple, Optional, Sequence

__all__ = [
    "NVIDIA_SMI_QUERY",
    "Gpu",
    "Choice",
    "GpuRefused",
    "parse_gpus",
    "has_kernels",
    "describe",
    "choose",
]

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,memory.free,memory.total,utilization.gpu,compute_cap",
    "--format=csv,noheader,nounits",
]
NO_KERNELS = "(torch there has no kernels for it)"


class Gpu(NamedTuple):
    index: int
    name: str
    free_mb: float
    total_mb: float
    utilization_pct: Optional[float]
    compute_cap: Optional[str]  # "8.6"; None when nvidia-smi is too old to say


class Choice(NamedTuple):
    """CUDA_VISIBLE_DEVICES for the run ("" for none) and what the run log says of it."""

    visible_devices: str
    device: str  # "cuda" or "cpu"
    line: str


class GpuRefused(Exception):
    """No GPU fits the backend's gpus/min_free_gpu_mb: the run does not start."""


def _number(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_gpus(csv_text: str) -> List[Gpu]:
    """nvidia-smi's answer to NVIDIA_SMI_QUERY; lines it cannot read are left out."""
    gpus = []
    for line in csv_text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 4 or not fields[0].isdigit():
            continue
        free, total = _number(fields[2]), _number(fields[3])
        if free is None or total is None:
            continue
        utilization = _number(fields[4]) if len(fields) > 4 else None
        cap = fields[5] if len(fields) > 5 and re.match(r"^\d+\.\d+$", fields[5]) else None
        gpus.append(Gpu(int(fields[0]), fields[1], free, total, utilization, cap))
    return gpus


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
    text = "GPU {}: {}, {:.0f} of {:.0f} MB free{}".format(gpu.index, gpu.name, gpu.free_mb, gpu.total_mb, busy)
    return text if has_kernels(gpu, arch_list) else text + " " + NO_KERNELS


def choose(setting: str, gpus: Sequence[Gpu], min_free_mb: float, arch_list: Optional[Sequence[str]] = None,
           host: str = "this host") -> Choice:
    """The GPU(s) for a run by the backend's `gpus` (auto, none, "1", "0,1"); GpuRefused when none fits."""
    if setting == "none":
        return Choice("", "cpu", "gpus: none, training on CPU")
    if setting != "auto":
        return _pinned(setting, gpus, arch_list, host)
    if not gpus:
        return Choice("", "cpu", "no GPU on {}: training on CPU".format(host))
    usable = [gpu for gpu in gpus if has_kernels(gpu, arch_list)]
    if not usable:
        raise GpuRefused("This host's torch has no kernels for any of its GPUs")
    best = max(usable, key=lambda gpu: (gpu.free_mb, -gpu.index))
    if best.free_mb < min_free_mb:
        raise GpuRefused("No GPU has {:.0f} MB free".format(min_free_mb))
    return Choice(str(best.index), "cuda", "the run gets " + describe(best, arch_list))


def _pinned(setting: str, gpus: Sequence[Gpu], arch_list: Optional[Sequence[str]], host: str) -> Choice:
    by_index = {gpu.index: gpu for gpu in gpus}
    wanted = [int(part) for part in setting.split(",")]
    missing = [index for index in wanted if index not in by_index]
    if missing:
        have = ", ".join(str(index) for index in sorted(by_index)) or "none"
        raise GpuRefused("gpus: {} asks for GPU {}, but {} has GPUs: {}".format(
            setting, ",".join(str(index) for index in missing), host, have))
    unusable = [index for index in wanted if not has_kernels(by_index[index], arch_list)]
    if unusable:
        raise GpuRefused("gpus: {} asks for GPU {}, and this host's torch has no kernels for it".format(
            setting, ",".join(str(index) for index in unusable)))
    return Choice(setting, "cuda", "the run gets " + "; ".join(describe(by_index[i], arch_list) for i in wanted))
