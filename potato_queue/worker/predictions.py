"""Writing ``<workdir>/predictions.jsonl``: val, test and unlabeled, never train.

Each line is ``{"instance_id", "schema_name", "payload": {"label",
"confidence"}, "confidence"}``. The file is written under a temporary name
and renamed when complete, so a partial file is never mistaken for a result.
"""

import json
import os
from typing import Any, Dict, Iterable, List, Set, Tuple

from potato_queue.wire.scoring import gold_label

from .api import Prediction, PredictItem, RunContext, Trainer
from .bundle import PREDICT_SPLITS, Bundle
from .errors import TrainerError

__all__ = ["PREDICTIONS_FILE", "PredictionSummary", "predict_items", "write_predictions"]

PREDICTIONS_FILE = "predictions.jsonl"


class PredictionSummary:
    """What the prediction pass wrote, and the (gold, predicted) pairs to score."""

    def __init__(
        self,
        path: str,
        count: int,
        targets: Dict[Tuple[str, str], Dict[str, Any]],
        predicted: Dict[Tuple[str, str], Dict[str, Any]],
    ) -> None:
        self.path = path
        self.count = count
        #: ``{(split, schema): {instance_id: gold}}`` for every val and test item with a gold label.
        self.targets = targets
        #: ``{(split, schema): {instance_id: predicted label}}`` for the items predicted.
        self.predicted = predicted


def predict_items(bundle: Bundle) -> List[PredictItem]:
    """Every row of val, test and unlabeled, in bundle order."""
    items: List[PredictItem] = []
    for split in PREDICT_SPLITS:
        for row in bundle.read_split(split):
            items.append(PredictItem(str(row["instance_id"]), str(row.get("text") or ""), split, row))
    return items


def _targets(items: List[PredictItem], schemas: Iterable[str]) -> Dict[Tuple[str, str], Dict[str, Any]]:
    targets: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for item in items:
        for schema in schemas:
            gold = gold_label(item.targets.get(schema))
            if item.split != "unlabeled" and gold is not None:
                targets.setdefault((item.split, schema), {})[item.instance_id] = gold
    return targets


class _Checker:
    """Keeps a trainer honest: known items and schemas, one line per pair."""

    def __init__(self, items: List[PredictItem], schemas: Iterable[str]) -> None:
        self.by_id = {item.instance_id: item for item in items}
        self.schemas = set(schemas)
        self.seen: Set[Tuple[str, str]] = set()

    def check(self, prediction: Prediction) -> PredictItem:
        key = (prediction.instance_id, prediction.schema_name)
        item = self.by_id.get(prediction.instance_id)
        if item is None:
            raise TrainerError("The trainer predicted item %r, which is not in val/test/unlabeled" % key[0])
        if prediction.schema_name not in self.schemas:
            raise TrainerError("The trainer predicted schema %r, which the run does not train" % key[1])
        if key in self.seen:
            raise TrainerError("The trainer predicted item %r for schema %r twice" % key)
        self.seen.add(key)
        return item


def write_predictions(ctx: RunContext, trainer: Trainer, items: List[PredictItem]) -> PredictionSummary:
    """Run ``trainer.predict`` over *items* into ``<workdir>/predictions.jsonl``."""
    path = os.path.join(ctx.workdir, PREDICTIONS_FILE)
    partial = path + ".partial"
    checker = _Checker(items, [schema.name for schema in ctx.schemas])
    predicted: Dict[Tuple[str, str], Dict[str, Any]] = {}
    total = len(items) * len(ctx.schemas)
    count = 0
    try:
        with open(partial, "w", encoding="utf-8") as fh:
            for prediction in trainer.predict(ctx, items):
                item = checker.check(prediction)
                fh.write(json.dumps(prediction.to_record(), ensure_ascii=False) + "\n")
                count += 1
                predicted.setdefault((item.split, prediction.schema_name), {})[item.instance_id] = prediction.label
                ctx.reporter.progress("predict", count, total)
                ctx.check_stop("while predicting")
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    os.replace(partial, path)
    return PredictionSummary(path, count, _targets(items, checker.schemas), predicted)
