"""``hf-token-classification``: fine-tune a transformers token classifier on a span scheme.

The same torch loop as hf-text-classification (fine_tune.py: AdamW, linear warmup/decay, clipping; LoRA through peft,
data-parallel over several GPUs) over ``AutoModelForTokenClassification``, one model per span scheme.
Potato's character offsets become BIO tags on the tokens and the tagger's tags become character spans
again (trainers/spans.py), so the tokenizer must give offsets (a "fast" tokenizer, as every common model
has). Its params are hf-text-classification's (model_name, epochs, learning_rate, batch_size, max_length,
lora, seed, weight_decay, warmup_ratio, log_every). Each scheme's model and tokenizer are saved into
``<workdir>/<schema>/``, its tags in the model's config; ``model_card.json`` describes the run.

A prediction is the list of spans Potato draws a span prelabel from, ``[{start, end, label, confidence},
...]``; the line's confidence is the least sure token decision of the text.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from potato_queue.trainers.common import seed_everything
from potato_queue.trainers.fine_tune import Progress
from potato_queue.trainers.hf_fit import FineTuneTrainer, FitCard, SchemeFit, in_chunks, load_saved, save_schema
from potato_queue.trainers.hf_text_parts import HFSettings, apply_lora, fit_max_length, load_base, read_settings
from potato_queue.trainers.hub import check_model, explain_not_cached
from potato_queue.trainers.registry import TRAINERS
from potato_queue.trainers.spans import bio_tags, drop_overlaps, labelled_spans, spans_from_tags, tag_names
from potato_queue.wire.scoring import SPAN, score
from potato_queue.wire.span_scores import Span
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext
from potato_queue.worker.errors import TrainerError
from potato_queue.worker.spec import SchemaSpec

__all__ = ["HFTokenClassificationTrainer"]

INFO = TRAINERS["hf-token-classification"]  # its params' defaults
IGNORED = -100  # the loss leaves these tokens out (the tokenizer's own, and padding)
EXAMPLES_SAID = 3


class HFTokenClassificationTrainer(FineTuneTrainer):
    """Fine-tunes one transformers token classifier (BIO tags) per span scheme."""

    name: ClassVar[str] = "hf-token-classification"
    requires: ClassVar[tuple[str, ...]] = ("torch", "transformers")
    kinds: ClassVar[tuple[str, ...]] = (SPAN,)

    def __init__(self) -> None:
        self.settings: HFSettings | None = None
        self._models: dict[str, tuple[Any, Any, list[str]]] = {}  # schema: (tokenizer, model, tag names)
        self.offline = False

    def validate(self, ctx: RunContext) -> list[str]:
        """Span schemes with two or more train items that have spans, sane params, a model that exists."""
        self.settings = read_settings(ctx, INFO)
        problems = super().validate(ctx)
        for schema in ctx.schemas if not problems else []:
            if schema.annotation_type not in ("span", ""):
                problems.append(
                    f"Schema '{schema.name}' is {schema.annotation_type}, a span kind whose answers carry "
                    f"more than labelled offsets; {self.name} trains plain span schemes "
                    f"(annotation_type: span)"
                )
                continue
            texts, _, _ = labelled_spans(ctx.bundle, "train", schema.name)
            if len(texts) < 2:
                problems.append(
                    f"Schema '{schema.name}' has {len(texts)} train item(s) with a span; at least 2 are needed"
                )
        found, self.offline = check_model(self.settings, ctx.reporter.log)
        return problems + found

    def fit_on_rank(self, ctx: RunContext) -> FitResult:
        # Kept: what the first scheme's model lowers (max_length) holds for the others, predict and the card.
        settings = self.settings = self.settings or read_settings(ctx, INFO)
        seed_everything(settings.seed)
        data = {s.name: self._train_spans(ctx, s) for s in ctx.schemas}
        progress = Progress.for_fit(ctx, {name: len(texts) for name, (texts, _) in data.items()}, settings)
        card = FitCard(self.name, ctx, settings)
        for schema in ctx.schemas:
            texts, spans = data[schema.name]
            metrics = self._fit_schema(ctx, schema, texts, spans, progress)
            card.add(schema, metrics, {"kind": SPAN, "n_train": len(texts), "tags": self._models[schema.name][2]})
        return card.result(self._models[ctx.schemas[0].name][2], [f"base model: {settings.model_name}"], progress.done)

    def _train_spans(self, ctx: RunContext, schema: SchemaSpec) -> tuple[list[str], list[list[Span]]]:
        """The train texts and their spans, overlapping ones left out and said in run.log."""
        texts, spans, ids = labelled_spans(ctx.bundle, "train", schema.name)
        kept, dropped = [], []
        for iid, found in zip(ids, spans):  # noqa: B905 - runs on 3.8/3.9
            keep, left = drop_overlaps(found)
            kept.append(keep)
            dropped += [(iid, span, clash) for span, clash in left]
        if dropped:
            said = "; ".join(
                f"{iid}: {s[2]} {s[0]}-{s[1]} overlaps {c[2]} {c[0]}-{c[1]}" for iid, s, c in dropped[:EXAMPLES_SAID]
            )
            ctx.reporter.log(
                "warning",
                f"{len(dropped)} train span(s) of {schema.name} overlap an earlier span and "
                f"were left out (a token takes one tag), e.g. {said}",
            )
        return texts, kept

    def _fit_schema(
        self, ctx: RunContext, schema: SchemaSpec, texts: list[str], spans: list[list[Span]], progress: Progress
    ) -> dict[str, float]:
        settings = self.settings or read_settings(ctx, INFO)
        names = tag_names(sorted({s[2] for found in spans for s in found}))
        ctx.reporter.status("running", f"loading {settings.model_name} for {schema.name}")
        with explain_not_cached(settings, self.offline):
            tokenizer, model = load_base(settings, names, ctx.device, self.offline, per_token=True)
        fit_max_length(ctx, settings, tokenizer, model)
        if not getattr(tokenizer, "is_fast", False):
            raise TrainerError(
                f"{settings.model_name}'s tokenizer gives no character offsets (it is not a fast "
                f"tokenizer), so spans cannot become token tags; choose a model with a fast tokenizer"
            )
        if settings.lora:
            model = apply_lora(ctx, model, settings.lora, task="TOKEN_CLS")
        cut = sum(1 for text in texts if len(tokenizer(text)["input_ids"]) > settings.max_length)
        if cut:
            ctx.reporter.log(
                "warning",
                f"{cut} of {len(texts)} train items of {schema.name} are longer than max_length "
                f"({settings.max_length} tokens): spans past it are neither learned nor "
                f"predicted; raise params.max_length",
            )
        val_texts, val_spans, _ = labelled_spans(ctx.bundle, "val", schema.name)
        ctx.reporter.status("running", f"training {schema.name} on {len(texts)} items")
        loss = self._train(
            SchemeFit(ctx, schema, model, tokenizer, names),
            list(zip(texts, spans)),  # noqa: B905
            list(zip(val_texts, val_spans)),  # noqa: B905
            progress,
        )
        if settings.lora:
            model = model.merge_and_unload()
        self._models[schema.name] = (tokenizer, model, names)
        save_schema(ctx, schema, model, tokenizer)
        return {ctx.metric_name(schema, "train_loss"): loss, ctx.metric_name(schema, "n_train"): float(len(texts))}

    @staticmethod
    def _batch(
        tokenizer: Any, texts: list[str], max_length: int, device: str
    ) -> tuple[Any, list[list[tuple[int, int]]]]:
        """A batch for the model, and each token's (start, end) characters ((0, 0): not of the text)."""
        batch = tokenizer(
            texts,
            truncation=True,
            max_length=max_length,
            padding=True,
            return_offsets_mapping=True,
            return_tensors="pt",
        )
        offsets = [[(int(a), int(b)) for a, b in row] for row in batch.pop("offset_mapping").tolist()]
        return batch.to(device), offsets

    def _targets(
        self, names: list[str], offsets: list[list[tuple[int, int]]], spans: list[list[Span]], device: str
    ) -> Any:
        import torch

        index = {name: i for i, name in enumerate(names)}
        return torch.tensor(
            [
                [IGNORED if tag is None else index[tag] for tag in bio_tags(row, found)]
                for row, found in zip(offsets, spans)
            ],
            device=device,
        )  # noqa: B905

    def _train(
        self,
        fit: SchemeFit[list[str]],
        train: list[tuple[str, list[Span]]],
        val: list[tuple[str, list[Span]]],
        progress: Progress,
    ) -> float:
        """The epochs over (text, spans) pairs (fine_tune.py); returns the last epoch's mean loss."""
        ctx = fit.ctx
        settings = self.settings or read_settings(ctx, INFO)

        def loss(forward: Any, chunk: list[tuple[str, list[Span]]]) -> Any:
            batch, offsets = self._batch(fit.preprocessor, [t for t, _ in chunk], settings.max_length, ctx.device)
            return forward(**batch, labels=self._targets(fit.head, offsets, [s for _, s in chunk], ctx.device)).loss

        return fit.tune(settings, progress, train, loss, lambda step: self._evaluate(fit, val, step))

    def _evaluate(self, fit: SchemeFit[list[str]], val: list[tuple[str, list[Span]]], step: int) -> None:
        """The val split's entity F1 (exact match) as a metric event."""
        if not val:
            return
        found = self._spans(fit, [t for t, _ in val])
        gold = {i: [{"start": s[0], "end": s[1], "label": s[2]} for s in spans] for i, (_, spans) in enumerate(val)}
        scores = score(gold, {i: spans for i, (spans, _) in enumerate(found)}, SPAN)
        fit.ctx.reporter.metric("val", fit.ctx.metric_name(fit.schema, "f1"), float(scores.get("f1") or 0.0), step)

    def _spans(self, fit: SchemeFit[list[str]], texts: list[str]) -> list[tuple[list[dict[str, Any]], float | None]]:
        """Each text's predicted spans (by *fit*'s tag names) and its least sure token decision."""
        import torch

        ctx, model = fit.ctx, fit.model
        settings = self.settings or read_settings(ctx, INFO)
        model.eval()
        out: list[tuple[list[dict[str, Any]], float | None]] = []
        for chunk in in_chunks(texts, settings.batch_size * 2):
            batch, offsets = self._batch(fit.preprocessor, chunk, settings.max_length, ctx.device)
            with torch.no_grad():
                rows = torch.softmax(model(**batch).logits.float(), dim=-1).cpu().tolist()
            out += [spans_from_tags(o, r, fit.head) for o, r in zip(offsets, rows)]  # noqa: B905
        return out

    def _model_for(self, ctx: RunContext, schema: SchemaSpec) -> tuple[Any, Any, list[str]]:
        if schema.name not in self._models:
            from transformers import AutoModelForTokenClassification, AutoTokenizer

            _, tokenizer, model = load_saved(ctx, schema, AutoTokenizer, AutoModelForTokenClassification)
            self.settings = self.settings or read_settings(ctx, INFO)
            fit_max_length(ctx, self.settings, tokenizer, model)  # predict without fit: a fresh process
            self._models[schema.name] = (
                tokenizer,
                model,
                [model.config.id2label[i] for i in range(model.config.num_labels)],
            )
        return self._models[schema.name]

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """Each item's spans, as the bare list Potato draws span prelabels from."""
        items = list(items)
        for schema in ctx.schemas:
            tokenizer, model, names = self._model_for(ctx, schema)
            found = self._spans(SchemeFit(ctx, schema, model, tokenizer, names), [item.text for item in items])
            for item, (spans, least) in zip(items, found):  # noqa: B905 - runs on 3.8/3.9
                yield Prediction(item.instance_id, schema.name, spans, least, bare=True)
