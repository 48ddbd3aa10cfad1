"""``limits.device`` and ``limits.num_threads``, applied inside the worker.

LOC-1: ``auto`` picks CUDA, then Apple Metal (mps), then the CPU;
``cuda:1`` names a GPU. A requested device that does not exist here falls
back to the best one that does, with a ``log`` warning. torch is imported
only for trainers that use it, and only inside these functions.
"""

import os
from typing import Any, Callable, List, Optional

from potato_queue.wire.isolated import THREAD_ENV_VARS

__all__ = [
    "apply_thread_env",
    "apply_gpus",
    "gpu_env_note",
    "apply_torch_threads",
    "available_devices",
    "resolve_device",
    "describe_device",
]


LogFn = Callable[[str, str], None]


def apply_gpus(gpus: Optional[str]) -> None:
    """The GPUs the agent gave the run (spec.gpus, nvidia-smi's indexes): what torch will see, set before it
    is imported. nvidia-smi numbers them in PCI bus order, CUDA fastest first unless told."""
    if gpus is not None:
        os.environ.update(CUDA_VISIBLE_DEVICES=gpus, CUDA_DEVICE_ORDER="PCI_BUS_ID")


def gpu_env_note() -> str:
    """` (CUDA_VISIBLE_DEVICES=1, CUDA_DEVICE_ORDER=PCI_BUS_ID)` when they are set, for the worker's first
    line: which GPU a run got is the first question when it is the wrong one."""
    names = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    said = ["%s=%s" % (name, os.environ[name]) for name in names if name in os.environ]
    return " (%s)" % ", ".join(said) if said else ""


def apply_thread_env(num_threads: Optional[int]) -> None:
    """Cap BLAS/OpenMP thread pools; must run before numpy or torch is imported."""
    if num_threads:
        for name in THREAD_ENV_VARS:
            os.environ[name] = str(num_threads)


def apply_torch_threads(num_threads: Optional[int]) -> None:
    """Cap torch's intra-op thread pool (torch must be importable)."""
    if num_threads:
        import torch

        torch.set_num_threads(int(num_threads))


def _mps_available(torch: Any) -> bool:
    backend = getattr(getattr(torch, "backends", None), "mps", None)
    try:
        return bool(backend is not None and backend.is_available())
    except Exception:  # noqa: BLE001 - an odd build is simply "no mps"
        return False


def available_devices(torch: Any) -> List[str]:
    """The devices usable here, best first: ``cuda:N``..., ``mps``, ``cpu``."""
    found: List[str] = []
    try:
        if torch.cuda.is_available():
            found.extend("cuda:%d" % i for i in range(torch.cuda.device_count()))
    except Exception:  # noqa: BLE001 - a broken driver means no CUDA
        pass
    if _mps_available(torch):
        found.append("mps")
    found.append("cpu")
    return found


def _works(torch: Any, device: str) -> Optional[str]:
    """None when a tiny tensor op runs on *device*, else the error text."""
    if device == "cpu":
        return None
    try:
        (torch.ones(2, device=device) * 2).sum().item()
    except Exception as exc:  # noqa: BLE001 - e.g. no kernels for this GPU
        return "%s: %s" % (type(exc).__name__, exc)
    return None


def _normalise(requested: str) -> str:
    name = (requested or "auto").strip().lower()
    return "cuda:0" if name in ("cuda", "gpu") else name


def resolve_device(requested: str, uses_torch: bool, log: LogFn) -> str:
    """The device a run will use for *requested*, logging any fallback."""
    name = _normalise(requested)
    if not uses_torch:
        if name not in ("auto", "cpu"):
            log("info", "This trainer runs on the CPU; device '%s' does not apply" % requested)
        return "cpu"
    import torch

    devices = available_devices(torch)
    if name != "auto" and name not in devices:
        log(
            "warning",
            "Device '%s' is not available on this machine (available: %s); using %s instead"
            % (requested, ", ".join(devices), devices[0]),
        )
        name = "auto"
    choice = devices[0] if name == "auto" else name
    problem = _works(torch, choice)
    if problem is not None:
        log("warning", "Device %s failed a test operation (%s); using cpu instead" % (choice, problem))
        choice = "cpu"
    return choice


def describe_device(device: str) -> str:
    """A readable name: ``cuda:0 (NVIDIA H200)``, ``mps (Apple Metal)``, ``cpu``."""
    if device == "mps":
        return "mps (Apple Metal)"
    if device.startswith("cuda"):
        try:
            import torch

            return "%s (%s)" % (device, torch.cuda.get_device_name(torch.device(device)))
        except Exception:  # noqa: BLE001 - the name is decoration
            return device
    return device


def device_in_words(requested: str = "auto") -> str:
    """The device a local run would use for *requested*, in words (LOC-2): ``CPU``,
    ``CUDA GPU 0 (NVIDIA H200)``, ``Apple Metal (mps)``, and why when it falls back."""
    try:
        import torch
    except ImportError:
        return "CPU (torch is not installed here, so no accelerator can be used)"
    name = _normalise(requested)
    devices = available_devices(torch)
    if name != "auto" and name not in devices:
        fallback = devices[0]
        return "%s (%s is not available here; runs fall back to it)" % (_in_words(torch, fallback), requested)
    return _in_words(torch, devices[0] if name == "auto" else name)


def _in_words(torch: Any, device: str) -> str:
    if device == "mps":
        return "Apple Metal (mps)"
    if device.startswith("cuda"):
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        return "CUDA GPU %d (%s)" % (index, torch.cuda.get_device_name(index))
    return "CPU"
