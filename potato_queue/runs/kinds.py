"""Which trainer takes which of a project's schemes: a trainer runs only on the schema kinds it declares.

The kind of a scheme is Potato's (bundle.read.schema_kind: a multiselect is `multilabel`, a likert
`ordinal`, a slider `continuous`, ...); a trainer's kinds are its registry entry's. A run that asks a
trainer for a kind it does not declare is refused before it is queued (409 through the API, exit 1
from the command line), naming the kind and the trainers that take it; a run that names no schemes
(the beat, `up --run`) gets the target schemes its trainer takes.
"""

from __future__ import annotations

from potato_queue.bundle import schema_kind, target_schemas
from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict
from potato_queue.trainers import trainer_info, trainers_for_kind

__all__ = ["trainer_kinds", "trainable_schemas", "refuse_foreign_kinds"]


def trainer_kinds(trainer: str) -> tuple[str, ...]:
    info = trainer_info(trainer)
    return info.kinds if info is not None else ()


def _schemes_by_name(config: ProjectConfig) -> dict[str, dict[str, object]]:
    return {str(s["name"]): s for s in config.annotation_schemes if s.get("name") is not None}


def trainable_schemas(config: ProjectConfig, trainer: str) -> list[str]:
    """The config's target schemes `trainer` takes, in config order."""
    schemes, kinds = _schemes_by_name(config), trainer_kinds(trainer)
    return [name for name in target_schemas(config) if schema_kind(schemes[name]) in kinds]


def refuse_foreign_kinds(config: ProjectConfig, trainer: str, schemas: list[str]) -> None:
    """Conflict for the first scheme whose kind `trainer` does not declare, saying which trainers take it."""
    schemes, kinds = _schemes_by_name(config), trainer_kinds(trainer)
    for name in schemas:
        scheme = schemes.get(name)
        if scheme is None:
            continue  # an unknown name is the caller's error to report
        kind = schema_kind(scheme)
        if kind in kinds:
            continue
        takers = trainers_for_kind(kind)
        others = trainable_schemas(config, trainer)
        fix = (f"train {name} with {' or '.join(takers)}" if takers
               else f"no trainer takes {kind} schemes yet: leave {name} out of the run")
        if others:
            fix += f"; {trainer} takes {', '.join(others)} here"
        raise Conflict(f"Scheme '{name}' is {kind} ({scheme.get('annotation_type')}), and {trainer} trains only "
                       f"{'/'.join(kinds) or 'no'} schemes", fix=fix)
