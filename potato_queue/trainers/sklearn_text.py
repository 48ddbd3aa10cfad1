"""``sklearn-text``: TF-IDF features and a logistic regression per schema.

Params: ``C`` (1.0), ``max_features`` (50000), ``ngram_max`` (2),
``class_weight`` (``"balanced"`` or null; default null), ``max_iter`` (1000).
Writes ``model.pkl`` (``{schema: fitted model}``, pickled) and
``model_card.json``. A nominal scheme's model is a Pipeline, and its
confidence the top class's probability. A multilabel scheme's (a
multiselect) is a MultiLabelModel: one logistic regression per label on the
same TF-IDF features, each label's threshold chosen on val
(trainers/multilabel.py).
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
    write_json,
)
from potato_queue.trainers.multilabel import (
    choose_thresholds,
    labelled_sets,
    set_prediction,
    validate_by_kind,
)
from potato_queue.trainers.registry import TRAINERS
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext, Trainer
from potato_queue.worker.errors import TrainerError, ValidationFailed
from potato_queue.worker.scoring import MULTILABEL, accuracy, score

__all__ = ["SklearnTextTrainer", "MODEL_FILE", "CARD_FILE"]

MODEL_FILE = "model.pkl"
CARD_FILE = "model_card.json"
PREDICT_BATCH = 512

INFO = TRAINERS["sklearn-text"]  # its params' defaults


class SklearnTextTrainer(Trainer):
    """TF-IDF + LogisticRegression, one pipeline per nominal schema."""

    name: ClassVar[str] = "sklearn-text"
    requires: ClassVar[tuple[str, ...]] = ("numpy", "sklearn")
    kinds: ClassVar[tuple[str, ...]] = ("nominal", MULTILABEL)

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
        """Nominal and multilabel schemas with two or more labels and train items, and sane params."""
        self._settings = self._read_settings(ctx)
        return super().validate(ctx) or validate_by_kind(ctx, min_train=2)

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
            if schema.kind == MULTILABEL:
                n_train, train_accuracy, entry = self._fit_multilabel(ctx, schema.name)
            else:
                n_train, train_accuracy, entry = self._fit_nominal(ctx, schema.name)
            ctx.reporter.metric("train", ctx.metric_name(schema, "accuracy"), train_accuracy, index + 1)
            ctx.reporter.progress("fit", index + 1, len(ctx.schemas))
            metrics[ctx.metric_name(schema, "train_accuracy")] = train_accuracy
            metrics[ctx.metric_name(schema, "n_train")] = float(n_train)
            card["schemas"][schema.name] = {"kind": schema.kind or "nominal", "n_train": n_train, **entry}
        with open(os.path.join(ctx.workdir, MODEL_FILE), "wb") as fh:
            pickle.dump(self._models, fh, protocol=pickle.HIGHEST_PROTOCOL)
        write_json(os.path.join(ctx.workdir, CARD_FILE), card)
        return FitResult(
            model_version=model_version(self.name, ctx.spec.run_id),
            artifact_paths=[MODEL_FILE, CARD_FILE],
            metrics=metrics,
            label_order=card["schemas"][ctx.schemas[0].name]["label_order"],
            steps=len(ctx.schemas),
        )

    def _fit_nominal(self, ctx: RunContext, schema: str) -> tuple[int, float, dict[str, Any]]:
        texts, labels = labelled_texts(ctx.bundle, "train", schema)
        ctx.reporter.status("running", f"fitting {schema} on {len(texts)} items")
        pipeline = self._pipeline(ctx)
        pipeline.fit(texts, labels)
        self._models[schema] = pipeline
        train_accuracy = accuracy(labels, [str(p) for p in pipeline.predict(texts)])
        return len(texts), train_accuracy, {"label_order": self._classes(schema)}

    def _fit_multilabel(self, ctx: RunContext, schema: str) -> tuple[int, float, dict[str, Any]]:
        """One logistic regression per label on shared TF-IDF features; thresholds from val."""
        texts, sets = labelled_sets(ctx.bundle, "train", schema)
        ctx.reporter.status("running", f"fitting {schema} on {len(texts)} items, one classifier per label")
        pipeline = self._pipeline(ctx)
        model = MultiLabelModel(ctx.bundle.labels(schema), pipeline.steps[0][1], pipeline.steps[1][1])
        model.fit(texts, sets)
        val_texts, val_sets = labelled_sets(ctx.bundle, "val", schema)
        if val_texts:
            model.thresholds = choose_thresholds(model.labels, model.probabilities(val_texts), val_sets)
        self._models[schema] = model
        train = score(dict(enumerate(sets)), dict(enumerate(model.predict_sets(texts))), MULTILABEL)
        return len(texts), float(train["accuracy"]), {"label_order": model.labels, "thresholds": model.thresholds,
                                                      "constant_labels": sorted(model.constant)}

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
            model = models[schema.name]
            for start in range(0, len(items), PREDICT_BATCH):
                chunk = items[start : start + PREDICT_BATCH]
                if isinstance(model, MultiLabelModel):
                    rows = model.probabilities([item.text for item in chunk])
                    for item, row in zip(chunk, rows):  # noqa: B905 - runs on 3.8/3.9
                        yield set_prediction(item.instance_id, schema.name, model.labels, row, model.thresholds)
                    continue
                classes = [str(c) for c in model.classes_]
                probabilities = model.predict_proba([item.text for item in chunk])
                for item, row in zip(chunk, probabilities):  # noqa: B905 - runs on 3.8/3.9
                    yield Prediction.top(item.instance_id, schema.name, classes, row)


class MultiLabelModel:
    """TF-IDF features and one logistic regression per label; a label every train item has (or none has)
    is that constant, since a classifier needs both answers to learn one. Pickled into model.pkl."""

    def __init__(self, labels: list[str], vectorizer: Any, classifier: Any) -> None:
        self.labels, self.vectorizer, self.template = list(labels), vectorizer, classifier
        self.models: dict[str, Any] = {}
        self.constant: dict[str, float] = {}
        self.thresholds: dict[str, float] = {}

    def fit(self, texts: list[str], sets: list[list[str]]) -> None:
        from sklearn.base import clone

        features = self.vectorizer.fit_transform(texts)
        for label in self.labels:
            answers = [int(label in chosen) for chosen in sets]
            if len(set(answers)) < 2:
                self.constant[label] = float(answers[0]) if answers else 0.0
                continue
            self.models[label] = clone(self.template).fit(features, answers)

    def probabilities(self, texts: list[str]) -> list[list[float]]:
        """One row per text: each label's probability, in `labels` order."""
        features = self.vectorizer.transform(texts)
        columns = [[self.constant[label]] * len(texts) if label in self.constant
                   else [float(p) for p in self.models[label].predict_proba(features)[:, 1]] for label in self.labels]
        return [[column[i] for column in columns] for i in range(len(texts))]

    def predict_sets(self, texts: list[str]) -> list[list[str]]:
        return [set_prediction("", "", self.labels, row, self.thresholds).label for row in self.probabilities(texts)]
