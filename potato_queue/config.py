"""The project config: a Potato config.yaml with a `model_training` section.

Typed models for everything potato-queue reads (CFG-1..5 in docs/requirements.md), with every
default in one place. `build_config` turns a checked mapping into a `ProjectConfig` with its paths
resolved the way Potato resolves them. Reading the file (`validate.read_yaml`, YAML 1.2) and checking
it (unknown keys, cross references) live in validate.py; entry points call `validate.load_checked`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from potato_queue.backends.models import (
    BACKEND_MODELS,
    DEFAULT_PENDING_TIMEOUT_S,
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_RAY_PENDING_TIMEOUT_S,
    DEFAULT_SETUP_TIMEOUT_S,
    SBATCH_FLAGS,
    AgentBackend,
    AnyBackend,
    Backend,
    LocalBackend,
    RayBackend,
    SlurmBackend,
    SshBackend,
    Strict,
)
from potato_queue.schemes import with_rows
from potato_queue.settings import DEFAULT_SETTINGS, Settings

__all__ = [
    "LOCAL",
    "DEFAULT_SETUP_TIMEOUT_S",
    "DEFAULT_QUEUE_TIMEOUT_S",
    "DEFAULT_PENDING_TIMEOUT_S",
    "WritebackConfig",
    "AutoRetrainConfig",
    "MachineAnnotatorConfig",
    "GpuWatchConfig",
    "BudgetCaps",
    "BudgetConfig",
    "SBATCH_FLAGS",
    "LocalBackend",
    "SshBackend",
    "RayBackend",
    "DEFAULT_RAY_PENDING_TIMEOUT_S",
    "SlurmBackend",
    "AgentBackend",
    "Backend",
    "AnyBackend",
    "BACKEND_MODELS",
    "ModelTrainingConfig",
    "ProjectConfig",
    "data_file_paths",
    "build_config",
]

LOCAL = "local"


class WritebackConfig(Strict):
    schemas: list[str] = Field(default_factory=list)
    include_unlabeled: bool = False
    min_confidence: float = Field(0.0, ge=0.0, le=1.0)
    field: str = "predictions"


class MachineAnnotatorConfig(Strict):
    # A succeeded run's held-out predictions become a declared machine rater in Potato (runs/rater.py).
    enabled: bool = False


class GpuWatchConfig(Strict):
    # What the agent does with a run's GPUs (agent/gpu_watch.py): sample them (GPU-hours, energy), stop a run
    # whose GPUs idle past idle_stop_s (off while None), kill what of the run still holds GPU memory at its end.
    sample_s: float = Field(10.0, gt=0, le=3600)
    idle_utilization_pct: float = Field(5.0, ge=0, le=100)
    idle_stop_s: float | None = Field(None, gt=0)
    leak_guard: bool = True


class BudgetCaps(Strict):
    # Per calendar month (UTC): a run that would pass a cap is refused before it starts (runs/budget.py).
    # Finite: `1e400` (infinity) would show "inf left" and cap nothing.
    gpu_hours_per_month: float | None = Field(None, gt=0, allow_inf_nan=False)
    kwh_per_month: float | None = Field(None, gt=0, allow_inf_nan=False)

    @field_validator("gpu_hours_per_month", "kwh_per_month", mode="before")
    @classmethod
    def _no_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # YAML's `true` would be a cap of 1
            raise ValueError("a cap is a number of GPU-hours or kWh, not true or false")
        return value


class BudgetConfig(BudgetCaps):
    # The caps above are the project's (every backend's runs together); these, one backend's runs only.
    backends: dict[str, BudgetCaps] = Field(default_factory=dict)


class AutoRetrainConfig(Strict):
    enabled: bool = False
    trainer: str | None = None
    schemas: list[str] = Field(default_factory=list)
    min_interval_s: float = Field(600.0, ge=0)
    update_frequency: int = Field(25, ge=1)
    params: dict[str, Any] = Field(default_factory=dict)
    backend: str | None = None


class ModelTrainingConfig(Strict):
    enabled: bool = False
    backend: str | None = None
    max_wall_seconds: float | None = Field(None, gt=0)
    grace_seconds: float = Field(20, ge=0)
    writeback: WritebackConfig = Field(default_factory=WritebackConfig)
    auto_retrain: AutoRetrainConfig = Field(default_factory=AutoRetrainConfig)
    machine_annotator: MachineAnnotatorConfig = Field(default_factory=MachineAnnotatorConfig)
    gpu_watch: GpuWatchConfig = Field(default_factory=GpuWatchConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    device: str = "auto"
    num_threads: int | None = Field(None, ge=1)
    max_ram_mb: float | None = Field(None, gt=0)
    max_predictions_mb: float = Field(512, gt=0)
    # Local runs: how long the local agent may stay silent before the run fails.
    heartbeat_timeout_s: float = Field(120, gt=0)
    retain_runs: int = Field(5, ge=0)
    # A finished run's whole folder, past this many days, unless something cites it (runs/record_retention.py).
    retain_run_records_days: int | None = Field(365, ge=1)
    split_seed: int = 0
    splits: dict[str, float] = Field(default_factory=lambda: {"train": 0.7, "val": 0.15, "test": 0.15})
    aggregation: str = "consensus"
    backends: dict[str, Backend] = Field(default_factory=dict)

    @property
    def default_backend(self) -> str:
        return self.backend or LOCAL

    @property
    def retrain_backend(self) -> str:
        return self.auto_retrain.backend or self.default_backend

    def backend_names(self) -> list[str]:
        return [LOCAL, *self.backends]

    def backend_config(self, name: str) -> AnyBackend:
        """The named backend's config model; `local` is built from the local-run keys. KeyError if none."""
        if name == LOCAL:
            return LocalBackend(
                device=self.device,
                num_threads=self.num_threads,
                max_ram_mb=self.max_ram_mb,
                heartbeat_timeout_s=self.heartbeat_timeout_s,
            )
        return self.backends[name]

    def heartbeat_timeout_s_of(self, name: str) -> float:
        """How long the named backend's agent may stay silent (the backend's own, else the local one)."""
        try:
            return float(self.backend_config(name).heartbeat_timeout_s)
        except KeyError:
            return float(self.heartbeat_timeout_s)


class ItemProperties(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    id_key: str = "id"
    text_key: str = "text"


class ProjectConfig(BaseModel):
    """The parts of a Potato config potato-queue uses; Potato's other keys pass through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    annotation_task_name: str | None = None
    task_dir: str = "."
    data_files: list[Any] = Field(default_factory=list)
    item_properties: ItemProperties = Field(default_factory=ItemProperties)
    output_annotation_dir: str = "annotation_output"
    admin_api_key: str | None = None
    annotation_schemes: list[dict[str, Any]] = Field(default_factory=list)
    model_training: ModelTrainingConfig = Field(default_factory=ModelTrainingConfig)

    # Resolved by build_config, not read from the file.
    config_path: Path = Path("config.yaml")
    # The process's settings (its environment, read at its edge): not the file's, so not a field.
    _settings: Settings = PrivateAttr(default=DEFAULT_SETTINGS)

    @property
    def settings(self) -> Settings:
        return self._settings

    def with_settings(self, settings: Settings) -> ProjectConfig:
        """This config as a process with `settings` sees it."""
        copy = self.model_copy()
        copy._settings = settings
        return copy

    @property
    def task_path(self) -> Path:
        """task_dir, relative to the config file's folder (as Potato resolves it)."""
        return (self.config_path.parent / os.path.expanduser(self.task_dir)).resolve()

    @property
    def output_path(self) -> Path:
        """output_annotation_dir, relative to task_dir."""
        return (self.task_path / os.path.expanduser(self.output_annotation_dir)).resolve()

    def data_paths(self) -> list[Path]:
        return [self.task_path / os.path.expanduser(p) for p in data_file_paths(self.data_files)]

    def schema_names(self) -> list[str]:
        return [str(s.get("name")) for s in self.annotation_schemes if s.get("name") is not None]

    def unknown_backend(self, name: str) -> tuple[str, str] | None:
        """(what is wrong, the fix) when `name` is no backend of this project; None when it is one. The one
        wording for the API, the page, `training run/check/register`."""
        names = self.model_training.backend_names()
        if name in names:
            return None
        return (
            f"Backend {name!r} is not configured; configured backends: {', '.join(names)}",
            f"name one of those, or add {name!r} under model_training.backends in {self.config_path}",
        )


def data_file_paths(data_files: Any) -> list[str]:
    """Potato accepts a path, a list of paths, or `{path: ...}` entries."""
    entries = data_files if isinstance(data_files, list) else [data_files]
    paths = []
    for entry in entries:
        if isinstance(entry, dict):
            entry = entry.get("path")
        if isinstance(entry, str) and entry:
            paths.append(entry)
    return paths


def build_config(data: dict[str, Any], config_path: str | os.PathLike[str]) -> ProjectConfig:
    """The typed config of an already-checked mapping (pydantic errors otherwise)."""
    known = {k: v for k, v in data.items() if k != "validation"}
    if isinstance(known.get("annotation_schemes"), list):  # a multirate's rows are schemes a run trains
        known["annotation_schemes"] = with_rows(known["annotation_schemes"])
    return ProjectConfig.model_validate({**known, "config_path": Path(config_path).resolve()})
