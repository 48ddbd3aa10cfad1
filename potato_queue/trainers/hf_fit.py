"""What every transformers trainer's fit does around its own training loop, in one place.

hf-text-, hf-image- and hf-token-classification, and hf-llm-lora (which plans its steps its own way):
the modules a run needs (peft with LoRA), the model card and the :class:`FitResult` a fit ends in, and a
scheme's saved model (rank 0 alone writes). The loops themselves, and how each reads its data, stay
with each trainer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, ClassVar

from potato_queue.trainers import parallel
from potato_queue.trainers.common import CARD_FILE, model_version, slug, write_json
from potato_queue.trainers.hf_heads import Head
from potato_queue.trainers.hf_text_parts import LORA_OFF
from potato_queue.worker.api import FitResult, RunContext, Trainer
from potato_queue.worker.spec import SchemaSpec

__all__ = ["with_peft", "FineTuneTrainer", "FitCard", "head_entry", "save_schema"]


def with_peft(requires: Sequence[str], params: dict[str, Any]) -> list[str]:
    """A trainer's required modules, and peft when the params turn LoRA on."""
    return list(requires) + (["peft"] if params.get("lora") not in LORA_OFF else [])


class FineTuneTrainer(Trainer):
    """A transformers fine-tune (hf-text-, hf-token-, hf-image-classification, hf-llm-lora): torch, peft when
    LoRA is on, and a fit every data-parallel rank runs (trainers/parallel.py joins them around fit_on_rank)."""

    uses_torch: ClassVar[bool] = True
    data_parallel: ClassVar[bool] = True

    def required_modules(self, params: dict[str, Any]) -> list[str]:
        """The trainer's modules, plus peft when LoRA is on."""
        return with_peft(self.requires, params)

    def fit(self, ctx: RunContext) -> FitResult:
        with parallel.data_parallel(ctx):
            return self.fit_on_rank(ctx)

    def fit_on_rank(self, ctx: RunContext) -> FitResult:
        """This rank's fit (every rank's, in a data-parallel run): the trainer's own."""
        raise NotImplementedError


def head_entry(schema: SchemaSpec, head: Head, n_train: int) -> dict[str, Any]:
    """What the model card says of a scheme trained through a head (hf_heads.py), beside its folder."""
    return {"kind": schema.kind or "nominal", "label_order": head.outputs, "n_train": n_train, **head.card()}


class FitCard:
    """One fit's metrics and model card, gathered as its schemes finish, and the FitResult they end in."""

    def __init__(self, trainer: str, ctx: RunContext, settings: Any) -> None:
        self.trainer, self.ctx, self.settings = trainer, ctx, settings
        self.metrics: dict[str, float] = {}
        self.schemas: dict[str, dict[str, Any]] = {}  # each scheme's card entry, in the spec's order

    def add(self, schema: SchemaSpec, metrics: dict[str, float], entry: dict[str, Any]) -> None:
        """A finished scheme: its metrics, and its card *entry* after the folder its model is saved in."""
        self.metrics.update(metrics)
        self.schemas[schema.name] = {"folder": slug(schema.name), **entry}

    def result(self, label_order: list[str], notes: list[str], steps: int) -> FitResult:
        """Write ``model_card.json`` (rank 0) and say what the fit made. The settings are read now, as the
        fit ended: what it adjusted to the model (a lowered max_length) is what the card shows."""
        ctx = self.ctx
        if ctx.main_rank:
            card = {
                "trainer": self.trainer,
                "settings": asdict(self.settings),
                "device": ctx.device,
                "schemas": self.schemas,
            }
            write_json(os.path.join(ctx.workdir, CARD_FILE), card)
        return FitResult(
            model_version=model_version(self.trainer, ctx.spec.run_id),
            artifact_paths=[CARD_FILE] + [slug(s.name) for s in ctx.schemas],
            metrics=self.metrics,
            label_order=label_order,
            notes=notes,
            steps=steps,
        )


def save_schema(ctx: RunContext, schema: SchemaSpec, model: Any, preprocessor: Any, head: Head | None = None) -> None:
    """A scheme's model, its tokenizer or image processor and its head's files into ``<workdir>/<schema>/``;
    rank 0 alone writes (every rank holds the same weights)."""
    if ctx.main_rank:
        folder = os.path.join(ctx.workdir, slug(schema.name))
        model.save_pretrained(folder)
        preprocessor.save_pretrained(folder)
        if head is not None:
            head.save(folder)
