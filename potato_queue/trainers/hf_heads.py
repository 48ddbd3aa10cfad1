"""hf-text-classification's heads: what one scheme's model outputs and learns from, by the scheme's kind.

- nominal: one output per label, softmax, cross-entropy on the label's index;
- multilabel (a multiselect): one sigmoid per label, binary cross-entropy, each label's threshold chosen
  on val (trainers/multilabel.py), kept in ``thresholds.json`` beside the model;
- ordinal (a likert): one sigmoid per "above point k", binary cross-entropy on the cumulative answers, read
  back as the median point (trainers/scales.py); the scale in ``scale.json`` beside the model;
- continuous (a slider, a number): one output, mean squared error on the standardised answer, put back on
  the scale's units; the scale (its bounds, step, mean and spread) in ``scale.json``.

transformers' own heads do the losses (``problem_type``): a head only says which, codes the answers
and reads the outputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from potato_queue.trainers.common import labelled_texts, schema_labels, write_json
from potato_queue.trainers.multilabel import choose_thresholds, labelled_sets, set_prediction
from potato_queue.trainers.scales import OrdinalScale, Scale, labelled_values, scale_for, scale_from_dict
from potato_queue.wire.scoring import MULTILABEL, SCALE_KINDS
from potato_queue.worker.api import Prediction, RunContext
from potato_queue.worker.bundle import Bundle
from potato_queue.worker.spec import SchemaSpec

__all__ = ["Head", "head_for", "saved_head", "MULTI_LABEL", "REGRESSION", "THRESHOLDS_FILE", "SCALE_FILE"]

# transformers' names for a head of one sigmoid per output (BCE) and one of a single number (MSE).
MULTI_LABEL = "multi_label_classification"
REGRESSION = "regression"
THRESHOLDS_FILE = "thresholds.json"  # a multiselect's per-label thresholds, beside its model
SCALE_FILE = "scale.json"  # a scale's points or bounds, beside its model


class Head:
    """A nominal scheme's head: one softmax over its labels."""

    kind = "nominal"
    problem_type: str | None = None
    tunes = False  # whether val settles something after training (tune): a multiselect's thresholds

    def __init__(self, labels: Sequence[str]) -> None:
        self.labels = list(labels)

    @property
    def outputs(self) -> list[str]:
        """The model's outputs, in order (its config's id2label)."""
        return self.labels

    @property
    def points(self) -> list[Any] | None:
        """A scale's points, which scoring a labelled likert needs; None for the others."""
        return None

    def read(self, bundle: Bundle, split: str, schema: str) -> tuple[list[str], list[Any]]:
        """(texts, answers) of *split*'s rows that answered *schema*."""
        return labelled_texts(bundle, split, schema)

    def target(self, answer: Any) -> Any:
        """What the loss compares the outputs with (None: an answer the head has no output for)."""
        return self.labels.index(answer) if answer in self.labels else None

    def activate(self, logits: Any) -> list[list[float]]:
        """The outputs as the head reads them (torch logits of a batch)."""
        import torch

        return torch.softmax(logits, dim=-1).cpu().tolist()

    def prediction(self, instance_id: str, schema: str, row: Sequence[float]) -> Prediction:
        return Prediction.top(instance_id, schema, self.labels, row)

    def tune(self, rows: list[list[float]], answers: list[Any]) -> None:
        """Settle what val decides (a multiselect's thresholds); nothing for the others."""

    def save(self, folder: str) -> None:
        """Write what the model's config does not hold, beside it."""

    def card(self) -> dict[str, Any]:
        """What model_card.json says of the head beyond its outputs."""
        return {}


class MultiLabelHead(Head):
    """A multiselect's head: one sigmoid per label, each with its own threshold."""

    kind = MULTILABEL
    problem_type = MULTI_LABEL
    tunes = True

    def __init__(self, labels: Sequence[str], thresholds: dict[str, float] | None = None) -> None:
        super().__init__(labels)
        self.thresholds = dict(thresholds or {})

    def read(self, bundle: Bundle, split: str, schema: str) -> tuple[list[str], list[Any]]:
        return labelled_sets(bundle, split, schema)

    def target(self, answer: Any) -> Any:
        return [1.0 if label in answer else 0.0 for label in self.labels]

    def activate(self, logits: Any) -> list[list[float]]:
        import torch

        return torch.sigmoid(logits).cpu().tolist()

    def prediction(self, instance_id: str, schema: str, row: Sequence[float]) -> Prediction:
        return set_prediction(instance_id, schema, self.labels, row, self.thresholds)

    def tune(self, rows: list[list[float]], answers: list[Any]) -> None:
        self.thresholds = choose_thresholds(self.labels, rows, answers) if rows else {}

    def save(self, folder: str) -> None:
        write_json(os.path.join(folder, THRESHOLDS_FILE), self.thresholds)

    def card(self) -> dict[str, Any]:
        return {"thresholds": self.thresholds}


class ScaleHead(Head):
    """A likert's head (one sigmoid per "above point k") or a slider's (one number)."""

    def __init__(self, scale: Scale) -> None:
        super().__init__([])
        self.scale = scale
        self.kind = scale.kind
        self.ordinal = isinstance(scale, OrdinalScale)
        self.problem_type = MULTI_LABEL if self.ordinal else REGRESSION

    @property
    def outputs(self) -> list[str]:
        return self.scale.outputs if isinstance(self.scale, OrdinalScale) else ["value"]

    @property
    def points(self) -> list[Any] | None:
        return self.scale.points if isinstance(self.scale, OrdinalScale) else None

    def read(self, bundle: Bundle, split: str, schema: str) -> tuple[list[str], list[Any]]:
        return labelled_values(bundle, split, schema)

    def target(self, answer: Any) -> Any:
        return self.scale.target(answer) if isinstance(self.scale, OrdinalScale) else self.scale.standard(answer)

    def activate(self, logits: Any) -> list[list[float]]:
        import torch

        return (torch.sigmoid(logits) if self.ordinal else logits).cpu().tolist()

    def prediction(self, instance_id: str, schema: str, row: Sequence[float]) -> Prediction:
        if isinstance(self.scale, OrdinalScale):
            return self.scale.prediction(instance_id, schema, row)
        return self.scale.prediction(instance_id, schema, row[0])

    def save(self, folder: str) -> None:
        write_json(os.path.join(folder, SCALE_FILE), self.scale.to_dict())

    def card(self) -> dict[str, Any]:
        return {"scale": self.scale.to_dict()}


def head_for(ctx: RunContext, schema: SchemaSpec) -> Head:
    """A new head for *schema*, by its kind (labels: the bundle's, then any other the train answers have)."""
    if schema.kind in SCALE_KINDS:
        return ScaleHead(scale_for(ctx, schema))
    multi = schema.kind == MULTILABEL
    _, answers = (labelled_sets if multi else labelled_texts)(ctx.bundle, "train", schema.name)
    seen = {x for answer in answers for x in (answer if multi else [answer])}
    labels = schema_labels(ctx, schema)
    labels = labels + sorted(seen - set(labels))
    return MultiLabelHead(labels) if multi else Head(labels)


def _read(folder: str, name: str) -> Any:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def saved_head(folder: str, config: Any) -> Head:
    """The head of a model saved in *folder* (its transformers *config*, and the files beside it)."""
    scale = _read(folder, SCALE_FILE)
    if scale is not None:
        return ScaleHead(scale_from_dict(scale))
    labels = [config.id2label[i] for i in range(config.num_labels)]
    if config.problem_type == MULTI_LABEL:
        return MultiLabelHead(labels, _read(folder, THRESHOLDS_FILE))
    return Head(labels)
