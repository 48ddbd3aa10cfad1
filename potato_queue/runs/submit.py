"""Submitting runs: the one place the API, the CLI and the beat go through to queue a run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from potato_queue.bounds import MAX_PARAMS_BYTES, clean, json_size, too_deep
from potato_queue.config import LOCAL, ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.executors import unavailable_reason
from potato_queue.store import RunStore

__all__ = ["RunRefused", "trainer_table", "choose_backend", "start_run"]


class RunRefused(PotatoQueueError):
    """A run request that cannot be queued; `status` is the HTTP code the API answers with."""

    def __init__(self, message: str, *, status: int, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.status = status


def trainer_table() -> dict[str, dict[str, Any]]:
    from potato_queue.trainers import trainer_info, trainer_names

    return {name: trainer_info(name).to_dict() for name in trainer_names()}


def choose_backend(config: ProjectConfig, trainer: str, schemas: list[str], backend: str | None) -> str:
    """The backend the run goes to (API-2), or RunRefused saying what is valid (409/400)."""
    mt = config.model_training
    chosen = backend or mt.default_backend
    unknown = config.unknown_backend(chosen)
    if unknown is not None:
        raise RunRefused(unknown[0], status=409, fix=unknown[1])
    trainers = trainer_table()
    if trainer not in trainers:
        raise RunRefused(f"Unknown trainer {trainer!r}; trainers: {', '.join(sorted(trainers))}", status=400)
    unknown = [s for s in schemas if s not in config.schema_names()]
    if unknown or not schemas:
        what = f"Unknown schema {unknown[0]!r}" if unknown else "No schema given"
        raise RunRefused(f"{what}; schemas: {', '.join(config.schema_names())}", status=400)
    if trainers[trainer]["local_only"] and chosen != LOCAL:
        raise RunRefused(
            f"{trainer} runs only on the local backend (it reads the previous run's files on this server); "
            f"start it with backend 'local', not {chosen!r}", status=400)
    not_runnable = unavailable_reason(config, chosen)
    if not_runnable is not None:
        # Refused now, not queued to fail later with "the executor stopped".
        raise RunRefused(not_runnable, status=400, fix="start the run on another backend, or upgrade potato-queue")
    return chosen


def check_params(params: dict[str, Any]) -> dict[str, Any]:
    """A trainer's params as they will be stored and served back, or RunRefused (400) naming the limit."""
    problem = too_deep(params, "params")
    if problem is None and json_size(params) > MAX_PARAMS_BYTES:
        problem = f"params are {json_size(params)} bytes as JSON; at most {MAX_PARAMS_BYTES} are accepted"
    if problem is not None:
        raise RunRefused(problem, status=400, fix="pass the trainer's settings, not data (the data comes from the project)")
    return clean(params)


def start_run(config: ProjectConfig, store: RunStore, enqueue: Callable[[str], None], *, trainer: str,
              schemas: list[str], backend: str | None = None, params: dict[str, Any] | None = None,
              trigger: str = "api", potato_run_id: str | None = None) -> dict[str, Any]:
    """Check the request, write the queued run, wake an executor (`potato_run_id`: the Potato run it trains
    for, which Potato records itself)."""
    if not config.model_training.enabled:
        raise RunRefused(f"Training is off for this project: model_training.enabled is false in {config.config_path}",
                         status=409, fix="set model_training.enabled: true there, then restart potato-queue's "
                                         "server and executors")
    chosen = choose_backend(config, trainer, schemas, backend)
    params = check_params(params or {})
    record = store.create(trainer=trainer, schemas=schemas, backend=chosen, params=params, trigger=trigger,
                          potato_run_id=potato_run_id)
    enqueue(record["run_id"])
    return record
