"""hf-text-classification's parts: its checked settings, and its torch pieces (the model and its head, LoRA,
batches), apart from the trainer that runs them (hf_text.py) and the loop they run in (fine_tune.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from potato_queue.trainers.common import param
from potato_queue.trainers.hub import packaged_model
from potato_queue.trainers.registry import TRAINERS, TrainerInfo
from potato_queue.worker.api import RunContext
from potato_queue.worker.errors import ValidationFailed

__all__ = [
    "HFSettings",
    "read_settings",
    "load_base",
    "apply_lora",
    "encode",
    "LORA_OFF",
    "position_limit",
    "fit_max_length",
]

INFO = TRAINERS["hf-text-classification"]  # its params' defaults
LORA_DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None}
LORA_OFF = (None, False, "false", "False", 0)  # params.lora values that leave LoRA off
# What a tokenizer that was never told its model's length says (transformers' VERY_LARGE_INTEGER is 1e30).
UNSET_LENGTH = 1_000_000


@dataclass
class HFSettings:
    """The run's parameters, checked."""

    model_name: str
    epochs: int
    learning_rate: float
    batch_size: int
    max_length: int
    lora: dict[str, Any] | None
    seed: int
    weight_decay: float
    warmup_ratio: float
    log_every: int
    packaged_folder: str | None = None  # the model's folder inside a pip package (hub.PACKAGED_MODELS)

    @property
    def local_model(self) -> bool:
        """Whether the model is a folder on this machine (``model_name`` itself, or a package's)."""
        return self.packaged_folder is not None or os.path.isdir(os.path.expanduser(self.model_name))

    @property
    def load_from(self) -> str:
        """What from_pretrained is given: a folder when the model is on this machine, else the hub name."""
        if self.packaged_folder is not None:
            return self.packaged_folder
        return os.path.expanduser(self.model_name) if self.local_model else self.model_name


def _lora_settings(value: Any) -> dict[str, Any] | None:
    if value in LORA_OFF:
        return None
    if value is True or value in ("true", "True", 1):
        return dict(LORA_DEFAULTS)
    if not isinstance(value, dict):
        raise ValidationFailed(f"params.lora must be true/false or an object, got {value!r}")
    unknown = sorted(set(value) - set(LORA_DEFAULTS))
    if unknown:
        raise ValidationFailed("params.lora has unknown keys: " + ", ".join(unknown))
    return {**LORA_DEFAULTS, **value}


def read_settings(ctx: RunContext, info: TrainerInfo = INFO) -> HFSettings:
    """The run's :class:`HFSettings` (:class:`ValidationFailed` on a bad value); *info*: the trainer whose
    defaults apply (hf-text-classification's, which its token and image siblings share but the model)."""
    lora = _lora_settings(ctx.params.get("lora"))
    settings = HFSettings(
        model_name=param(ctx, "model_name", str(info.default("model_name")), str),
        epochs=param(ctx, "epochs", INFO.default("epochs"), int),
        learning_rate=param(ctx, "learning_rate", 2e-4 if lora else INFO.default("learning_rate"), float),
        batch_size=param(ctx, "batch_size", INFO.default("batch_size"), int),
        max_length=param(ctx, "max_length", INFO.default("max_length"), int),
        lora=lora,
        seed=param(ctx, "seed", ctx.spec.seed, int),
        weight_decay=param(ctx, "weight_decay", 0.01, float),
        warmup_ratio=param(ctx, "warmup_ratio", 0.06, float),
        log_every=param(ctx, "log_every", 0, int),
    )
    settings.packaged_folder = packaged_model(settings.model_name)
    if settings.epochs < 1 or settings.batch_size < 1 or settings.max_length < 2:
        raise ValidationFailed("params need epochs >= 1, batch_size >= 1 and max_length >= 2")
    if not 0 < settings.learning_rate < 1 or not 0 <= settings.warmup_ratio < 1:
        raise ValidationFailed("params need 0 < learning_rate < 1 and 0 <= warmup_ratio < 1")
    return settings


def load_base(
    settings: HFSettings,
    labels: list[str],
    device: str,
    offline: bool,
    problem_type: str | None = None,
    per_token: bool = False,
) -> tuple[Any, Any]:
    """Tokenizer and a fresh head of one output per name in *labels* (from the cache only, when offline);
    *problem_type*: transformers' loss for it, when not a softmax (hf_heads.py); *per_token*: a tagger's
    head, one output set per token (hf_tokens.py)."""
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    name = settings.load_from
    # Explicit: transformers may have been imported (and read HF_HUB_OFFLINE) before go_offline().
    local = {"local_files_only": True} if settings.local_model or offline else {}
    tokenizer = AutoTokenizer.from_pretrained(name, **local)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    model = (AutoModelForTokenClassification if per_token else AutoModelForSequenceClassification).from_pretrained(
        name,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        ignore_mismatched_sizes=True,
        **({"problem_type": problem_type} if problem_type else {}),
        **local,
    )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model.to(device)


def apply_lora(ctx: RunContext, model: Any, lora: dict[str, Any], task: str | None = "SEQ_CLS") -> Any:
    """Wrap *model* with LoRA adapters (peft); only adapters and the head train. *task*: peft's TaskType name
    (SEQ_CLS, TOKEN_CLS), or None for a model peft has no task for (an image classifier), whose head
    (`classifier`) is then trained in full beside the adapters."""
    from peft import LoraConfig, TaskType, get_peft_model

    def config(targets: Any) -> Any:
        return LoraConfig(
            task_type=TaskType[task] if task else None,
            r=int(lora["r"]),
            lora_alpha=int(lora["alpha"]),
            lora_dropout=float(lora["dropout"]),
            target_modules=targets,
            modules_to_save=None if task else ["classifier"],
        )

    try:
        return get_peft_model(model, config(lora["target_modules"]))
    except ValueError as exc:
        if lora["target_modules"] is not None:
            raise
        ctx.reporter.log("info", f"peft has no default LoRA targets for this model ({exc}); using all-linear")
        return get_peft_model(model, config("all-linear"))


def position_limit(tokenizer: Any, model: Any) -> int | None:
    """The most tokens *model* takes: its position table's size, or less where its tokenizer says so (RoBERTa's
    table has two rows more than it uses); None when neither tells, and for a model whose input has no
    absolute positions (DeBERTa-v2/v3: relative ones only; its max_position_embeddings bounds nothing)."""
    if getattr(model.config, "position_biased_input", True) is False:
        return None
    said = (getattr(model.config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None))
    limits = [n for n in said if isinstance(n, int) and 0 < n < UNSET_LENGTH]
    return min(limits) if limits else None


def fit_max_length(ctx: RunContext, settings: HFSettings, tokenizer: Any, model: Any) -> None:
    """Lower ``settings.max_length`` to what the model takes, saying so: a longer batch would fail in the
    forward pass (an index past the position table), after the model was loaded and maybe halfway through."""
    limit = position_limit(tokenizer, model)
    if limit is not None and settings.max_length > limit:
        ctx.reporter.log(
            "warning",
            f"params.max_length {settings.max_length} is more than {settings.model_name} "
            f"takes: lowered to its {limit} tokens",
        )
        settings.max_length = limit


def encode(tokenizer: Any, texts: list[str], max_length: int, device: str) -> Any:
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    return batch.to(device)
