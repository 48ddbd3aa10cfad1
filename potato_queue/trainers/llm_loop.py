"""The training loop of ``hf-llm-lora``: one schema's model from load to saved adapter, resumable.

Steps are optimiser updates (``grad_accum_steps`` batches each). A checkpoint
holds the adapter and head, the optimiser, the schedule, the RNGs and the
position (schema, epoch, updates done in it); each epoch's order comes from
``seed + epoch``, so a resumed run skips exactly the batches it had done and
sees the rest in the same order.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from potato_queue.trainers import parallel
from potato_queue.trainers.common import slug
from potato_queue.trainers.hf_heads import Head, saved_head
from potato_queue.trainers.hub import explain_not_cached
from potato_queue.trainers.llm_parts import Precision
from potato_queue.trainers.llm_settings import LLMSettings
from potato_queue.wire.checkpoint import Checkpoint
from potato_queue.wire.scoring import score
from potato_queue.worker.api import RunContext
from potato_queue.worker.spec import SchemaSpec

__all__ = ["Plan", "SchemaLoop", "probabilities", "POSITION_FILE"]

POSITION_FILE = "position.json"  # in a checkpoint: where the loop stood, readable without torch


@dataclass
class Plan:
    """The whole run's updates across schemas: progress, loss metrics, ETA."""

    per_schema: dict[str, int]
    log_every: int
    started_s: float
    done: int = 0
    resumed_at: int = 0
    offsets: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        total = 0
        for name, steps in self.per_schema.items():
            self.offsets[name] = total
            total += steps
        self.total = total
        self.log_every = self.log_every or max(1, math.ceil(total / 1000.0))

    def advance(self, ctx: RunContext, schema: SchemaSpec, loss: float) -> None:
        self.done += 1
        rate_s = (time.monotonic() - self.started_s) / max(1, self.done - self.resumed_at)
        if self.done % self.log_every == 0 or self.done == self.total:
            ctx.reporter.metric("train", ctx.metric_name(schema, "loss"), loss, self.done)
        ctx.reporter.progress("train", self.done, self.total, rate_s * (self.total - self.done))


def _position(start: Checkpoint | None) -> dict[str, Any] | None:
    if start is None:
        return None
    with open(os.path.join(start.path, POSITION_FILE), encoding="utf-8") as fh:
        return dict(json.load(fh))


def _encode(tokenizer: Any, texts: list[str], max_length: int, device: str) -> Any:
    return tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt").to(device)


class SchemaLoop:
    """Load, adapt, train (resuming where a checkpoint says), evaluate and save one schema's model."""

    def __init__(
        self, ctx: RunContext, settings: LLMSettings, schema: SchemaSpec, head: Head, plan: Plan, offline: bool
    ) -> None:
        from potato_queue.trainers import llm_parts

        self.ctx, self.settings, self.schema, self.head, self.plan = ctx, settings, schema, head, plan
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
        position = _position(start)
        offset = self.plan.offsets[self.schema.name]
        if position is not None and position["step"] >= offset + self.plan.per_schema[self.schema.name]:
            return self._finished_before()
        loss = self._train(
            texts,
            [self.head.target(g) for g in gold],
            position if position and position["schema"] == self.schema.name else None,
            start,
        )
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
        self.plan.done += self.plan.per_schema[self.schema.name]
        self.plan.resumed_at = self.plan.done
        return {}

    def _optimizer(self, total: int) -> tuple[Any, Any]:
        import torch

        trainable = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            trainable, lr=self.settings.learning_rate, weight_decay=self.settings.weight_decay
        )
        warmup = int(total * self.settings.warmup_ratio)

        def factor(step: int) -> float:
            return (step + 1) / (warmup + 1) if step < warmup else max(0.0, (total - step) / max(1, total - warmup))

        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def _train(
        self, texts: list[str], targets: list[Any], position: dict[str, Any] | None, start: Checkpoint | None
    ) -> float:
        import torch

        from potato_queue.trainers import llm_parts

        s, ctx = self.settings, self.ctx
        batches = math.ceil(parallel.share(len(texts), ctx) / s.batch_size)
        self.updates_per_epoch = math.ceil(batches / s.grad_accum_steps)
        optimizer, scheduler = self._optimizer(s.epochs * self.updates_per_epoch)
        epoch0, update0 = 0, 0
        if position is not None and start is not None:
            llm_parts.load_state(start.path, self.model, optimizer, scheduler)
            epoch0, update0 = position["epoch"], position["update"]
            self.plan.done = self.plan.resumed_at = position["step"]
        self.rng = llm_parts.rng_state()
        scaler = torch.amp.GradScaler("cuda", enabled=self.precision.scale_loss)
        trained = parallel.wrap(self.model, ctx)
        losses: list[float] = []
        for epoch in range(epoch0, s.epochs):
            self.model.train()
            order = parallel.shard(
                torch.randperm(len(texts), generator=torch.Generator().manual_seed(s.seed + epoch)).tolist(), ctx
            )
            losses = []
            first = update0 * s.grad_accum_steps if epoch == epoch0 else 0
            for batch_index in range(first, batches):
                if ctx.should_stop():  # a preemption saves the state as of the last update, then stops
                    ctx.checkpoint(self.plan.done, self._writer(epoch, optimizer, scheduler))
                chunk = order[batch_index * s.batch_size : (batch_index + 1) * s.batch_size]
                batch = _encode(self.tokenizer, [texts[i] for i in chunk], s.max_length, ctx.device)
                labels = torch.tensor([targets[i] for i in chunk], device=ctx.device)
                with self.precision.autocast(ctx.device):
                    loss = trained(**batch, labels=labels).loss
                scaler.scale(loss / s.grad_accum_steps).backward()
                losses.append(float(loss.detach()))
                if (batch_index + 1) % s.grad_accum_steps == 0 or batch_index + 1 == batches:
                    self._update(optimizer, scheduler, scaler)
                    recent = losses[-s.grad_accum_steps :]
                    self.plan.advance(ctx, self.schema, sum(recent) / len(recent))
                    ctx.checkpoint(self.plan.done, self._writer(epoch, optimizer, scheduler))
            self._evaluate()
        return sum(losses) / len(losses) if losses else float("nan")

    def _update(self, optimizer: Any, scheduler: Any, scaler: Any) -> None:
        import torch

        from potato_queue.trainers import llm_parts

        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad()
        self.rng = llm_parts.rng_state()

    def _writer(self, epoch: int, optimizer: Any, scheduler: Any) -> Callable[[str], None]:
        """What ctx.checkpoint calls: the state as of the last update (a batch's pending gradients are
        not kept; the resumed run does that batch again)."""
        from potato_queue.trainers import llm_parts

        done_in_epoch = self.plan.done - self.plan.offsets[self.schema.name] - epoch * self.updates_per_epoch
        epoch, update = (epoch + 1, 0) if done_in_epoch >= self.updates_per_epoch else (epoch, done_in_epoch)
        position = {"schema": self.schema.name, "step": self.plan.done, "epoch": epoch, "update": update}
        rng = self.rng

        def write(folder: str) -> None:
            llm_parts.save_state(folder, self.model, optimizer, scheduler, position, rng)
            with open(os.path.join(folder, POSITION_FILE), "w", encoding="utf-8") as fh:
                json.dump(position, fh)

        return write

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

    def _evaluate(self) -> None:
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
        self.ctx.reporter.metric(
            "val", self.ctx.metric_name(self.schema, "loss"), total_loss / len(texts), self.plan.done
        )
        self.ctx.reporter.metric("val", self.ctx.metric_name(self.schema, "accuracy"), correct, self.plan.done)

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
