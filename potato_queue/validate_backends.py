"""The checks of config.py's backend entries that need more than a type: SLURM's folders and times, secrets
in `env`, and local-run keys set where the default backend is remote (validate.py runs them)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from potato_queue.config import LOCAL
from potato_queue.wire.isolated import looks_secret

__all__ = [
    "Warning_",
    "SLURM_ONLY_REFUSED",
    "check_slurm_dir",
    "slurm_time_s",
    "check_slurm_time",
    "check_secret_env",
    "check_local_run_keys",
    "LOCAL_RUN_KEYS",
]

LONG_JOB_S = 6 * 3600
TMP_DIRS = ("/tmp", "/var/tmp")
SLURM_ONLY_REFUSED = {
    "packages": "not accepted on a slurm backend: a virtual environment built on the login node may not "
    "run on the compute nodes; point job_python at an environment the compute nodes have",
    "gpus": "not accepted on a slurm backend: the job's GPUs come from gres (e.g. gres: gpu:1)",
}
# model_training's keys that set up a run on this machine; a remote backend has its own (or its scheduler's).
LOCAL_RUN_KEYS = {
    "device": "a remote run picks its device itself (gpus on ssh, gres on slurm)",
    "num_threads": "set num_threads on the ssh or slurm backend instead",
    "max_ram_mb": "set mem on a slurm backend instead (ssh and agent hosts are not capped)",
}


@dataclass(frozen=True)
class Warning_:
    """A warning and the backend it is about (None when it is about no backend)."""

    text: str
    backend: str | None = None


def check_slurm_dir(path: str, remote_dir: Any, errors: list[str]) -> bool:
    """True when remote_dir is missing (nothing left to type-check)."""
    if not remote_dir:
        errors.append(f"{path}.remote_dir is required for a slurm backend: a folder on storage the compute nodes share")
        return True
    norm = os.path.normpath(str(remote_dir))
    if any(norm == d or norm.startswith(d + "/") for d in TMP_DIRS):
        errors.append(
            f"{path}.remote_dir is {remote_dir}, which is local to each node; "
            "use a folder on storage the login and compute nodes share"
        )
    return False


def slurm_time_s(value: str) -> int | None:
    """Seconds of a SLURM time limit (sbatch --time forms); None if unparsable or unlimited."""
    text = str(value).strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        return None
    days, b, c = (None if g is None else int(g) for g in (m.group(1), m.group(3), m.group(4)))
    a = int(m.group(2))
    if days is not None:  # days-hours[:minutes[:seconds]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if b is not None and c is not None:  # hours:minutes:seconds
        return a * 3600 + b * 60 + c
    if b is not None:  # minutes:seconds
        return a * 60 + b
    return a * 60  # minutes


def check_slurm_time(name: str, time: Any, errors: list[str], warnings: list[Warning_]) -> None:
    if time is None:
        return
    path = f"model_training.backends.{name}.time"
    if str(time).strip().lower() in ("infinite", "unlimited"):
        seconds: int | None = LONG_JOB_S + 1
    else:
        seconds = slurm_time_s(str(time))
    if seconds is None:
        errors.append(
            f"{path} is {time!r}, which sbatch does not read; "
            'write it as "HH:MM:SS", "MM", or "D-HH:MM:SS" (quoted), e.g. "04:00:00"'
        )
    elif seconds > LONG_JOB_S:
        warnings.append(
            Warning_(
                f"{path} is {time}. A job that holds a GPU for more than 6 hours is long on a shared "
                "cluster; check its policy",
                backend=name,
            )
        )


def check_secret_env(name: str, entry: dict[str, Any], warnings: list[Warning_]) -> None:
    """An `env` name that looks like a secret and is not in secret_env: it will not reach the trainer."""
    env, listed = entry.get("env"), entry.get("secret_env") or []
    if not isinstance(env, dict) or not isinstance(listed, list):
        return
    for key in sorted(str(k) for k in env if looks_secret(str(k)) and k not in listed):
        warnings.append(
            Warning_(
                f"model_training.backends.{name}.env.{key} looks like a secret, so it never reaches the trainer "
                f"(nor job.sh); if the trainer needs it, add it to secret_env: [{key}]",
                backend=name,
            )
        )


def check_local_run_keys(model_training: dict[str, Any], warnings: list[Warning_]) -> None:
    """device, num_threads, max_ram_mb set while runs go elsewhere by default: they do not follow them."""
    backend = model_training.get("backend")
    if not backend or backend == LOCAL:
        return
    for key in (k for k in LOCAL_RUN_KEYS if model_training.get(k) is not None):
        warnings.append(
            Warning_(
                f"model_training.{key} applies to local runs only, and the default backend is {backend}: "
                f"it does not reach {backend}'s runs; {LOCAL_RUN_KEYS[key]}"
            )
        )
