"""The backends' config models: `model_training.backends`' entries, one model a backend type (and `local`'s).

config.py builds them into ProjectConfig and names them again; an executor is built with its own
(executors/base.Executor[SshBackend] and so on).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from potato_queue.wire.sbatch import (
    DEFAULT_JOB_PYTHON,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_PREEMPT_SIGNAL_S,
)
from potato_queue.wire.sbatch import SBATCH_FLAGS as AGENT_SBATCH_FLAGS

__all__ = [
    "Strict",
    "DEFAULT_SETUP_TIMEOUT_S",
    "DEFAULT_QUEUE_TIMEOUT_S",
    "DEFAULT_PENDING_TIMEOUT_S",
    "DEFAULT_RAY_PENDING_TIMEOUT_S",
    "SBATCH_FLAGS",
    "LocalBackend",
    "SshBackend",
    "SlurmBackend",
    "AgentBackend",
    "RayBackend",
    "Backend",
    "AnyBackend",
    "BACKEND_MODELS",
]


class Strict(BaseModel):
    """Every config model: unknown keys are caught (with a suggestion) by validate.py before the models see the
    data; forbid here is the backstop for direct callers."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# Backend key -> sbatch long option (CFG-4): the agent's table (it maps slurm.json too); the config
# accepts exactly these keys on a slurm backend and hands the agent their values as data.
SBATCH_FLAGS: dict[str, str] = AGENT_SBATCH_FLAGS


# The bounds of the waits that are not run time (docs/decisions.md, "Every phase has a bound"): finite by
# default, so that no run holds the run slot forever; an admin raises them per backend.
DEFAULT_SETUP_TIMEOUT_S = 1800.0  # ssh setup: connect, code copy, a first venv build, the GPU pick
DEFAULT_QUEUE_TIMEOUT_S = 86400.0  # an agent backend's run waiting for a claim
DEFAULT_PENDING_TIMEOUT_S = 86400.0  # a SLURM job waiting in the scheduler's queue


class LocalBackend(Strict):
    """The `local` backend: this machine. It has no entry under `backends`; its
    settings are model_training's local-run keys (CFG-1), gathered here so that
    every backend, local included, reaches its executor as one config model."""

    type: Literal["local"] = "local"
    description: str | None = None
    device: str = "auto"
    num_threads: int | None = Field(None, ge=1)
    max_ram_mb: float | None = Field(None, gt=0)
    heartbeat_timeout_s: float = Field(120, gt=0)


_GPUS = re.compile(r"^(auto|none|\d+(,\d+)*)$")


class _RemoteBackend(Strict):
    """Keys every backend reached by ssh accepts (CFG-3, CFG-4)."""

    description: str | None = None
    host: str
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    python: str = "python3"
    num_threads: int | None = Field(None, ge=1)
    env: dict[str, str] = Field(default_factory=dict)
    # Names that look like secrets (HF_TOKEN) pass to the trainer only when listed here (wire/isolated.py).
    secret_env: list[str] = Field(default_factory=list)
    max_artifact_mb: float = Field(2048, gt=0)
    fetch_artifacts: bool = True
    keep_remote: bool = False
    heartbeat_timeout_s: float = Field(120, gt=0)
    setup_timeout_s: float = Field(DEFAULT_SETUP_TIMEOUT_S, gt=0)

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_are_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value


class SshBackend(_RemoteBackend):
    type: Literal["ssh"] = "ssh"
    packages: list[str] = Field(default_factory=list)
    remote_dir: str = "~/.cache/potato-training"
    gpus: str = "auto"
    min_free_gpu_mb: float = Field(2000, ge=0)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus_form(cls, value: Any) -> Any:
        text = str(value).replace(" ", "") if isinstance(value, (int, str)) else value
        if not isinstance(text, str) or not _GPUS.fullmatch(text):
            raise ValueError(f'must be auto, none, a GPU index like "1" or a list like "0,1" (got {value!r})')
        return text


def _slurm_settings() -> dict[str, Any]:
    """One optional text field per sbatch setting of SBATCH_FLAGS."""
    return {key: (str | None, None) for key in SBATCH_FLAGS}


class _SlurmCore(_RemoteBackend):
    type: Literal["slurm"] = "slurm"
    remote_dir: str
    job_python: str = DEFAULT_JOB_PYTHON
    prelude: list[str] = Field(default_factory=list)
    poll_interval_s: float = Field(DEFAULT_POLL_INTERVAL_S, gt=0)
    # SLURM requeues a job whose node failed; a run's job is not requeued unless asked (its files are half-written).
    requeue: bool = False
    # With requeue: the job is signalled (USR1) this long before its time limit, checkpoints and requeues itself.
    preempt_signal_s: int = Field(DEFAULT_PREEMPT_SIGNAL_S, ge=1)
    pending_timeout_s: float = Field(DEFAULT_PENDING_TIMEOUT_S, gt=0)

    @field_validator(*SBATCH_FLAGS, mode="before", check_fields=False)
    @classmethod
    def _sbatch_values_are_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    def sbatch_setting(self, key: str) -> str | None:
        """One of SBATCH_FLAGS' settings (partition, gres, time, ...), None when not set."""
        value = getattr(self, key, None)
        return None if value is None else str(value)

    def job_settings(self) -> dict[str, Any]:
        """What the agent on the login node needs to submit the job: slurm.json's object (wire/sbatch.py)."""
        sbatch = {key: getattr(self, key, None) for key in SBATCH_FLAGS}
        return {
            "job_python": self.job_python,
            "prelude": self.prelude,
            "poll_interval_s": self.poll_interval_s,
            "requeue": self.requeue,
            "preempt_signal_s": self.preempt_signal_s,
            "env": self.env,
            "secret_env": self.secret_env,
            "num_threads": self.num_threads,
            **{key: str(value) for key, value in sbatch.items() if value is not None and value != ""},
        }


def _make_slurm_model() -> type[_SlurmCore]:
    from pydantic import create_model

    return create_model("SlurmBackend", __base__=_SlurmCore, **_slurm_settings())


if TYPE_CHECKING:  # the sbatch keys are made from SBATCH_FLAGS at import; read them with sbatch_setting()
    SlurmBackend = _SlurmCore
else:
    SlurmBackend = _make_slurm_model()


class AgentBackend(Strict):
    type: Literal["agent"] = "agent"
    description: str | None = None
    heartbeat_timeout_s: float = Field(120, gt=0)
    queue_timeout_s: float = Field(DEFAULT_QUEUE_TIMEOUT_S, gt=0)
    # An agent that submits its worker to SLURM (--slurm) reports the job pending: bounded here too.
    pending_timeout_s: float = Field(DEFAULT_PENDING_TIMEOUT_S, gt=0)


# A Ray job's PENDING has no end of its own: a run waits this long for Ray to place it (docs/backends/ray.md).
DEFAULT_RAY_PENDING_TIMEOUT_S = 600.0


class RayBackend(Strict):
    """A Ray cluster (or KubeRay's head service) through its Jobs API: each run one Ray job."""

    type: Literal["ray"] = "ray"
    description: str | None = None
    address: str = Field(
        pattern=r"^https?://[A-Za-z0-9._\-]+(:\d{1,5})?/?$", description="the Jobs API: http://head:8265"
    )
    # What the nodes dial to reach this server (they fetch the agent and the bundle from it); by default the
    # address the server is bound to, which only a node on this machine reaches.
    server_url: str | None = Field(None, pattern=r"^https?://[^\s]+$")
    num_gpus: float = Field(1, ge=0)
    num_cpus: float = Field(1, ge=0)
    memory_mb: float | None = Field(None, gt=0)
    resources: dict[str, float] = Field(default_factory=dict)
    python: str = "python3"
    workdir: str = "~/.cache/potato-queue/ray"
    # The name of the server's environment variable that holds the cluster's auth token (never the token).
    token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    pending_timeout_s: float = Field(DEFAULT_RAY_PENDING_TIMEOUT_S, gt=0)
    # A run whose node died is submitted again this many times at most (0: it fails); it resumes from its
    # checkpoint when the trainer checkpoints and workdir is storage the nodes share.
    max_requeues: int = Field(3, ge=0)
    poll_interval_s: float = Field(1.0, gt=0)
    heartbeat_timeout_s: float = Field(120, gt=0)
    # The model files come back to the server over HTTP, each up to max_artifact_mb (bigger ones stay on the node).
    fetch_artifacts: bool = True
    max_artifact_mb: float = Field(2048, gt=0)

    @property
    def head(self) -> str:
        """host:port of the Jobs API, for labels and messages."""
        return self.address.split("://", 1)[1].rstrip("/")


Backend = Annotated[SshBackend | SlurmBackend | AgentBackend | RayBackend, Field(discriminator="type")]
AnyBackend = LocalBackend | SshBackend | SlurmBackend | AgentBackend | RayBackend
BACKEND_MODELS: dict[str, type[BaseModel]] = {
    "ssh": SshBackend,
    "slurm": SlurmBackend,
    "agent": AgentBackend,
    "ray": RayBackend,
}
