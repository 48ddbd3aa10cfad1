"""``hf-llm-lora``: fine-tune a decoder LLM (Llama, Qwen, Mistral, Phi ...) with LoRA for nominal schemas.

The decoder gets a classification head over the schema's labels (transformers'
``AutoModelForSequenceClassification``: the last token's state is classified),
LoRA adapters through peft (per-family targets, llm_parts.LORA_TARGETS), and,
where CUDA is there, 4-bit nf4 base weights with double quantisation and bf16
compute through bitsandbytes (QLoRA). A plain torch loop: AdamW over the
adapters and the head, linear warmup and decay, gradient accumulation,
autocast in bf16/fp16 on a GPU, gradient checkpointing, and a checkpoint every
``checkpoint_every_steps`` (and when preempted) that a requeued or resumed run
continues from.

Params: ``model_name`` (a hub name or a local folder), ``epochs`` (1),
``learning_rate`` (2e-4), ``batch_size`` (4), ``grad_accum_steps`` (4),
``max_length`` (256 tokens; how many items were cut is said in run.log),
``lora`` ({r: 16, alpha: 32, dropout: 0.05, target_modules: per family}),
``load_in_4bit`` (auto: on a CUDA GPU; true refuses a CPU with the fix),
``precision`` (auto, bf16, fp16, fp32), ``gradient_checkpointing`` (true),
``merge`` (false: the adapter is the model file, small to copy back; true:
the adapter merged into full base weights), ``checkpoint_every_steps`` (50),
``seed``, ``weight_decay`` (0), ``warmup_ratio`` (0.03), ``log_every``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from potato_queue.trainers import llm_loop
from potato_queue.trainers.common import (
    labelled_texts,
    model_version,
    param,
    schema_labels,
    slug,
    validate_nominal,
    write_json,
)
from potato_queue.trainers.hub import go_offline, hub_answers, hub_host, packaged_model
from potato_queue.trainers.registry import TRAINERS
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext, Trainer
from potato_queue.worker.errors import ValidationFailed

__all__ = ["HFLLMLoRATrainer", "LLMSettings", "read_settings", "CARD_FILE", "LORA_DEFAULTS"]

CARD_FILE = "model_card.json"
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
        raise ValidationFailed(f"params.lora must be an object like {{r: 16, alpha: 32}} (LoRA is what this "
                               f"trainer does), got {value!r}")
    unknown = sorted(set(value) - set(LORA_DEFAULTS))
    if unknown:
        raise ValidationFailed("params.lora has unknown keys: " + ", ".join(unknown) + "; it takes r, alpha, "
                               "dropout, target_modules")
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


class HFLLMLoRATrainer(Trainer):
    """One LoRA-adapted decoder classifier per nominal schema."""

    name: ClassVar[str] = "hf-llm-lora"
    requires: ClassVar[tuple[str, ...]] = ("torch", "transformers", "peft")
    kinds: ClassVar[tuple[str, ...]] = ("nominal",)
    uses_torch: ClassVar[bool] = True
    checkpoint_every_steps: ClassVar[int] = 50

    def __init__(self) -> None:
        self.settings: LLMSettings | None = None
        self._models: dict[str, tuple[Any, Any, list[str]]] = {}
        self.offline = False

    def validate(self, ctx: RunContext) -> list[str]:
        """Nominal schemas with train data, sane params, a model that exists, 4-bit only where it can run."""
        from potato_queue.trainers.llm_parts import refuse_4bit

        self.settings = settings = read_settings(ctx)
        problems = super().validate(ctx) or validate_nominal(ctx, min_train=2)
        if settings.model_name.startswith((".", "/", "~")) and not settings.local_model:
            problems.append(f"params.model_name {settings.model_name} is not a folder on this machine")
        refusal = refuse_4bit(ctx.device) if settings.load_in_4bit == "true" else None
        if refusal:
            problems.append(refusal)
        self.offline = settings.local_model or not hub_answers()
        if self.offline:
            go_offline()
            if not settings.local_model:
                ctx.reporter.log("warning", f"the model hub ({hub_host()}) does not answer from here: "
                                            f"{settings.model_name} must be in this machine's Hugging Face cache")
        return problems

    def fit(self, ctx: RunContext) -> FitResult:
        """Fine-tune each schema's adapters; save them (or the merged model) under ``<workdir>/<schema>/``."""
        settings = self.settings or read_settings(ctx)
        llm_loop.seed_everything(settings.seed)
        data = {s.name: labelled_texts(ctx.bundle, "train", s.name) for s in ctx.schemas}
        # Steps are optimiser updates: grad_accum_steps batches each, the last of an epoch maybe fewer.
        per_schema = {name: settings.epochs * math.ceil(math.ceil(len(texts) / settings.batch_size) / settings.grad_accum_steps)
                      for name, (texts, _) in data.items()}
        plan = llm_loop.Plan(per_schema, settings.log_every, started_s=time.monotonic())
        card: dict[str, Any] = {"trainer": self.name, "settings": asdict(settings), "device": ctx.device, "schemas": {}}
        metrics: dict[str, float] = {}
        start = ctx.resume_point()
        for schema in ctx.schemas:
            texts, gold = data[schema.name]
            labels = schema_labels(ctx, schema)
            labels = labels + sorted(set(gold) - set(labels))
            loop = llm_loop.SchemaLoop(ctx, settings, schema, labels, plan, self.offline)
            metrics.update(loop.run(texts, gold, start))
            self._models[schema.name] = (loop.tokenizer, loop.model, labels)
            card["schemas"][schema.name] = {"folder": slug(schema.name), "label_order": labels, "n_train": len(texts),
                                            "lora_targets": loop.targets, "precision": loop.precision,
                                            "load_in_4bit": loop.four_bit, "truncated": loop.truncated}
        write_json(os.path.join(ctx.workdir, CARD_FILE), card)
        lora = settings.lora
        notes = [f"base model: {settings.model_name}",
                 f"LoRA r={lora['r']} alpha={lora['alpha']} on {', '.join(card['schemas'][ctx.schemas[0].name]['lora_targets'])}"
                 + ("; merged into the saved model" if settings.merge else "; the adapter is the saved model")]
        return FitResult(model_version=model_version(self.name, ctx.spec.run_id),
                         artifact_paths=[CARD_FILE] + [slug(s.name) for s in ctx.schemas], metrics=metrics,
                         label_order=self._models[ctx.schemas[0].name][2], notes=notes, steps=plan.done)

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """Softmax over each schema's labels; the top label and its probability."""
        settings = self.settings or read_settings(ctx)
        items = list(items)
        for schema in ctx.schemas:
            tokenizer, model, labels = self._models[schema.name]
            for chunk, rows in llm_loop.probabilities(ctx, settings, tokenizer, model, [i.text for i in items]):
                for item, row in zip([items[i] for i in chunk], rows):  # noqa: B905 - runs on 3.8/3.9
                    best = int(row.argmax())
                    yield Prediction(item.instance_id, schema.name, labels[best], float(row[best]))
