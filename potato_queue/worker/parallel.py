"""Data-parallel runs: how many ranks a run gets and the command line and environment of each.

Standard library only, Python 3.8+; text in, text out (ranks.py starts and
watches the processes, trainers/parallel.py is the torch side). A run trains
data-parallel when its trainer can (``Trainer.data_parallel``), its device is
a GPU of the worker's choosing (``auto``, ``cuda``, ``gpu``), and more than one
GPU is visible: ``CUDA_VISIBLE_DEVICES`` names them (an ssh backend's
``gpus: "0,1"``, SLURM's gres). Each rank is ``python -m potato_queue.worker
--spec SPEC --rank R`` with the environment ``torchrun`` would give it (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus its device and its
share of the threads. One GPU, the CPU, or a named device: the run stays in
the worker's own process, as it always did.

``POTATO_QUEUE_CPU_RANKS=N`` (for tests and CPU-only machines) asks for N CPU
ranks over gloo, so that the real data-parallel path runs where no GPU is.
"""

import socket
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence

from potato_queue.wire.isolated import THREAD_ENV_VARS

__all__ = [
    "CPU_RANKS_VAR",
    "DEVICE_VAR",
    "RankInfo",
    "RankLaunch",
    "cpu_ranks",
    "visible_gpus",
    "world_for",
    "rank_launches",
    "rank_info",
    "free_port",
    "describe_parallel",
    "threads_per_rank",
]

CPU_RANKS_VAR = "POTATO_QUEUE_CPU_RANKS"
DEVICE_VAR = "POTATO_QUEUE_RANK_DEVICE"  # the rank's device (cuda:LOCAL_RANK, or cpu)
MASTER_ADDR = "127.0.0.1"  # one machine: the ranks meet on the loopback, never on a network others reach
_CHOOSABLE = ("auto", "cuda", "gpu")  # a device the worker picks; "cuda:1" or "cpu" is the user's own choice


class RankInfo(NamedTuple):
    """What a rank knows of itself (from its environment)."""

    rank: int
    local_rank: int
    world_size: int
    device: str
    threads: Optional[int]


class RankLaunch(NamedTuple):
    """One rank's command line and the variables it gets beyond the worker's own environment."""

    rank: int
    device: str
    argv: List[str]
    env: Dict[str, str]


def visible_gpus(environ: Mapping[str, str]) -> List[str]:
    """The GPUs CUDA_VISIBLE_DEVICES names (empty when unset: then which GPUs exist is torch's to say, and
    the run keeps to one, the default)."""
    value = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not value or value in ("-1", "none", "NoDevFiles"):
        return []
    return [part.strip() for part in value.split(",") if part.strip()]


def cpu_ranks(environ: Mapping[str, str]) -> int:
    """The CPU ranks POTATO_QUEUE_CPU_RANKS asks for (0: none asked)."""
    value = environ.get(CPU_RANKS_VAR, "").strip()
    return int(value) if value.isdigit() else 0


def world_for(device: str, data_parallel: bool, environ: Mapping[str, str]) -> int:
    """How many ranks a run gets: the visible GPUs, or POTATO_QUEUE_CPU_RANKS; 1 means in-process."""
    if not data_parallel:
        return 1
    if cpu_ranks(environ) > 1:
        return cpu_ranks(environ)
    if (device or "auto").strip().lower() not in _CHOOSABLE:
        return 1
    return max(1, len(visible_gpus(environ)))


def threads_per_rank(num_threads: Optional[int], world: int, cpus: Optional[int]) -> int:
    """The run's threads (limits.num_threads, else the machine's CPUs) shared out: at least one a rank."""
    return max(1, (num_threads or cpus or 1) // world)


def rank_launches(
    python_argv: Sequence[str], spec_path: str, world: int, on_gpus: bool, port: int, threads: int
) -> List[RankLaunch]:
    """Each rank's command line and environment. `python_argv` is how this worker's Python runs the
    worker module (isolated.python_argv without its arguments)."""
    launches = []
    for rank in range(world):
        device = "cuda:%d" % rank if on_gpus else "cpu"
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": MASTER_ADDR,
            "MASTER_PORT": str(port),
            DEVICE_VAR: device,
        }
        env.update({name: str(threads) for name in THREAD_ENV_VARS})
        launches.append(RankLaunch(rank, device, list(python_argv) + ["--spec", spec_path, "--rank", str(rank)], env))
    return launches


def rank_info(environ: Mapping[str, str]) -> RankInfo:
    """A rank's own view, from the environment rank_launches gave it."""
    threads = environ.get("OMP_NUM_THREADS", "")
    return RankInfo(
        rank=int(environ["RANK"]),
        local_rank=int(environ["LOCAL_RANK"]),
        world_size=int(environ["WORLD_SIZE"]),
        device=environ.get(DEVICE_VAR, "cpu"),
        threads=int(threads) if threads.isdigit() else None,
    )


def free_port() -> int:
    """A TCP port free on the loopback now (rank 0 listens on it for the others' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((MASTER_ADDR, 0))
        return int(sock.getsockname()[1])


def describe_parallel(launches: Sequence[RankLaunch], environ: Mapping[str, str]) -> str:
    """run.log's line: how the run trains."""
    devices = [launch.device for launch in launches]
    if devices[0] == "cpu":
        return "data-parallel on %d CPU processes (%s=%d, for tests and CPU-only machines), torch DDP over gloo" % (
            len(devices),
            CPU_RANKS_VAR,
            len(devices),
        )
    named = visible_gpus(environ)
    return "data-parallel on %d GPUs (%s; CUDA_VISIBLE_DEVICES=%s), one process each, torch DDP over nccl" % (
        len(devices),
        ", ".join(devices),
        ",".join(named),
    )
