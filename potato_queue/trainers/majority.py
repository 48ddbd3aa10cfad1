"""``majority-baseline``: predicts each schema's most frequent training label.

No packages beyond the standard library, so it runs on any host. It is the
floor a real model's held-out scores should beat, and the quickest way to
check that a backend works end to end (bundle, agent, events, predictions,
write-back) before spending GPU time. Confidence is the label's share of the
training labels.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import ClassVar

from potato_queue.trainers.common import labelled_texts, model_version, write_json
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext, Trainer

__all__ = ["MajorityBaselineTrainer", "MODEL_FILE"]

MODEL_FILE = "majority.json"


class MajorityBaselineTrainer(Trainer):
    name: ClassVar[str] = "majority-baseline"
    kinds: ClassVar[tuple[str, ...]] = ("nominal",)

    def __init__(self) -> None:
        self._model: dict[str, dict[str, object]] = {}

    def validate(self, ctx: RunContext) -> list[str]:
        problems = super().validate(ctx)
        for schema in ctx.schemas:
            if not labelled_texts(ctx.bundle, "train", schema.name)[1]:
                problems.append(f"Schema '{schema.name}' has no labelled train item to count")
        return problems

    def fit(self, ctx: RunContext) -> FitResult:
        for index, schema in enumerate(ctx.schemas):
            ctx.check_stop(f"before counting {schema.name}")
            _, labels = labelled_texts(ctx.bundle, "train", schema.name)
            # Ties go to the label that sorts first, so the baseline is reproducible.
            counts = Counter(labels)
            label, count = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            self._model[schema.name] = {"label": label, "confidence": count / len(labels), "n_train": len(labels)}
            ctx.reporter.progress("fit", index + 1, len(ctx.schemas))
        write_json(os.path.join(ctx.workdir, MODEL_FILE), self._model)
        first = self._model[ctx.schemas[0].name]
        return FitResult(
            model_version=model_version(self.name, ctx.spec.run_id),
            artifact_paths=[MODEL_FILE],
            metrics={ctx.metric_name(s, "train_majority_share"): float(self._model[s.name]["confidence"])  # type: ignore[arg-type]
                     for s in ctx.schemas},
            label_order=[str(first["label"])],
            steps=len(ctx.schemas),
        )

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        for item in items:
            for schema in ctx.schemas:
                guess = self._model[schema.name]
                yield Prediction(item.instance_id, schema.name, guess["label"], float(guess["confidence"]))  # type: ignore[arg-type]
