"""``sklearn-text``: TF-IDF features and a logistic regression per schema.

Params: ``C`` (1.0), ``max_features`` (50000), ``ngram_max`` (2),
``class_weight`` (``"balanced"`` or null; default null), ``max_iter`` (1000).
Writes ``model.pkl`` (``{schema: fitted Pipeline}``, pickled) and
``model_card.json``. Confidence is the top class's probability.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from potato_queue.trainers.common import (
    labelled_texts,
    model_version,
    param,
    validate_nominal,
    write_json,
)
from potato_queue.trainers.registry import TRAINERS
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext, Trainer
from potato_queue.worker.errors import TrainerError, ValidationFailed
from potato_queue.worker.scoring import accuracy

__all__ = ["SklearnTextTrainer", "MODEL_FILE", "CARD_FILE"]

MODEL_FILE = "model.pkl"
CARD_FILE = "model_card.json"
PREDICT_BATCH = 512

INFO = TRAINERS["sklearn-text"]  # its params' defaults


class SklearnTextTrainer(Trainer):
    """TF-IDF + LogisticRegression, one pipeline per nominal schema."""

    name: ClassVar[str] = "sklearn-text"
    requires: ClassVar[tuple[str, ...]] = ("numpy", "sklearn")
    kinds: ClassVar[tuple[str, ...]] = ("nominal",)

    def __init__(self) -> None:
        self._models: dict[str, Any] = {}
        self._settings: dict[str, Any] = {}

    def _read_settings(self, ctx: RunContext) -> dict[str, Any]:
        class_weight = ctx.params.get("class_weight")
        if class_weight not in (None, "balanced"):
            raise ValidationFailed(f"params.class_weight must be 'balanced' or null, got {class_weight!r}")
        settings = {
            "C": param(ctx, "C", INFO.default("C"), float),
            "max_features": param(ctx, "max_features", INFO.default("max_features"), int),
            "ngram_max": param(ctx, "ngram_max", INFO.default("ngram_max"), int),
            "max_iter": param(ctx, "max_iter", INFO.default("max_iter"), int),
            "class_weight": class_weight,
        }
        if settings["C"] <= 0 or settings["max_features"] < 1 or not 1 <= settings["ngram_max"] <= 5:
            raise ValidationFailed("params need C > 0, max_features >= 1 and 1 <= ngram_max <= 5")
        return settings

    def validate(self, ctx: RunContext) -> list[str]:
        """Nominal schemas with two or more labels in train, and sane params."""
        self._settings = self._read_settings(ctx)
        return super().validate(ctx) or validate_nominal(ctx, min_train=2)

    def _pipeline(self, ctx: RunContext) -> Any:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import Pipeline

        s = self._settings or self._read_settings(ctx)
        return Pipeline(
            [
                ("tfidf", TfidfVectorizer(ngram_range=(1, s["ngram_max"]), max_features=s["max_features"], sublinear_tf=True)),
                ("clf", LogisticRegression(C=s["C"], max_iter=s["max_iter"], class_weight=s["class_weight"], random_state=ctx.spec.seed)),
            ]
        )

    def fit(self, ctx: RunContext) -> FitResult:
        """Fit one pipeline per schema; write model.pkl and model_card.json."""
        metrics: dict[str, float] = {}
        card: dict[str, Any] = {"trainer": self.name, "params": self._settings, "schemas": {}}
        for index, schema in enumerate(ctx.schemas):
            ctx.check_stop(f"before fitting {schema.name}")
            texts, labels = labelled_texts(ctx.bundle, "train", schema.name)
            ctx.reporter.status("running", f"fitting {schema.name} on {len(texts)} items")
            pipeline = self._pipeline(ctx)
            pipeline.fit(texts, labels)
            self._models[schema.name] = pipeline
            train_accuracy = accuracy(labels, [str(p) for p in pipeline.predict(texts)])
            ctx.reporter.metric("train", ctx.metric_name(schema, "accuracy"), train_accuracy, index + 1)
            ctx.reporter.progress("fit", index + 1, len(ctx.schemas))
            metrics[ctx.metric_name(schema, "train_accuracy")] = train_accuracy
            metrics[ctx.metric_name(schema, "n_train")] = float(len(texts))
            card["schemas"][schema.name] = {"label_order": self._classes(schema.name), "n_train": len(texts)}
        with open(os.path.join(ctx.workdir, MODEL_FILE), "wb") as fh:
            pickle.dump(self._models, fh, protocol=pickle.HIGHEST_PROTOCOL)
        write_json(os.path.join(ctx.workdir, CARD_FILE), card)
        return FitResult(
            model_version=model_version(self.name, ctx.spec.run_id),
            artifact_paths=[MODEL_FILE, CARD_FILE],
            metrics=metrics,
            label_order=self._classes(ctx.schemas[0].name),
            steps=len(ctx.schemas),
        )

    def _classes(self, schema: str) -> list[str]:
        return [str(c) for c in self._models[schema].classes_]

    def _load(self, ctx: RunContext) -> dict[str, Any]:
        if not self._models:
            path = os.path.join(ctx.workdir, MODEL_FILE)
            if not os.path.isfile(path):
                raise TrainerError(f"No fitted model at {path}")
            with open(path, "rb") as fh:
                self._models = pickle.load(fh)
        return self._models

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """The top class and its probability, per item and schema."""
        models = self._load(ctx)
        items = list(items)
        for schema in ctx.schemas:
            pipeline = models[schema.name]
            classes = [str(c) for c in pipeline.classes_]
            for start in range(0, len(items), PREDICT_BATCH):
                chunk = items[start : start + PREDICT_BATCH]
                probabilities = pipeline.predict_proba([item.text for item in chunk])
                for item, row in zip(chunk, probabilities):  # noqa: B905 - runs on 3.8/3.9
                    yield Prediction.top(item.instance_id, schema.name, classes, row)
