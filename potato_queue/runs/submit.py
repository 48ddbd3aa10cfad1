"""Submitting runs: the one place the API, the CLI and the beat go through to queue a run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import Unpack

from potato_queue.bounds import MAX_PARAMS_BYTES, clean, json_size, too_deep
from potato_queue.config import LOCAL, ProjectConfig
from potato_queue.errors import Conflict, Invalid
from potato_queue.run import RunMarks, RunRecord
from potato_queue.runs.budget import budget_checked
from potato_queue.runs.kinds import refuse_foreign_kinds, refuse_foreign_modality
from potato_queue.store import RunStore

__all__ = ["trainer_table", "choose_backend", "start_run", "start_again"]


def trainer_table() -> dict[str, dict[str, Any]]:
    from potato_queue.trainers import trainer_info, trainer_names

    table = {}
    for name in trainer_names():
        info = trainer_info(name)
        assert info is not None, name  # trainer_names() lists the registry's own
        table[name] = info.to_dict()
    return table


def choose_backend(config: ProjectConfig, trainer: str, schemas: list[str], backend: str | None) -> str:
    """The backend the run goes to (API-2), or Conflict / Invalid saying what is valid."""
    mt = config.model_training
    chosen = backend or mt.default_backend
    unknown = config.unknown_backend(chosen)
    if unknown is not None:
        raise Conflict(unknown[0], fix=unknown[1])
    trainers = trainer_table()
    if trainer not in trainers:
        raise Invalid(f"Unknown trainer {trainer!r}; trainers: {', '.join(sorted(trainers))}")
    strangers = [s for s in schemas if s not in config.schema_names()]
    if strangers or not schemas:
        what = f"Unknown schema {strangers[0]!r}" if strangers else "No schema given"
        raise Invalid(f"{what}; schemas: {', '.join(config.schema_names())}")
    refuse_foreign_kinds(config, trainer, schemas)
    refuse_foreign_modality(config, trainer, schemas)
    if trainers[trainer]["local_only"] and chosen != LOCAL:
        raise Invalid(
            f"{trainer} runs only on the local backend (it reads the previous run's files on this server); "
            f"start it with backend 'local', not {chosen!r}"
        )
    return chosen


def check_params(params: dict[str, Any]) -> dict[str, Any]:
    """A trainer's params as they will be stored and served back, or Invalid naming the limit."""
    problem = too_deep(params, "params")
    if problem is None and json_size(params) > MAX_PARAMS_BYTES:
        problem = f"params are {json_size(params)} bytes as JSON; at most {MAX_PARAMS_BYTES} are accepted"
    if problem is not None:
        raise Invalid(problem, fix="pass the trainer's settings, not data (the data comes from the project)")
    cleaned: dict[str, Any] = clean(params)
    return cleaned


def start_run(
    config: ProjectConfig,
    store: RunStore,
    enqueue: Callable[[str], None],
    *,
    trainer: str,
    schemas: list[str],
    backend: str | None = None,
    params: dict[str, Any] | None = None,
    **marks: Unpack[RunMarks],
) -> RunRecord:
    """Check the request, write the queued run, wake an executor (`marks`: where the run came from, run.py)."""
    if not config.model_training.enabled:
        raise Conflict(
            f"Training is off for this project: model_training.enabled is false in {config.config_path}",
            fix="set model_training.enabled: true there, then restart potato-queue's server and executors",
        )
    chosen = choose_backend(config, trainer, schemas, backend)
    params = check_params(params or {})
    with budget_checked(config, store, trainer, chosen):
        record = store.create(trainer=trainer, schemas=schemas, backend=chosen, params=params, **marks)
    enqueue(record["run_id"])
    return record


def start_again(
    config: ProjectConfig,
    store: RunStore,
    enqueue: Callable[[str], None],
    old: RunRecord,
    *,
    backend: str | None = None,
    **marks: Unpack[RunMarks],
) -> RunRecord:
    """A new run of `old`'s trainer, schemas and params, on `backend` (by default `old`'s): a retry's, a re-run's."""
    return start_run(
        config,
        store,
        enqueue,
        trainer=old["trainer"],
        schemas=list(old["schemas"]),
        backend=backend or old["backend"],
        params=dict(old.get("params") or {}),
        **marks,
    )
