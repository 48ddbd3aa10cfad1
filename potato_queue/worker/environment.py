"""What made a run, as the worker saw it: the half of a run's reproducibility record only its host can tell.

Standard library only (Python 3.8+): this runs on bare hosts. Sent with the result event (`environment`), so
every backend reports the same fields; the server adds what it knows (runs/reproducibility.py). Nothing here
imports torch: its facts (CUDA, the GPUs) are read only when the trainer imported it already.
"""

import hashlib
import os
import platform
import shutil
import socket
import subprocess
import sys
from typing import Any, Dict, List, Optional

__all__ = ["PACKAGES", "environment", "code_sha256", "UNPACKED_FROM"]

# Beside the package in a folder unpacked from the agent's archive (host/ray_entry.py writes it): the archive's
# sha256, checked when it was unpacked, which names the code as the archive would.
UNPACKED_FROM = "unpacked-from.sha256"

# The packages whose versions decide what a trainer computes: package -> its module.
PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "peft": "peft",
    "accelerate": "accelerate",
    "bitsandbytes": "bitsandbytes",
    "scikit-learn": "sklearn",
    "numpy": "numpy",
    "tokenizers": "tokenizers",
}
NVIDIA_SMI_TIMEOUT_S = 10


def _versions() -> Dict[str, str]:
    """The versions of the packages this run imported (the ones that computed it), read from the modules
    themselves: nothing is imported or scanned here (importlib.metadata would cost tens of ms a run)."""
    found = {}
    for package, module in PACKAGES.items():
        version = getattr(sys.modules.get(module), "__version__", None)
        if isinstance(version, str):
            found[package] = version
    return found


def code_sha256() -> str:
    """sha256 of the potato-queue code this process runs: the archive it was started from (a host's agent.pyz),
    or unpacked from (a ray node's, which names it in UNPACKED_FROM), or every .py file of the package (name and
    bytes, in sorted order)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../potato_queue
    archive = os.path.dirname(root)
    unpacked_from = os.path.join(archive, UNPACKED_FROM)
    if os.path.isfile(unpacked_from):
        with open(unpacked_from, encoding="ascii") as fh:
            return fh.read().strip()
    digest = hashlib.sha256()
    if os.path.isfile(archive):  # inside a zipapp: the archive is the code
        with open(archive, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as fh:
                digest.update(fh.read())
    return digest.hexdigest()


def _driver() -> Optional[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def _torch_facts() -> Dict[str, Any]:
    """CUDA and the GPUs as torch saw them, when the trainer imported torch (never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"cuda": None, "gpus": []}
    gpus: List[str] = []
    try:
        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - a broken driver: no GPU seen, said as none
        gpus = []
    return {"cuda": getattr(torch.version, "cuda", None), "gpus": gpus}


def environment() -> Dict[str, Any]:
    """The worker's side of the record: host, Python, package versions, code, CUDA, driver, GPUs."""
    facts = _torch_facts()
    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        # Not platform.platform(): on Linux it reads the interpreter's binary for its libc (tens of ms).
        "platform": "-".join((platform.system(), platform.release(), platform.machine())),
        "packages": _versions(),
        "code_sha256": code_sha256(),
        "cuda": facts["cuda"],
        "driver": _driver() if facts["gpus"] else None,
        "gpus": facts["gpus"],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
