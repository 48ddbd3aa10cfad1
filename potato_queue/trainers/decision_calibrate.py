"""``decision-calibrate``: recalibrate the latest run's confidences, no retraining.

Params: ``base_predictions``, the path of the latest successful run's
predictions.jsonl (on the annotation server, hence local only). Per schema,
a temperature is fitted on the bundle's val items (gold label vs the base
prediction) and applied to every val, test and unlabeled item the base file
predicted; labels never change. Writes ``calibration.json``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from potato_queue.trainers import temperature
from potato_queue.trainers.common import model_version, nominal_target, schema_labels, write_json
from potato_queue.trainers.registry import EVERY_MODALITY
from potato_queue.wire.files import JsonLineError, read_jsonl
from potato_queue.worker.api import FitResult, Prediction, PredictItem, RunContext, Trainer
from potato_queue.worker.bundle import PREDICT_SPLITS
from potato_queue.worker.errors import ValidationFailed
from potato_queue.worker.spec import SchemaSpec

__all__ = ["DecisionCalibrateTrainer", "read_base_predictions", "CALIBRATION_FILE"]

CALIBRATION_FILE = "calibration.json"


def _parse_record(path: str, number: int, record: Any) -> tuple[tuple[str, str], tuple[Any, float | None]]:
    try:
        payload = record.get("payload") or {}
        label = payload.get("label") if isinstance(payload, dict) else None
        confidence = record.get("confidence")
        if confidence is None and isinstance(payload, dict):
            confidence = payload.get("confidence")
        key = (str(record["schema_name"]), str(record["instance_id"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValidationFailed(f"{path} line {number} is not a prediction line: {exc}") from exc
    return key, (label, None if confidence is None else float(confidence))


def read_base_predictions(path: str) -> dict[tuple[str, str], tuple[Any, float | None]]:
    """``{(schema, instance_id): (label, confidence)}`` from a predictions.jsonl."""
    found: dict[tuple[str, str], tuple[Any, float | None]] = {}
    try:
        for number, record in read_jsonl(path):
            key, value = _parse_record(path, number, record)
            found[key] = value
    except OSError as exc:
        raise ValidationFailed(f"Could not read params.base_predictions {path}: {exc}") from exc
    except JsonLineError as exc:
        raise ValidationFailed(f"{path} line {exc.line} is not a prediction line: {exc.reason}") from exc
    return found


class DecisionCalibrateTrainer(Trainer):
    """Temperature scaling of a previous run's confidences, fitted on val."""

    name: ClassVar[str] = "decision-calibrate"
    requires: ClassVar[tuple[str, ...]] = ()
    kinds: ClassVar[tuple[str, ...]] = ("nominal",)
    modalities: ClassVar[tuple[str, ...]] = EVERY_MODALITY  # it never reads the items
    learns_from_train: ClassVar[bool] = False  # fitted on val: a learning curve would be flat

    def __init__(self) -> None:
        self._base: dict[tuple[str, str], tuple[Any, float | None]] = {}
        self._fitted: dict[str, dict[str, Any]] = {}

    def validate(self, ctx: RunContext) -> list[str]:
        """A readable base predictions file that covers the run's schemas."""
        problems = super().validate(ctx)
        path = ctx.params.get("base_predictions")
        if not isinstance(path, str) or not path:
            return problems + ["params.base_predictions (the latest run's predictions.jsonl) is required"]
        self._base = read_base_predictions(os.path.expanduser(path))
        covered = {schema for schema, _ in self._base}
        for schema in ctx.schemas:
            if schema.name not in covered:
                problems.append(f"The base predictions have nothing for schema '{schema.name}'")
        return problems

    def _samples(self, ctx: RunContext, schema: SchemaSpec) -> list[tuple[float, bool]]:
        """``(base confidence, base label is right)`` for each val item with gold and a base prediction."""
        samples: list[tuple[float, bool]] = []
        for row in ctx.bundle.read_split("val"):
            gold = nominal_target(row, schema.name)
            label, confidence = self._base.get((schema.name, str(row["instance_id"])), (None, None))
            if gold is not None and confidence is not None:
                samples.append((confidence, str(label) == gold))
        return samples

    def _fit_schema(self, ctx: RunContext, schema: SchemaSpec) -> dict[str, Any]:
        k = max(2, len(schema_labels(ctx, schema)))
        samples = self._samples(ctx, schema)
        t = temperature.fit_temperature(samples, k)
        calibrated = [(temperature.scaled_confidence(p, k, t), c) for p, c in samples]
        fitted = {
            "temperature": t,
            "n_labels": k,
            "n_val": len(samples),
            "nll_before": temperature.nll(samples, k),
            "nll_after": temperature.nll(samples, k, t),
            "ece_before": temperature.expected_calibration_error(samples),
            "ece_after": temperature.expected_calibration_error(calibrated),
        }
        if not samples:
            ctx.reporter.log(
                "warning", f"No val item has both a gold label and a base prediction for '{schema.name}'; keeping T=1"
            )
        for name in ("temperature", "nll_before", "nll_after", "ece_before", "ece_after"):
            ctx.reporter.metric("val", ctx.metric_name(schema, name), fitted[name], 1)
        return fitted

    def _outside_predict_splits(self, ctx: RunContext) -> int:
        """How many base predictions name items that are not in val, test or unlabeled."""
        wanted = {str(row["instance_id"]) for split in PREDICT_SPLITS for row in ctx.bundle.read_split(split)}
        return sum(1 for _, instance_id in self._base if instance_id not in wanted)

    def fit(self, ctx: RunContext) -> FitResult:
        """Fit one temperature per schema; write calibration.json."""
        metrics: dict[str, float] = {}
        for schema in ctx.schemas:
            ctx.check_stop(f"before calibrating {schema.name}")
            self._fitted[schema.name] = self._fit_schema(ctx, schema)
            for key, value in self._fitted[schema.name].items():
                metrics[ctx.metric_name(schema, key)] = float(value)
        write_json(
            os.path.join(ctx.workdir, CALIBRATION_FILE),
            {"trainer": self.name, "base_predictions": ctx.params.get("base_predictions"), "schemas": self._fitted},
        )
        notes = [f"temperature {name}: {f['temperature']:.3f}" for name, f in self._fitted.items()]
        dropped = self._outside_predict_splits(ctx)
        if dropped:
            notes.append(f"{dropped} base prediction(s) for items outside val/test/unlabeled were dropped")
        return FitResult(
            model_version=model_version(self.name, ctx.spec.run_id),
            artifact_paths=[CALIBRATION_FILE],
            metrics=metrics,
            label_order=schema_labels(ctx, ctx.schemas[0]),
            notes=notes,
            steps=1,
        )

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """The base label with its recalibrated confidence, where the base file has one."""
        missing = 0
        items = list(items)
        for schema in ctx.schemas:
            fitted = self._fitted.get(schema.name) or {"temperature": 1.0, "n_labels": 2}
            for item in items:
                base = self._base.get((schema.name, item.instance_id))
                if base is None:
                    missing += 1
                    continue
                label, p = base
                confidence = (
                    None if p is None else temperature.scaled_confidence(p, fitted["n_labels"], fitted["temperature"])
                )
                yield Prediction(item.instance_id, schema.name, label, confidence)
        if missing:
            ctx.reporter.log("warning", f"{missing} item/schema pair(s) had no base prediction and were left out")
