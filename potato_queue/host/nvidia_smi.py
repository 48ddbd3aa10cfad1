"""What nvidia-smi says of a host's GPUs, read as real drivers print it: the query every side asks, its rows
as Gpu (`[N/A]` and `[Not Supported]` kept as unknown, MIG mode), the GPUs a CUDA_VISIBLE_DEVICES leaves a
process, and one GPU's memory in words.

Apart from gpus.py (which GPU a run gets, and the wait for one) because this is the reading every side shares
(the agent, the ssh bootstrap, `training check`, the local executor), with no rule of the choice in it.
Standard library only, Python 3.8+: it runs on the GPU host.
"""

import re
from typing import List, NamedTuple, Optional, Sequence

__all__ = [
    "NVIDIA_SMI_QUERY",
    "Gpu",
    "parse_gpus",
    "visible_gpus",
    "is_counted",
    "free_mb",
    "memory_words",
    "free_words",
    "USAGE_QUERY",
    "GpuSample",
    "parse_usage",
    "APPS_QUERY",
    "GpuApp",
    "parse_apps",
]

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    # mig.mode.current came with MIG (driver R450); compute_cap is newer (R470's nvidia-smi refuses it as "not a
    # valid field to query"), so asking for MIG mode costs no driver this query worked on before.
    "--query-gpu=index,name,memory.free,memory.total,utilization.gpu,compute_cap,mig.mode.current",
    "--format=csv,noheader,nounits",
]


# What a run's GPUs are doing (agent/gpu_watch.py samples it while the worker runs): power in W, busy %, MB used.
USAGE_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,power.draw,utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
]
# The processes that hold GPU memory (the leak guard, after a run ends): pid and MB, whoever owns them.
APPS_QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


class Gpu(NamedTuple):
    """One GPU as nvidia-smi shows it. A number it cannot tell is None: nvidia-smi printed `[N/A]` or
    `[Not Supported]` (a GPU with MIG on, unified memory, an older GPU)."""

    index: int
    name: str
    free_mb: Optional[float]
    total_mb: Optional[float]
    utilization_pct: Optional[float]
    compute_cap: Optional[str]  # "8.6"; None when nvidia-smi does not say
    mig: bool = False  # MIG mode on: the memory is its MIG instances', and a run gets one instance's share
    free_text: str = ""  # what nvidia-smi printed for memory.free when it was no number: "[N/A]"


def _number(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _rows(csv_text: str, min_fields: int) -> List[List[str]]:
    """nvidia-smi's CSV answer, a GPU's (or a process's) fields a row: lines that do not start with its index
    (or pid), or that have fewer than `min_fields`, are none (a blank line, `No devices were found`)."""
    rows = [[field.strip() for field in line.split(",")] for line in csv_text.splitlines()]
    return [fields for fields in rows if len(fields) >= min_fields and fields[0].isdigit()]


def parse_gpus(csv_text: str) -> List[Gpu]:
    """nvidia-smi's answer to NVIDIA_SMI_QUERY, one GPU a line; the fields after memory.total may be missing
    (an older query). Lines that are no GPU's (a blank line, `No devices were found`) are left out."""
    gpus = []
    for fields in _rows(csv_text, 4):
        fields += [""] * (7 - len(fields))
        free = _number(fields[2])
        cap = fields[5] if re.match(r"^\d+\.\d+$", fields[5]) else None
        gpus.append(
            Gpu(
                int(fields[0]),
                fields[1],
                free,
                _number(fields[3]),
                _number(fields[4]),
                cap,
                fields[6].lower() == "enabled",
                "" if free is not None else fields[2] or "[N/A]",
            )
        )
    return gpus


def visible_gpus(gpus: Sequence[Gpu], cuda_visible_devices: Optional[str]) -> List[Gpu]:
    """The GPUs a process started with this CUDA_VISIBLE_DEVICES can use (nvidia-smi shows all of them);
    all of them when it is unset or names GPUs by UUID, which nvidia-smi's index cannot be matched with."""
    if cuda_visible_devices is None:
        return list(gpus)
    parts = [part.strip() for part in cuda_visible_devices.split(",") if part.strip()]
    if not all(part.isdigit() for part in parts):
        return list(gpus)
    wanted = {int(part) for part in parts}
    return [gpu for gpu in gpus if gpu.index in wanted]


def is_counted(gpu: Gpu) -> bool:
    """Whether a GPU's free memory can be held against min_free_gpu_mb: nvidia-smi gave a number, and not
    for a GPU with MIG on, whose memory is split among its MIG instances."""
    return gpu.free_mb is not None and not gpu.mig


def free_mb(gpu: Gpu) -> float:
    """The GPU's free memory in MB, 0 when nvidia-smi does not say."""
    return gpu.free_mb if gpu.free_mb is not None else 0.0


def memory_words(gpu: Gpu) -> str:
    """`GPU 0: NVIDIA A100, 1200 of 81920 MB free`: what a wait for memory looks at."""
    return "GPU {}: {}, {}".format(gpu.index, gpu.name, free_words(gpu))


def free_words(gpu: Gpu) -> str:
    """`1200 of 81920 MB free`, or that nvidia-smi does not say and why."""
    if gpu.free_mb is None:
        return "free memory not reported, as MIG is on" if gpu.mig else "free memory unknown ({})".format(gpu.free_text)
    mig = ", MIG is on: its MIG instances' together" if gpu.mig else ""
    if gpu.total_mb is None:
        return "{:.0f} MB free{}".format(gpu.free_mb, mig)
    return "{:.0f} of {:.0f} MB free{}".format(gpu.free_mb, gpu.total_mb, mig)


class GpuSample(NamedTuple):
    """One GPU at one moment: None where nvidia-smi cannot tell (`[N/A]`: a GPU that reports no power)."""

    index: int
    power_w: Optional[float]
    utilization_pct: Optional[float]
    memory_used_mb: Optional[float]


def parse_usage(csv_text: str) -> List[GpuSample]:
    """nvidia-smi's answer to USAGE_QUERY, one GPU a line; lines that are no GPU's are left out."""
    return [GpuSample(int(f[0]), _number(f[1]), _number(f[2]), _number(f[3])) for f in _rows(csv_text, 4)]


class GpuApp(NamedTuple):
    """A process that holds GPU memory, as nvidia-smi lists it."""

    pid: int
    used_mb: Optional[float]


def parse_apps(csv_text: str) -> List[GpuApp]:
    """nvidia-smi's answer to APPS_QUERY; `No running processes found` and blank lines are left out."""
    return [GpuApp(int(f[0]), _number(f[1])) for f in _rows(csv_text, 2)]
