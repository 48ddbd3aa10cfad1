"""Helpers shared by the trainers: nominal targets, label vocabularies, files."""

from __future__ import annotations

import json
import os
from typing import Any

from potato_queue.trainers.pairs import model_input
from potato_queue.wire.text import slug
from potato_queue.worker.api import RunContext
from potato_queue.worker.bundle import Bundle
from potato_queue.worker.errors import ValidationFailed
from potato_queue.worker.spec import SchemaSpec

__all__ = [
    "CARD_FILE",
    "nominal_target",
    "labelled_texts",
    "schema_labels",
    "validate_nominal",
    "slug",
    "write_json",
    "model_version",
    "param",
    "seed_everything",
]

# Every trainer's card in its model files (`{"trainer", "settings", "schemas"}`): runs/model_card.py reads it
# into the README a published model gets.
CARD_FILE = "model_card.json"


def nominal_target(row: dict[str, Any], schema: str) -> str | None:
    """The row's label for *schema*, or None when it has none."""
    target = (row.get("targets") or {}).get(schema)
    if isinstance(target, list):
        target = target[0] if len(target) == 1 else None
    if target is None or target == "":
        return None
    return str(target)


def labelled_texts(bundle: Bundle, split: str, schema: str, paired: bool = False) -> tuple[list[str], list[str]]:
    """``(texts, labels)`` of the rows of *split* that have a label for *schema* (`paired`: a pairwise
    scheme's rows as their two texts, trainers/pairs.py)."""
    texts: list[str] = []
    labels: list[str] = []
    for row in bundle.read_split(split):
        label = nominal_target(row, schema)
        if label is not None:
            texts.append(model_input(row, paired))
            labels.append(label)
    return texts, labels


def schema_labels(ctx: RunContext, schema: SchemaSpec) -> list[str]:
    """The label order for *schema*: the bundle's vocabulary, else the spec's labels."""
    return ctx.bundle.labels(schema.name) or list(schema.labels)


def validate_nominal(ctx: RunContext, min_train: int = 2, schemas: list[SchemaSpec] | None = None) -> list[str]:
    """Problems that stop a nominal classifier from training on this bundle (`schemas`: these, not all)."""
    problems: list[str] = []
    for schema in ctx.schemas if schemas is None else schemas:
        if len(schema_labels(ctx, schema)) < 2:
            problems.append(f"Schema '{schema.name}' has fewer than two labels in the bundle")
            continue
        _, labels = labelled_texts(ctx.bundle, "train", schema.name)
        if len(labels) < min_train:
            problems.append(
                f"Schema '{schema.name}' has {len(labels)} labelled train item(s); at least {min_train} are needed"
            )
        elif len(set(labels)) < 2:
            problems.append(f"Schema '{schema.name}' has only one label ({labels[0]}) in the train split")
    return problems


def write_json(path: str, data: Any) -> None:
    """Write *data* as indented JSON (UTF-8)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, ensure_ascii=False, default=str)
        fh.write("\n")


def model_version(trainer: str, run_id: str) -> str:
    """``<trainer>-<run_id>``."""
    return f"{trainer}-{run_id}"


def param(ctx: RunContext, name: str, default: Any, kind: type) -> Any:
    """``params[name]`` converted to *kind*; a bad value is :class:`ValidationFailed` (exit 2)."""
    value = ctx.params.get(name, default)
    if value is None:
        return default
    try:
        if kind is bool:
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ValidationFailed(f"params.{name} must be {kind.__name__}, got {value!r}") from exc


def seed_everything(seed: int) -> None:
    """A torch trainer's first weights (a new head, LoRA's A matrices), each shuffle and every dropout mask
    from the run's seed: a rerun, or a run resumed from a checkpoint, is the same run."""
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
