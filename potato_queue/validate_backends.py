"""What the config's keys may be beyond the models' types: the key-level half of validate.py's checks.

Unknown keys in model_training, its sections and each backend entry (with the nearest valid key), the entries
a type cannot judge (SLURM's folders and times, `env` names that look like secrets, a guessable admin key,
local-run keys set where the default backend is remote): each read from the raw mapping, so that one pass
reports every problem. Apart from validate.py because this is config.py's models seen key by key; validate.py
ties it to the cross references, the acknowledgements and load_checked.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from potato_queue.config import (
    BACKEND_MODELS,
    LOCAL,
    AutoRetrainConfig,
    BudgetConfig,
    GpuWatchConfig,
    MachineAnnotatorConfig,
    ModelTrainingConfig,
    WritebackConfig,
)
from potato_queue.wire.isolated import looks_secret

__all__ = [
    "Warning_",
    "SLURM_ONLY_REFUSED",
    "LOCAL_RUN_KEYS",
    "PLACEHOLDER_KEYS",
    "MIN_ADMIN_KEY_CHARS",
    "as_mapping",
    "unknown_keys",
    "check_sections",
    "check_slurm_dir",
    "slurm_time_s",
    "check_slurm_time",
    "check_secret_env",
    "check_local_run_keys",
    "is_weak_admin_key",
    "check_admin_key",
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


# The tutorial's example key: anyone who read it knows it.
PLACEHOLDER_KEYS = frozenset({"change-me", "changeme", "change_me", "secret", "admin"})
MIN_ADMIN_KEY_CHARS = 12


def is_weak_admin_key(key: Any) -> bool:
    """A key anyone can guess: the tutorial's placeholder, or shorter than MIN_ADMIN_KEY_CHARS (processes/startup.py
    refuses one on a reachable address)."""
    return isinstance(key, str) and (key.strip().lower() in PLACEHOLDER_KEYS or len(key.strip()) < MIN_ADMIN_KEY_CHARS)


def check_admin_key(key: Any, warnings: list[Warning_]) -> None:
    """admin_api_key set to a key anyone can guess."""
    if key is not None and is_weak_admin_key(key):
        warnings.append(
            Warning_(
                f"admin_api_key is {key!r}, a placeholder or shorter than {MIN_ADMIN_KEY_CHARS} characters, which "
                "anyone can guess; set a real key (e.g. the output of: python -c 'import secrets; "
                "print(secrets.token_urlsafe(24))'), or leave it out and set POTATO_ADMIN_API_KEY"
            )
        )


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; valid keys: {', '.join(sorted(valid))}"


def _model_keys(model: type[BaseModel]) -> list[str]:
    return [name for name in model.model_fields if name != "config_path"]


def unknown_keys(section: dict[str, Any], valid: list[str], path: str, what: str) -> list[str]:
    """One error per key of `section` that is not in `valid`, each with the nearest valid key (or all of them)."""
    return [f"{path}.{key}: unknown key {what}{_suggest(str(key), valid)}" for key in section if key not in valid]


def as_mapping(value: Any, path: str, errors: list[str]) -> dict[str, Any] | None:
    """The section at `path` as a mapping; None when it is absent, or no mapping (an error says so)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        errors.append(f"{path} must be a mapping of keys, not {type(value).__name__} ({value!r})")
        return None
    return value


def _check_backend(name: str, raw: Any, errors: list[str], warnings: list[Warning_]) -> dict[str, Any] | None:
    """Key-level checks of one backend entry; the entry to type-check, or None."""
    path = f"model_training.backends.{name}"
    if name == LOCAL:
        errors.append(f"{path}: 'local' is built in and needs no entry; give this backend another name")
        return None
    entry = as_mapping(raw, path, errors)
    if entry is None:
        if raw is None:
            errors.append(f"{path} is empty; give it at least `type: ssh`, `type: slurm` or `type: agent`")
        return None
    kind = entry.get("type")
    if kind not in BACKEND_MODELS:
        got = "missing" if kind is None else f"{kind!r}"
        hint = _suggest(str(kind), list(BACKEND_MODELS)) if kind is not None else ""
        errors.append(f"{path}.type is {got}; it must be ssh, slurm or agent (local needs no entry){hint}")
        return None
    valid = _model_keys(BACKEND_MODELS[kind])
    structural = False
    for key in entry:
        if kind == "slurm" and key in SLURM_ONLY_REFUSED:
            errors.append(f"{path}.{key}: {SLURM_ONLY_REFUSED[key]}")
        elif key not in valid:
            errors.append(f"{path}.{key}: unknown key for a {kind} backend{_suggest(str(key), valid)}")
    if kind in ("ssh", "slurm") and not entry.get("host"):
        errors.append(f"{path}.host is required for a {kind} backend (any name `ssh <host> true` accepts)")
        structural = True
    if kind == "slurm":
        structural |= check_slurm_dir(path, entry.get("remote_dir"), errors)
        check_slurm_time(name, entry.get("time"), errors, warnings)
    check_secret_env(name, entry, warnings)
    # Unknown keys are reported above; the rest is still type-checked so one
    # pass shows every problem. Without host/remote_dir there is nothing to check.
    return None if structural else {k: v for k, v in entry.items() if k in valid}


def check_sections(data: dict[str, Any], errors: list[str], warnings: list[Warning_]) -> dict[str, Any]:
    """Unknown keys in the sections potato-queue owns; the mapping to type-check.

    Potato's own top-level keys are many and not ours to police, so only
    `model_training` (and its sections) and `validation` are checked key by key.
    """
    clean = dict(data)
    mt = as_mapping(data.get("model_training"), "model_training", errors)
    if mt is None:
        clean.pop("model_training", None)
        return clean
    mt = dict(mt)
    errors.extend(unknown_keys(mt, _model_keys(ModelTrainingConfig), "model_training", "in model_training"))
    sections = (
        ("writeback", WritebackConfig),
        ("auto_retrain", AutoRetrainConfig),
        ("machine_annotator", MachineAnnotatorConfig),
        ("gpu_watch", GpuWatchConfig),
        ("budget", BudgetConfig),
    )
    for name, model in sections:
        sub = as_mapping(mt.get(name), f"model_training.{name}", errors)
        if sub is not None:
            errors.extend(unknown_keys(sub, _model_keys(model), f"model_training.{name}", f"in {name}"))
    check_local_run_keys(mt, warnings)
    backends = as_mapping(mt.get("backends"), "model_training.backends", errors) or {}
    checked = {}
    for name, raw in backends.items():
        entry = _check_backend(str(name), raw, errors, warnings)
        if entry is not None:
            checked[str(name)] = entry
    mt["backends"] = checked
    clean["model_training"] = {k: v for k, v in mt.items() if k in ModelTrainingConfig.model_fields}
    return clean
