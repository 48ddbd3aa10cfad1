"""The training of ``hf-llm-lora``: one schema's model from load to saved adapter, resumable.

Its epochs are fine_tune.py's loop, resumable: steps are optimiser updates
(``grad_accum_steps`` batches each), a checkpoint holds the adapter and head
(written and read back here), the optimiser, the schedule, the RNGs and the
position (schema, epoch, updates done in it); each epoch's order comes from
``seed + epoch``, so a resumed run skips exactly the batches it had done and
sees the rest in the same order.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

from potato_queue.trainers.common import slug
from potato_queue.trainers.fine_tune import FineTune, Progress, Resumable, position_of, seeded_by_epoch
from potato_queue.trainers.hf_heads import Head, saved_head
from potato_queue.trainers.hub import explain_not_cached
from potato_queue.trainers.llm_parts import Precision
from potato_queue.trainers.llm_settings import LLMSettings
from potato_queue.wire.checkpoint import Checkpoint
from potato_queue.wire.scoring import score
from potato_queue.worker.api import RunContext
from potato_queue.worker.spec import SchemaSpec

__all__ = ["SchemaLoop", "probabilities"]


def _encode(tokenizer: Any, texts: list[str], max_length: int, device: str) -> Any:
    return tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt").to(device)


class SchemaLoop:
    """Load, adapt, train (resuming where a checkpoint says), evaluate and save one schema's model."""

    def __init__(
        self,
        ctx: RunContext,
        settings: LLMSettings,
        schema: SchemaSpec,
        head: Head,
        progress: Progress,
        offline: bool,
    ) -> None:
        from potato_queue.trainers import llm_parts

        self.ctx, self.settings, self.schema, self.head, self.progress = ctx, settings, schema, head, progress
        self.folder = os.path.join(ctx.workdir, slug(schema.name))
        self.precision = llm_parts.precision_for(settings.precision, ctx.device)
        self.four_bit = settings.load_in_4bit == "true" or (
            settings.load_in_4bit == "auto" and ctx.device.startswith("cuda") and llm_parts.has_bitsandbytes()
        )
        ctx.reporter.status(
            "running", f"loading {settings.model_name} for {schema.name}" + (" in 4-bit" if self.four_bit else "")
        )
        with explain_not_cached(settings, offline):
            self.tokenizer, base = llm_parts.load_classifier(
                settings.load_from,
                head.outputs,
                ctx.device,
                self.four_bit,
                offline or settings.local_model,
                head.problem_type,
            )
        if settings.gradient_checkpointing and not self.four_bit:  # prepare_model_for_kbit_training did it
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        base.config.use_cache = False
        self.model, self.targets = llm_parts.apply_lora(base, settings.lora, ctx.reporter.log)
        self.truncated = 0

    def run(self, texts: list[str], gold: list[Any], start: Checkpoint | None) -> dict[str, float]:
        """Train from the start or from `start` (`gold`: each text's answer, a label or a multiselect's set);
        returns this schema's train metrics."""
        from potato_queue.trainers import llm_parts

        self.truncated = llm_parts.count_truncated(self.tokenizer, texts, self.settings.max_length)
        if self.truncated:
            self.ctx.reporter.log(
                "warning",
                f"{self.truncated} of {len(texts)} train items for {self.schema.name} are "
                f"longer than max_length ({self.settings.max_length} tokens) and were cut to it",
            )
        position = position_of(start.path if start is not None else None)
        end = self.progress.offsets[self.schema.name] + self.progress.per_schema[self.schema.name]
        if position is not None and position["schema"] != self.schema.name and position["step"] >= end:
            return self._finished_before()
        # A checkpoint of this schema's resumes here, even one of its last update (saved before its model was).
        ours = (
            start.path
            if start is not None and position is not None and position["schema"] == self.schema.name
            else None
        )
        loss = self._train(texts, [self.head.target(g) for g in gold], ours)
        if self.head.tunes:
            val_texts, val_answers = self._val()
            self.head.tune(self._rows(val_texts), val_answers)
        self._save()
        return {
            self.ctx.metric_name(self.schema, "train_loss"): loss,
            self.ctx.metric_name(self.schema, "n_train"): float(len(texts)),
        }

    def _finished_before(self) -> dict[str, float]:
        """A schema trained whole before the run was preempted: its saved adapter is loaded back."""
        from potato_queue.trainers import llm_parts

        llm_parts.load_adapter(self.model, self.folder)
        self.head = saved_head(self.folder, self.model.config)  # a multiselect's thresholds, chosen then
        self.progress.resume_at(self.progress.done + self.progress.per_schema[self.schema.name])
        return {}

    def _train(self, texts: list[str], targets: list[Any], start: str | None) -> float:
        """fine_tune.py's loop over (text, target) pairs, from the checkpoint folder `start` of this schema if
        one; returns the last epoch's mean loss."""
        import torch

        from potato_queue.trainers import llm_parts

        s, ctx, model = self.settings, self.ctx, self.model

        def loss(forward: Any, chunk: list[tuple[str, Any]]) -> Any:
            batch = _encode(self.tokenizer, [t for t, _ in chunk], s.max_length, ctx.device)
            return forward(**batch, labels=torch.tensor([y for _, y in chunk], device=ctx.device)).loss

        resumable = Resumable(model.save_pretrained, lambda folder: llm_parts.load_adapter(model, folder), start)
        loop: FineTune[tuple[str, Any]] = FineTune(
            ctx,
            self.schema,
            model,
            s,
            self.progress,
            seeded_by_epoch(s.seed),
            accumulate=s.grad_accum_steps,
            precision=self.precision,
            resumable=resumable,
        )
        return loop.run(list(zip(texts, targets)), loss, self._evaluate)  # noqa: B905 - runs on 3.8/3.9

    def _val(self) -> tuple[list[str], list[Any]]:
        """The val texts and answers the head has outputs for."""
        texts, answers = self.head.read(self.ctx.bundle, "val", self.schema.name)
        kept = [(t, a) for t, a in zip(texts, answers) if self.head.target(a) is not None]  # noqa: B905
        return [t for t, _ in kept], [a for _, a in kept]

    def _rows(self, texts: list[str]) -> list[list[float]]:
        rows: list[list[float]] = []
        for _chunk, found in probabilities(
            self.ctx, self.settings, self.precision, self.tokenizer, self.model, texts, self.head
        ):
            rows += found
        return rows

    def _evaluate(self, step: int) -> None:
        """Held-out val loss (cross-entropy; a multiselect's mean binary one) and accuracy (a multiselect's: the
        whole set right) as metric events, after each epoch."""
        texts, answers = self._val()
        if not texts:
            return
        rows = self._rows(texts)
        total_loss = 0.0
        for row, answer in zip(rows, answers):  # noqa: B905 - runs on 3.8/3.9
            target = self.head.target(answer)
            if isinstance(target, list):
                total_loss -= sum(math.log(max(p if y else 1.0 - p, 1e-12)) for p, y in zip(row, target)) / len(row)  # noqa: B905
            else:
                total_loss -= math.log(max(float(row[target]), 1e-12))
        predicted = {i: self.head.prediction("", self.schema.name, row).label for i, row in enumerate(rows)}
        correct = score(dict(enumerate(answers)), predicted, self.head.kind)["accuracy"] or 0.0
        self.ctx.reporter.metric("val", self.ctx.metric_name(self.schema, "loss"), total_loss / len(texts), step)
        self.ctx.reporter.metric("val", self.ctx.metric_name(self.schema, "accuracy"), correct, step)

    def _save(self) -> None:
        """The adapter and head (small: what is copied back), or with merge the full merged model."""
        if not self.ctx.main_rank:
            return
        model = self.model
        if self.settings.merge:
            if self.four_bit:
                self.ctx.reporter.log(
                    "info",
                    "merging the adapter into 4-bit base weights rounds them: the merged "
                    "model is saved in the compute precision",
                )
            model = model.merge_and_unload()
        model.save_pretrained(self.folder)
        self.tokenizer.save_pretrained(self.folder)
        self.head.save(self.folder)


def probabilities(
    ctx: RunContext,
    settings: LLMSettings,
    precision: Precision,
    tokenizer: Any,
    model: Any,
    texts: list[str],
    head: Head,
) -> Iterator[tuple[list[int], list[list[float]]]]:
    """The head's rows for `texts` (softmax; a multiselect's sigmoids), a batch at a time: (the batch's indexes,
    its rows)."""
    import torch

    model.eval()
    size = settings.batch_size * 2
    for begin in range(0, len(texts), size):
        ctx.check_stop("while predicting")
        with torch.no_grad(), precision.autocast(ctx.device):
            logits = model(**_encode(tokenizer, texts[begin : begin + size], settings.max_length, ctx.device)).logits
        yield list(range(begin, min(begin + size, len(texts)))), head.activate(logits.float())
    model.train()
