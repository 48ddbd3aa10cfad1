"""The fine-tune loop of the torch trainers (hf-text-, hf-token- and hf-image-classification, hf-llm-lora), once.

What the loop owns: the optimiser and its schedule (:func:`optimizer_for`: AdamW over the trainable
parameters, linear warmup then linear decay), DDP (parallel.wrap), each epoch's order (an :data:`Order`,
the same on every rank) and this rank's shard of it, the batches, the stop checks, the backward pass
(under autocast and through a loss scaler as a :class:`Precision` says, divided over ``accumulate``
batches an update), clipping to norm 1.0, the optimiser and schedule steps, the losses, the run's
:class:`Progress` (progress events, the train loss metric, the ETA) and the evaluation after each epoch.
A :class:`Resumable` loop (hf-llm-lora's) also saves checkpoints with their position (``ctx.checkpoint``:
every ``checkpoint_every_steps`` updates, and as of the last update when preempted) and resumes from one:
a resumed run skips exactly the batches it had done and sees the rest in the same order.

What the trainer supplies: its model (its head on it, LoRA or not), its train items, ``loss(forward,
items)`` (a batch of its items as a loss tensor, through ``forward``: the model or its DDP wrapper),
``evaluate(step)`` (its held-out metrics after each epoch), its :class:`Recipe` (its settings) and, when
resumable, how its weights are written into a checkpoint and read back.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, List, Protocol, TypeVar

from potato_queue.trainers import parallel
from potato_queue.trainers.llm_parts import Precision
from potato_queue.worker.api import RunContext
from potato_queue.worker.spec import SchemaSpec

__all__ = [
    "FineTune",
    "Recipe",
    "Progress",
    "Resumable",
    "Order",
    "one_stream",
    "seeded_by_epoch",
    "optimizer_for",
    "position_of",
    "POSITION_FILE",
]

T = TypeVar("T")
#: An epoch's order of n items: (n, epoch) -> a permutation of range(n), the same on every rank.
Order = Callable[[int, int], List[int]]
POSITION_FILE = "position.json"  # in a checkpoint: where the loop stood, readable without torch
STATE_FILE = "trainer_state.pt"  # in a checkpoint: the optimiser, the schedule, the RNGs, the position
WEIGHTS_FOLDER = "adapter"  # in a checkpoint: the trainer's weights (hf-llm-lora's adapter and head)
CLIP_NORM = 1.0


class Recipe(Protocol):
    """What the loop reads of a trainer's settings (hf_text_parts.HFSettings and llm_settings.LLMSettings)."""

    epochs: int
    batch_size: int
    learning_rate: float
    weight_decay: float
    warmup_ratio: float
    log_every: int


@dataclass
class Progress:
    """The whole run's optimiser updates across its schemas: progress events, the train loss metric, the ETA."""

    per_schema: dict[str, int]
    log_every: int = 0  # a loss metric every this many updates (0: about a thousand in the run)
    started_s: float = field(default_factory=time.monotonic)
    done: int = 0
    resumed_at: int = 0  # `done` when this process began: the ETA's rate counts only the updates it did
    offsets: dict[str, int] = field(default_factory=dict, init=False)  # the updates before each schema
    total: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        total = 0
        for name, updates in self.per_schema.items():
            self.offsets[name] = total
            total += updates
        self.total = total
        self.log_every = self.log_every or max(1, math.ceil(total / 1000.0))

    @classmethod
    def for_fit(cls, ctx: RunContext, sizes: dict[str, int], recipe: Recipe, accumulate: int = 1) -> Progress:
        """The counter of a fit over schemas of `sizes` train items each: every epoch's updates of this rank
        (`accumulate` batches each, the last of an epoch maybe fewer)."""
        return cls(
            {
                name: recipe.epochs * math.ceil(parallel.batches(n, recipe.batch_size, ctx) / accumulate)
                for name, n in sizes.items()
            },
            recipe.log_every,
        )

    def advance(self, ctx: RunContext, schema: SchemaSpec, loss: float) -> None:
        """One update more, whose loss (its batches' mean) was `loss`."""
        self.done += 1
        rate_s = (time.monotonic() - self.started_s) / max(1, self.done - self.resumed_at)
        if self.done % self.log_every == 0 or self.done == self.total:
            ctx.reporter.metric("train", ctx.metric_name(schema, "loss"), loss, self.done)
        ctx.reporter.progress("train", self.done, self.total, rate_s * (self.total - self.done))

    def resume_at(self, step: int) -> None:
        """A resumed run's counter: `step` updates were done before this process began."""
        self.done = self.resumed_at = step


def one_stream(seed: int) -> Order:
    """One generator seeded once, a permutation drawn from it each epoch in turn (the hf-*-classification
    trainers'): epoch e's is the (e+1)-th draw; asked in turn, each epoch draws once."""

    drawn: dict[str, Any] = {}  # the generator and how many epochs it has drawn, kept between epochs

    def order(n: int, epoch: int) -> list[int]:
        import torch

        if drawn.get("n") != n or drawn.get("epochs", 0) > epoch:  # a resumed or another loop: from the seed
            drawn.update(n=n, epochs=0, generator=torch.Generator().manual_seed(seed))
        while drawn["epochs"] < epoch:  # a resumed run's earlier epochs, drawn to reach this one
            torch.randperm(n, generator=drawn["generator"])
            drawn["epochs"] += 1
        drawn["epochs"] += 1
        return torch.randperm(n, generator=drawn["generator"]).tolist()

    return order


def seeded_by_epoch(seed: int) -> Order:
    """Each epoch's permutation from its own generator, seeded `seed + epoch` (hf-llm-lora's)."""

    def order(n: int, epoch: int) -> list[int]:
        import torch

        return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()

    return order


def optimizer_for(model: Any, recipe: Recipe, total_steps: int) -> tuple[Any, Any]:
    """AdamW over the trainable parameters, with linear warmup then linear decay over `total_steps` updates."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=recipe.learning_rate, weight_decay=recipe.weight_decay)
    warmup = int(total_steps * recipe.warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / float(warmup + 1)
        return max(0.0, (total_steps - step) / float(max(1, total_steps - warmup)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def position_of(checkpoint: str | None) -> dict[str, Any] | None:
    """Where the loop stood in a checkpoint folder: {schema, step, epoch, update}; None without one."""
    if checkpoint is None:
        return None
    with open(os.path.join(checkpoint, POSITION_FILE), encoding="utf-8") as fh:
        return dict(json.load(fh))


@dataclass(frozen=True)
class Resumable:
    """A loop that checkpoints. The trainer's weights are the trainer's to write (`save_weights(folder)`) and
    put back (`load_weights(folder)`); `start`: the checkpoint this schema resumes in (its position names
    the schema), or None."""

    save_weights: Callable[[str], None]
    load_weights: Callable[[str], None]
    start: str | None = None


class _Unscaled:
    """A GradScaler that scales nothing (fp32, bf16), as a disabled one does: torch.amp.GradScaler is torch
    2.3's, and the hf-*-classification trainers run on 2.1."""

    def scale(self, loss: Any) -> Any:
        return loss

    def unscale_(self, optimizer: Any) -> None:
        pass

    def step(self, optimizer: Any) -> None:
        optimizer.step()

    def update(self) -> None:
        pass


def _rng_state() -> dict[str, Any]:
    # Taken after each update: a checkpoint keeps its update's, so a resumed run draws the dropout masks a
    # run never stopped draws.
    import torch

    return {"python": random.getstate(), "torch": torch.get_rng_state()}


class FineTune(Generic[T]):
    """One schema's epochs over its train items (see the module's docstring for who does what)."""

    def __init__(
        self,
        ctx: RunContext,
        schema: SchemaSpec,
        model: Any,
        recipe: Recipe,
        progress: Progress,
        order: Order,
        accumulate: int = 1,
        precision: Precision | None = None,
        resumable: Resumable | None = None,
    ) -> None:
        self.ctx, self.schema, self.model, self.recipe = ctx, schema, model, recipe
        self.progress, self.order, self.accumulate = progress, order, accumulate
        self.precision, self.resumable = precision, resumable
        self.updates_per_epoch = 0
        self.rng: dict[str, Any] = {}

    def run(self, items: Sequence[T], loss: Callable[[Any, list[T]], Any], evaluate: Callable[[int], None]) -> float:
        """Train on `items` (from where the resumed checkpoint stood); the last epoch's mean batch loss (NaN
        when this process trained no batch of it)."""
        import torch

        ctx, size = self.ctx, self.recipe.batch_size
        batches = parallel.batches(len(items), size, ctx)
        self.updates_per_epoch = math.ceil(batches / self.accumulate)
        optimizer, scheduler = optimizer_for(self.model, self.recipe, self.recipe.epochs * self.updates_per_epoch)
        epoch0, update0 = self._resume(optimizer, scheduler)
        scaler = torch.amp.GradScaler("cuda") if self.precision and self.precision.scale_loss else _Unscaled()
        forward = parallel.wrap(self.model, ctx)
        losses: list[float] = []
        for epoch in range(epoch0, self.recipe.epochs):
            self.model.train()
            order = parallel.shard(self.order(len(items), epoch), ctx)
            losses = []
            for index in range(update0 * self.accumulate if epoch == epoch0 else 0, batches):
                self._check(epoch, optimizer, scheduler)
                with self._autocast():
                    value = loss(forward, [items[i] for i in order[index * size : (index + 1) * size]])
                scaler.scale(value / self.accumulate if self.accumulate > 1 else value).backward()
                losses.append(float(value.detach()))
                if (index + 1) % self.accumulate == 0 or index + 1 == batches:
                    self._update(optimizer, scheduler, scaler)
                    recent = losses[-self.accumulate :]
                    self.progress.advance(ctx, self.schema, sum(recent) / len(recent))
                    if self.resumable is not None:
                        ctx.checkpoint(self.progress.done, self._writer(self.resumable, epoch, optimizer, scheduler))
            evaluate(self.progress.done)
        return sum(losses) / len(losses) if losses else float("nan")

    def _autocast(self) -> Any:
        return self.precision.autocast(self.ctx.device) if self.precision is not None else contextlib.nullcontext()

    def _check(self, epoch: int, optimizer: Any, scheduler: Any) -> None:
        """Before each batch: a stop ends the loop here (a resumable one's preemption saves the state as of the
        last update first; the batches since are done again by the resumed run)."""
        if self.resumable is None:
            self.ctx.check_stop("during training")
        elif self.ctx.should_stop():
            self.ctx.checkpoint(self.progress.done, self._writer(self.resumable, epoch, optimizer, scheduler))

    def _update(self, optimizer: Any, scheduler: Any, scaler: Any) -> None:
        import torch

        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], CLIP_NORM)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad()
        if self.resumable is not None:
            self.rng = _rng_state()

    def _resume(self, optimizer: Any, scheduler: Any) -> tuple[int, int]:
        """(epoch, updates done in it) to start from: (0, 0), or where the resumed checkpoint stood, its state
        (weights, optimiser, schedule, RNGs) put back."""
        if self.resumable is None:
            return 0, 0
        start = self.resumable.start
        if start is not None:
            import torch

            self.resumable.load_weights(os.path.join(start, WEIGHTS_FOLDER))
            state = torch.load(os.path.join(start, STATE_FILE), weights_only=True)
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            random.setstate(state["rng"]["python"])
            torch.set_rng_state(state["rng"]["torch"])
        self.rng = _rng_state()
        position = position_of(start)
        if position is None:
            return 0, 0
        self.progress.resume_at(position["step"])
        return position["epoch"], position["update"]

    def _writer(self, resumable: Resumable, epoch: int, optimizer: Any, scheduler: Any) -> Callable[[str], None]:
        """What ctx.checkpoint calls: the state as of the last update (a batch's pending gradients are not
        kept; the resumed run does that batch again)."""
        progress = self.progress
        done_in_epoch = progress.done - progress.offsets[self.schema.name] - epoch * self.updates_per_epoch
        epoch, update = (epoch + 1, 0) if done_in_epoch >= self.updates_per_epoch else (epoch, done_in_epoch)
        position = {"schema": self.schema.name, "step": progress.done, "epoch": epoch, "update": update}
        rng = self.rng

        def write(folder: str) -> None:
            import torch

            resumable.save_weights(os.path.join(folder, WEIGHTS_FOLDER))
            state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
            torch.save({**state, "position": position, "rng": rng}, os.path.join(folder, STATE_FILE))
            with open(os.path.join(folder, POSITION_FILE), "w", encoding="utf-8") as fh:
                json.dump(position, fh)

        return write
