"""``sklearn-text``: TF-IDF features and a logistic regression per schema.

Params: ``C`` (1.0), ``max_features`` (50000), ``ngram_max`` (2),
``class_weight`` (``"balanced"`` or null; default null), ``max_iter`` (1000).
Writes ``model.pkl`` (``{schema: fitted model}``, pickled) and
``model_card.json``. A nominal scheme's model is a Pipeline, and its
confidence the top class's probability. A multilabel scheme's (a
multiselect) is a MultiLabelModel: one logistic regression per label on the
same TF-IDF features, each label's threshold chosen on val
(trainers/multilabel.py). An ordinal scheme's (a likert) is a ScaleModel
over the same MultiLabelModel, one logistic regression per "above point k"
(trainers/scales.py); a continuous scheme's (a slider) a ScaleModel over a
ridge regression (``alpha`` = 1 / C) on the TF-IDF features.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from potato_queue.trainers.common import (
    CARD_FILE,
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
from potato_queue.trainers.pairs import PairFeatures, is_pairwise, model_input
from potato_queue.trainers.registry import TRAINERS
from potato_queue.trainers.scales import OrdinalScale, Scale, labelled_values, scale_for, validate_scales
from potato_queue.wire.scoring import MULTILABEL, ORDINAL, SCALE_KINDS, accuracy, score
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext, Trainer
from potato_queue.worker.errors import TrainerError, ValidationFailed

__all__ = ["SklearnTextTrainer", "MODEL_FILE"]

MODEL_FILE = "model.pkl"
PREDICT_BATCH = 512

INFO = TRAINERS["sklearn-text"]  # its params' defaults


class SklearnTextTrainer(Trainer):
    """TF-IDF + LogisticRegression, one pipeline per nominal schema."""

    name: ClassVar[str] = "sklearn-text"
    requires: ClassVar[tuple[str, ...]] = ("numpy", "sklearn")
    kinds: ClassVar[tuple[str, ...]] = ("nominal", MULTILABEL, ORDINAL, "continuous")

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
        """Nominal and multilabel schemas with two or more labels and train items, scales with two answers
        or more on them, and sane params."""
        self._settings = self._read_settings(ctx)
        return super().validate(ctx) or validate_by_kind(ctx, min_train=2) + validate_scales(ctx, min_train=2)

    def _pipeline(self, ctx: RunContext, paired: bool = False) -> Any:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import Pipeline

        s = self._settings or self._read_settings(ctx)
        tfidf = TfidfVectorizer(ngram_range=(1, s["ngram_max"]), max_features=s["max_features"], sublinear_tf=True)
        return Pipeline(
            [
                ("tfidf", PairFeatures(tfidf) if paired else tfidf),
                (
                    "clf",
                    LogisticRegression(
                        C=s["C"], max_iter=s["max_iter"], class_weight=s["class_weight"], random_state=ctx.spec.seed
                    ),
                ),
            ]
        )

    def fit(self, ctx: RunContext) -> FitResult:
        """Fit one pipeline per schema; write model.pkl and model_card.json."""
        metrics: dict[str, float] = {}
        card: dict[str, Any] = {"trainer": self.name, "params": self._settings, "schemas": {}}
        for index, schema in enumerate(ctx.schemas):
            ctx.check_stop(f"before fitting {schema.name}")
            if schema.kind == MULTILABEL:
                n_train, train_score, entry = self._fit_multilabel(ctx, schema.name)
            elif schema.kind in SCALE_KINDS:
                n_train, train_score, entry = self._fit_scale(ctx, schema)
            else:
                n_train, train_score, entry = self._fit_nominal(ctx, schema.name, is_pairwise(schema))
            measure = "mae" if schema.kind == "continuous" else "accuracy"  # a slider's answers are never exact
            ctx.reporter.metric("train", ctx.metric_name(schema, measure), train_score, index + 1)
            ctx.reporter.progress("fit", index + 1, len(ctx.schemas))
            metrics[ctx.metric_name(schema, f"train_{measure}")] = train_score
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

    def _fit_nominal(self, ctx: RunContext, schema: str, paired: bool) -> tuple[int, float, dict[str, Any]]:
        texts, labels = labelled_texts(ctx.bundle, "train", schema, paired)
        ctx.reporter.status("running", f"fitting {schema} on {len(texts)} {'pairs' if paired else 'items'}")
        pipeline = self._pipeline(ctx, paired)
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
        return (
            len(texts),
            float(train["accuracy"]),
            {"label_order": model.labels, "thresholds": model.thresholds, "constant_labels": sorted(model.constant)},
        )

    def _fit_scale(self, ctx: RunContext, schema: Any) -> tuple[int, float, dict[str, Any]]:
        """An ordinal scheme's "above point k" classifiers, or a continuous one's ridge regression; the train
        score is the exact accuracy (ordinal) or the MAE (continuous) on train."""
        scale = scale_for(ctx, schema)
        texts, answers = labelled_values(ctx.bundle, "train", schema.name, is_pairwise(schema))
        ctx.reporter.status("running", f"fitting {schema.name}'s scale on {len(texts)} items")
        model = ScaleModel(scale, self._pipeline(ctx, is_pairwise(schema)), self._settings)
        texts = model.fit(texts, answers)
        self._models[schema.name] = model
        predicted = [p.label for p in model.predictions(["" for _ in texts], "", texts)]
        gold = [answers[i] for i in model.kept]
        train = score(dict(enumerate(gold)), dict(enumerate(predicted)), scale.kind, getattr(scale, "points", None))
        measure = "accuracy" if isinstance(scale, OrdinalScale) else "mae"
        return (
            len(texts),
            float(train[measure] or 0.0),
            {"label_order": [str(p) for p in getattr(scale, "points", [])], "scale": scale.to_dict()},
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
            model, paired = models[schema.name], is_pairwise(schema)
            for start in range(0, len(items), PREDICT_BATCH):
                chunk = items[start : start + PREDICT_BATCH]
                inputs = [model_input(item.row, paired) for item in chunk]
                if isinstance(model, ScaleModel):
                    yield from model.predictions([item.instance_id for item in chunk], schema.name, inputs)
                    continue
                if isinstance(model, MultiLabelModel):
                    rows = model.probabilities(inputs)
                    for item, row in zip(chunk, rows):  # noqa: B905 - runs on 3.8/3.9
                        yield set_prediction(item.instance_id, schema.name, model.labels, row, model.thresholds)
                    continue
                classes = [str(c) for c in model.classes_]
                probabilities = model.predict_proba(inputs)
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
        columns = [
            [self.constant[label]] * len(texts)
            if label in self.constant
            else [float(p) for p in self.models[label].predict_proba(features)[:, 1]]
            for label in self.labels
        ]
        return [[column[i] for column in columns] for i in range(len(texts))]

    def predict_sets(self, texts: list[str]) -> list[list[str]]:
        return [set_prediction("", "", self.labels, row, self.thresholds).label for row in self.probabilities(texts)]


class ScaleModel:
    """A scale's model: an ordinal scheme's "above point k" logistic regressions (a MultiLabelModel over the
    K-1 yes/no answers), or a continuous one's ridge regression on standardised answers; both on TF-IDF
    features. Pickled into model.pkl."""

    def __init__(self, scale: Scale, pipeline: Any, settings: dict[str, Any]) -> None:
        from sklearn.linear_model import Ridge

        self.scale = scale
        vectorizer, classifier = pipeline.steps[0][1], pipeline.steps[1][1]
        if isinstance(scale, OrdinalScale):
            self.model: Any = MultiLabelModel(scale.outputs, vectorizer, classifier)
        else:
            self.vectorizer, self.model = vectorizer, Ridge(alpha=1.0 / float(settings.get("C") or 1.0))
        self.kept: list[int] = []

    def fit(self, texts: list[str], answers: list[Any]) -> list[str]:
        """Fit on the answers that are on the scale; returns their texts (`kept`: their positions)."""
        if isinstance(self.scale, OrdinalScale):
            targets = [self.scale.target(a) for a in answers]
            self.kept = [i for i, t in enumerate(targets) if t is not None]
            kept = [texts[i] for i in self.kept]
            outputs = self.scale.outputs
            self.model.fit(kept, [[outputs[k] for k, yes in enumerate(targets[i] or []) if yes] for i in self.kept])
            return kept
        values = [self.scale.standard(a) for a in answers]
        self.kept = [i for i, v in enumerate(values) if v is not None]
        kept = [texts[i] for i in self.kept]
        self.model.fit(self.vectorizer.fit_transform(kept), [values[i] for i in self.kept])
        return kept

    def predictions(self, ids: list[str], schema: str, texts: list[str]) -> Iterator[Prediction]:
        if isinstance(self.scale, OrdinalScale):
            for item, above in zip(ids, self.model.probabilities(texts)):  # noqa: B905 - runs on 3.8/3.9
                yield self.scale.prediction(item, schema, above)
            return
        for item, value in zip(ids, self.model.predict(self.vectorizer.transform(texts))):  # noqa: B905
            yield self.scale.prediction(item, schema, float(value))
