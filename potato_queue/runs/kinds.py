"""Which trainer takes which of a project's schemes: a trainer runs only on the schema kinds it declares.

The kind of a scheme is Potato's (bundle.read.schema_kind: a multiselect is `multilabel`, a likert
`ordinal`, a slider `continuous`, ...); a trainer's kinds are its registry entry's. A run that asks a
trainer for a kind it does not declare, or on items of a modality it does not (images, for a text
trainer: Potato's rule for the image modality, bundle.project_modality), is refused before it is queued
(409 through the API, exit 1 from the command line), naming the kind or modality and the trainers that
take it; a run that names no schemes
(the beat, `up --run`) gets the target schemes its trainer takes.
"""

from __future__ import annotations

from potato_queue.bundle import project_modality, schema_kind, target_schemas
from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict
from potato_queue.schemes import refusal_text
from potato_queue.trainers import trainer_info, trainers_for_modality

__all__ = [
    "trainer_kinds",
    "trainable_schemas",
    "schemas_for",
    "refuse_foreign_kinds",
    "refuse_foreign_modality",
]


def trainer_kinds(trainer: str) -> tuple[str, ...]:
    info = trainer_info(trainer)
    return info.kinds if info is not None else ()


def _schemes_by_name(config: ProjectConfig) -> dict[str, dict[str, object]]:
    return {str(s["name"]): s for s in config.annotation_schemes if s.get("name") is not None}


def trainable_schemas(config: ProjectConfig, trainer: str) -> list[str]:
    """The config's target schemes `trainer` takes (their kinds, on items of its modalities), in config order."""
    schemes, kinds = _schemes_by_name(config), trainer_kinds(trainer)
    taken = [name for name in target_schemas(config) if schema_kind(schemes[name]) in kinds]
    info = trainer_info(trainer)
    if taken and info is not None and project_modality(config, taken) not in info.modalities:
        return []  # the items are images (say) and the trainer reads text
    return taken


def refuse_foreign_kinds(config: ProjectConfig, trainer: str, schemas: list[str]) -> None:
    """Conflict for the first scheme whose kind `trainer` does not declare, saying which trainers take it."""
    schemes, kinds = _schemes_by_name(config), trainer_kinds(trainer)
    for name in schemas:
        scheme = schemes.get(name)
        if scheme is None:
            continue  # an unknown name is the caller's error to report
        refused = refusal_text(scheme)
        if refused:
            others = trainable_schemas(config, trainer)
            raise Conflict(
                refused,
                fix=f"leave {name} out of the run"
                + (f"; {trainer} takes {', '.join(others)} here" if others else "")
                + " (docs/trainers.md has every annotation type and what is trained)",
            )
        kind = schema_kind(scheme)
        if kind in kinds:
            continue
        takers = trainers_for_modality(kind, project_modality(config, [name]))
        others = trainable_schemas(config, trainer)
        fix = (
            f"train {name} with {' or '.join(takers)}"
            if takers
            else f"no trainer takes {kind} schemes yet: leave {name} out of the run"
        )
        if others:
            fix += f"; {trainer} takes {', '.join(others)} here"
        raise Conflict(
            f"Scheme '{name}' is {kind} ({scheme.get('annotation_type')}), and {trainer} trains only "
            f"{'/'.join(kinds) or 'no'} schemes",
            fix=fix,
        )


def refuse_foreign_modality(config: ProjectConfig, trainer: str, schemas: list[str]) -> None:
    """Conflict when the run's items are of a modality `trainer` does not train on (images for a text trainer)."""
    info = trainer_info(trainer)
    if info is None:
        return
    modality = project_modality(config, schemas)
    if modality in info.modalities:
        return
    schemes = _schemes_by_name(config)
    kinds = [schema_kind(schemes[name]) for name in schemas if name in schemes]
    takers = sorted({t for kind in kinds for t in trainers_for_modality(kind, modality)})
    raise Conflict(
        f"The items of {', '.join(schemas)} are of the {modality} modality (Potato's rule: most items name "
        f"a file of that kind), and {trainer} trains on {'/'.join(info.modalities)} items",
        fix=(
            f"train them with {' or '.join(takers)}"
            if takers
            else f"no trainer takes {modality} items of these kinds yet"
        ),
    )


def schemas_for(config: ProjectConfig, trainer: str) -> list[str]:
    """The schemes a run of `trainer` that names none gets (`up --run`): trainable_schemas, or the Conflict a
    run naming the project's schemes would get (the kind or modality message), so nothing is queued for it."""
    taken = trainable_schemas(config, trainer)
    if taken:
        return taken
    trained = target_schemas(config)
    if not trained:
        schemes = _schemes_by_name(config)
        said = "; ".join(text for s in schemes.values() if (text := refusal_text(s)))
        raise Conflict(
            f"No scheme of this project is one a run trains{': ' + said if said else ''}",
            fix="docs/trainers.md has every annotation type and which are trained",
        )
    refuse_foreign_kinds(config, trainer, trained)
    refuse_foreign_modality(config, trainer, trained)
    raise Conflict(f"{trainer} takes none of {', '.join(trained)}")  # not reached: one of the two refuses
