"""The plug-in boundary: one module per backend type (local, ssh, slurm, agent, ray).

Each module implements the contract of executors.base and imports no other
executor, nor Celery, FastAPI or torch. This registry is the one table of
them: the executor process, `training check` and the page's Check button
all get their executors here. Modules are imported only when a backend of
their type is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from potato_queue.errors import PotatoQueueError

if TYPE_CHECKING:  # pragma: no cover
    from potato_queue.config import ProjectConfig
    from potato_queue.executors.base import Executor

__all__ = ["RUNNABLE", "NotRunnable", "build_executor", "Executors"]

# Backend type -> "module:Class": every type the config takes (config.py's backend models) runs.
RUNNABLE: dict[str, str] = {
    "local": "potato_queue.executors.local:LocalExecutor",
    "ssh": "potato_queue.executors.ssh:SshExecutor",
    "slurm": "potato_queue.executors.slurm:SlurmExecutor",
    "agent": "potato_queue.executors.agent:AgentExecutor",
    "ray": "potato_queue.executors.ray:RayExecutor",
}


class NotRunnable(PotatoQueueError):
    """A backend this executor's config does not have (the config changed after it started)."""


def _backend(config: ProjectConfig, backend_name: str) -> Any:
    try:
        return config.model_training.backend_config(backend_name)
    except KeyError:
        raise NotRunnable(
            f"This executor runs {config.config_path} as it was when the executor started, and that has no "
            f"backend {backend_name!r} (configured: {', '.join(config.model_training.backend_names())})",
            fix="the config was changed after the executors started: restart them (potato-queue executor CONFIG)",
        ) from None


def build_executor(config: ProjectConfig, backend_name: str) -> Executor:
    """A new executor for the named backend, built with its config model."""
    backend = _backend(config, backend_name)
    module, _, cls = RUNNABLE[backend.type].partition(":")
    return getattr(importlib.import_module(module), cls)(backend_name, backend, config.settings)


class Executors:
    """One executor per backend name, kept for the life of the process (a warm agent, a connection)."""

    def __init__(self, config: ProjectConfig) -> None:
        self.config = config
        self._built: dict[str, Executor] = {}

    def get(self, backend_name: str) -> Executor:
        if backend_name not in self._built:
            self._built[backend_name] = build_executor(self.config, backend_name)
        return self._built[backend_name]

    def close(self) -> None:
        for executor in self._built.values():
            executor.close()
        self._built.clear()
