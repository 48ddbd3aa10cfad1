"""hf-llm-lora's params, read and checked: what a run may set, its defaults (the registry's), its refusals.

Standard library only (the worker reads them before torch is imported).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from potato_queue.trainers.common import param
from potato_queue.trainers.hub import packaged_model
from potato_queue.trainers.registry import TRAINERS
from potato_queue.worker.api import RunContext
from potato_queue.worker.errors import ValidationFailed

__all__ = ["LLMSettings", "read_settings", "LORA_DEFAULTS", "PRECISIONS"]

INFO = TRAINERS["hf-llm-lora"]
LORA_DEFAULTS: dict[str, Any] = {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": None}
PRECISIONS = ("auto", "bf16", "fp16", "fp32")


@dataclass
class LLMSettings:
    """The run's parameters, checked."""

    model_name: str
    epochs: int
    learning_rate: float
    batch_size: int
    grad_accum_steps: int
    max_length: int
    lora: dict[str, Any]
    load_in_4bit: str  # "auto", "true", "false"
    precision: str
    gradient_checkpointing: bool
    merge: bool
    seed: int
    weight_decay: float
    warmup_ratio: float
    log_every: int

    @property
    def local_model(self) -> bool:
        return os.path.isdir(os.path.expanduser(self.model_name)) or packaged_model(self.model_name) is not None

    @property
    def load_from(self) -> str:
        return packaged_model(self.model_name) or os.path.expanduser(self.model_name)


def _lora(value: Any) -> dict[str, Any]:
    if value in (None, True):
        return dict(LORA_DEFAULTS)
    if not isinstance(value, dict):
        raise ValidationFailed(
            f"params.lora must be an object like {{r: 16, alpha: 32}} (LoRA is what this trainer does), got {value!r}"
        )
    unknown = sorted(set(value) - set(LORA_DEFAULTS))
    if unknown:
        raise ValidationFailed(
            "params.lora has unknown keys: " + ", ".join(unknown) + "; it takes r, alpha, dropout, target_modules"
        )
    return {**LORA_DEFAULTS, **value}


def _choice(ctx: RunContext, name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = str(ctx.params.get(name, default)).lower()
    if value not in allowed:
        raise ValidationFailed(f"params.{name} must be one of {', '.join(allowed)}, got {ctx.params.get(name)!r}")
    return value


def read_settings(ctx: RunContext) -> LLMSettings:
    """The run's :class:`LLMSettings` (:class:`ValidationFailed` on a bad value)."""
    settings = LLMSettings(
        model_name=param(ctx, "model_name", INFO.default("model_name"), str),
        epochs=param(ctx, "epochs", INFO.default("epochs"), int),
        learning_rate=param(ctx, "learning_rate", INFO.default("learning_rate"), float),
        batch_size=param(ctx, "batch_size", INFO.default("batch_size"), int),
        grad_accum_steps=param(ctx, "grad_accum_steps", INFO.default("grad_accum_steps"), int),
        max_length=param(ctx, "max_length", INFO.default("max_length"), int),
        lora=_lora(ctx.params.get("lora")),
        load_in_4bit=_choice(ctx, "load_in_4bit", "auto", ("auto", "true", "false")),
        precision=_choice(ctx, "precision", "auto", PRECISIONS),
        gradient_checkpointing=param(ctx, "gradient_checkpointing", True, bool),
        merge=param(ctx, "merge", False, bool),
        seed=param(ctx, "seed", ctx.spec.seed, int),
        weight_decay=param(ctx, "weight_decay", 0.0, float),
        warmup_ratio=param(ctx, "warmup_ratio", 0.03, float),
        log_every=param(ctx, "log_every", 0, int),
    )
    if min(settings.epochs, settings.batch_size, settings.grad_accum_steps) < 1 or settings.max_length < 2:
        raise ValidationFailed("params need epochs, batch_size and grad_accum_steps >= 1 and max_length >= 2")
    if not 0 < settings.learning_rate < 1 or not 0 <= settings.warmup_ratio < 1:
        raise ValidationFailed("params need 0 < learning_rate < 1 and 0 <= warmup_ratio < 1")
    return settings
