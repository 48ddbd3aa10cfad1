"""``majority-baseline``: predicts each schema's most frequent training label.

No packages beyond the standard library, so it runs on any host. It is the
floor a real model's held-out scores should beat, and the quickest way to
check that a backend works end to end (bundle, agent, events, predictions,
write-back) before spending GPU time. Confidence is the label's share of the
training labels. `hold_s` makes the run last that long before it counts (checking
for a stop every fifth of a second): a cheap long run, to try cancel, heartbeats,
max_wall_seconds and a backend's behaviour when something dies, without a GPU.
Each whole second held is a step: with ``checkpoint_every_steps`` it checkpoints
how long it has held, and a requeued or resumed run holds only the rest, which
is how preemption and resume are tried without torch.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import ClassVar

from potato_queue.trainers.common import labelled_texts, model_version, write_json
from potato_queue.trainers.registry import EVERY_MODALITY
from potato_queue.worker.api import SCORE_DIGITS, FitResult, Prediction, PredictItem, RunContext, Trainer

__all__ = ["MajorityBaselineTrainer", "MODEL_FILE"]

MODEL_FILE = "majority.json"
HELD_FILE = "held.json"  # in a checkpoint: the whole seconds held so far
MAX_HOLD_S = 86400
HOLD_TICK_S = 0.2


class MajorityBaselineTrainer(Trainer):
    name: ClassVar[str] = "majority-baseline"
    kinds: ClassVar[tuple[str, ...]] = ("nominal",)
    modalities: ClassVar[tuple[str, ...]] = EVERY_MODALITY  # it never reads the items

    def __init__(self) -> None:
        self._model: dict[str, dict[str, object]] = {}

    def validate(self, ctx: RunContext) -> list[str]:
        problems = super().validate(ctx)
        hold_s = ctx.params.get("hold_s") or 0
        if not isinstance(hold_s, (int, float)) or isinstance(hold_s, bool) or not 0 <= hold_s <= MAX_HOLD_S:
            problems.append(f"params.hold_s must be a number of seconds from 0 to {MAX_HOLD_S}, got {hold_s!r}")
        for schema in ctx.schemas:
            if not labelled_texts(ctx.bundle, "train", schema.name)[1]:
                problems.append(f"Schema '{schema.name}' has no labelled train item to count")
        return problems

    def fit(self, ctx: RunContext) -> FitResult:
        self._hold(ctx, float(ctx.params.get("hold_s") or 0))
        for index, schema in enumerate(ctx.schemas):
            ctx.check_stop(f"before counting {schema.name}")
            _, labels = labelled_texts(ctx.bundle, "train", schema.name)
            # Ties go to the label that sorts first, so the baseline is reproducible.
            counts = Counter(labels)
            label, count = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            self._model[schema.name] = {
                "label": label,
                "confidence": count / len(labels),
                "n_train": len(labels),
                "shares": {str(k): n / len(labels) for k, n in sorted(counts.items())},
            }
            ctx.reporter.progress("fit", index + 1, len(ctx.schemas))
        write_json(os.path.join(ctx.workdir, MODEL_FILE), self._model)
        first = self._model[ctx.schemas[0].name]
        return FitResult(
            model_version=model_version(self.name, ctx.spec.run_id),
            artifact_paths=[MODEL_FILE],
            metrics={
                ctx.metric_name(s, "train_majority_share"): float(self._model[s.name]["confidence"])  # type: ignore[arg-type]
                for s in ctx.schemas
            },
            label_order=[str(first["label"])],
            steps=len(ctx.schemas),
        )

    @staticmethod
    def _hold(ctx: RunContext, hold_s: float) -> None:
        """Wait hold_s, as a training would: progress in the train phase, a stop honoured at once, and a
        checkpoint of the seconds held (resumed from: a requeued job holds only the rest)."""
        start = ctx.resume_point() if hold_s else None
        held_s = 0
        if start is not None:
            with open(os.path.join(start.path, HELD_FILE), encoding="utf-8") as fh:
                held_s = int(json.load(fh)["held_s"])
        ends_s, total = time.monotonic() + hold_s - held_s, max(1, math.ceil(hold_s))
        while time.monotonic() < ends_s:
            left_s = ends_s - time.monotonic()
            step = total - math.ceil(left_s)
            ctx.checkpoint(
                step, lambda folder, step=step: write_json(os.path.join(folder, HELD_FILE), {"held_s": step})
            )
            ctx.reporter.progress("train", step, total, eta_s=left_s)
            time.sleep(min(HOLD_TICK_S, max(0.0, left_s)))

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        for item in items:
            for schema in ctx.schemas:
                guess = self._model[schema.name]
                shares: dict[str, float] = guess["shares"]  # type: ignore[assignment]
                # every item gets the train labels' shares as its scores: the baseline knows no more
                yield Prediction(
                    item.instance_id,
                    schema.name,
                    guess["label"],
                    float(guess["confidence"]),  # type: ignore[arg-type]
                    {k: round(v, SCORE_DIGITS) for k, v in shares.items()},
                )
