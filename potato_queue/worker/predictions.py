"""Writing ``<workdir>/predictions.jsonl``: val, test and unlabeled, never train.

Each line is ``{"instance_id", "schema_name", "payload": {"label",
"confidence"}, "confidence"}``. The file is written under a temporary name
and renamed when complete, so a partial file is never mistaken for a result.
"""

import json
import os
from typing import Any, Dict, Iterable, List, Set, Tuple

from .api import Prediction, PredictItem, RunContext, Trainer
from .bundle import PREDICT_SPLITS, Bundle
from .errors import TrainerError

__all__ = ["PREDICTIONS_FILE", "PredictionSummary", "predict_items", "write_predictions"]

PREDICTIONS_FILE = "predictions.jsonl"


class PredictionSummary:
    """What the prediction pass wrote, and the (gold, predicted) pairs to score."""

    def __init__(self, path: str, count: int, pairs: Dict[Tuple[str, str], List[Tuple[Any, Any]]]) -> None:
        self.path = path
        self.count = count
        #: ``{(split, schema): [(gold, predicted), ...]}`` for val and test.
        self.pairs = pairs


def predict_items(bundle: Bundle) -> List[PredictItem]:
    """Every row of val, test and unlabeled, in bundle order."""
    items: List[PredictItem] = []
    for split in PREDICT_SPLITS:
        for row in bundle.read_split(split):
            items.append(PredictItem(str(row["instance_id"]), str(row.get("text") or ""), split, row))
    return items


def _gold(item: PredictItem, schema: str) -> Any:
    target = item.targets.get(schema)
    if isinstance(target, list) and len(target) == 1:
        target = target[0]
    return None if target in (None, "", []) else target


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
    pairs: Dict[Tuple[str, str], List[Tuple[Any, Any]]] = {}
    total = len(items) * len(ctx.schemas)
    count = 0
    try:
        with open(partial, "w", encoding="utf-8") as fh:
            for prediction in trainer.predict(ctx, items):
                item = checker.check(prediction)
                fh.write(json.dumps(prediction.to_record(), ensure_ascii=False) + "\n")
                count += 1
                gold = _gold(item, prediction.schema_name)
                if item.split != "unlabeled" and gold is not None:
                    pairs.setdefault((item.split, prediction.schema_name), []).append((gold, prediction.label))
                ctx.reporter.progress("predict", count, total)
                ctx.check_stop("while predicting")
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    os.replace(partial, path)
    return PredictionSummary(path, count, pairs)
