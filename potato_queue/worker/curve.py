"""A learning curve: the trainer fit on 25, 50 and 75 % of the train items before the run's own fit on all.

Asked for by the worker-level param ``learning_curve: true`` (like
``checkpoint_every_steps``: the worker acts on it; a trainer ignores it). The
splits stay the run's: val and test are the same items for every fit, and
each smaller train set is the start of one seeded shuffle of the train
items, so 25 % is inside 50 %, inside 75 %. Each partial fit writes into a
scratch folder that is removed after it; only its held-out scores are kept,
as metric events of split ``curve`` named ``<percent>/<schema>/<measure>``.
The 100 % point is the run's own fit, scored as every run is. The names, and
the reading the server does, are wire/curve.py's.

Standard library only, Python 3.8+ (the worker runs on bare hosts).
"""

import gc
import os
import shutil
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from potato_queue.wire.checkpoint import Checkpoints
from potato_queue.wire.curve import (
    CURVE_PARAM,
    CURVE_PERCENTS,
    CURVE_SPLIT,
    curve_metric_name,
    curve_train_ids,
)
from potato_queue.wire.scoring import gold_label, score

from .api import PredictItem, RunContext, Trainer
from .bundle import Bundle
from .errors import TrainerError, ValidationFailed

__all__ = ["wants_curve", "fit_curve", "report_full_point", "quiet", "scratch_checkpoints"]

HELD_OUT = ("val", "test")
# A curve point's scores: macro-F1 and accuracy (a classifier's; a likert's too), MAE (a scale's; a slider's only).
CURVE_MEASURES = ("macro_f1", "accuracy", "mae")


def wants_curve(params: Dict[str, Any]) -> bool:
    """Whether the run asked for a learning curve; a value that is not a bool is refused (exit 2)."""
    value = params.get(CURVE_PARAM, False)
    if not isinstance(value, bool):
        raise ValidationFailed("params.%s must be true or false, got %r" % (CURVE_PARAM, value))
    return value


class _SubsetBundle(Bundle):
    """The run's bundle with its train split cut to some of its items."""

    def __init__(self, whole: Bundle, keep: List[str]) -> None:
        Bundle.__init__(self, whole.root, whole.manifest, {})
        self._whole, self._keep = whole, set(keep)

    def labels(self, schema: str) -> List[str]:
        return self._whole.labels(schema)  # the vocabulary stays the run's: every fit predicts the same labels

    def split_size(self, split: str) -> int:
        return len(self._keep) if split == "train" else self._whole.split_size(split)

    def read_split(self, split: str) -> Iterator[Dict[str, Any]]:
        for row in self._whole.read_split(split):
            if split != "train" or str(row["instance_id"]) in self._keep:
                yield row


class _QuietReporter:
    """A partial fit's reporter: its progress and log lines reach run.log, its metrics and files do not
    (the run's own fit reports those)."""

    def __init__(self, reporter: Any) -> None:
        self._reporter = reporter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reporter, name)

    def metric(self, split: str, name: str, value: float, step: int = 0) -> None:
        return None

    def artifact(self, path: str, size: Optional[int]) -> None:
        return None


def _held_out_items(bundle: Bundle) -> List[PredictItem]:
    return [
        PredictItem(str(row["instance_id"]), str(row.get("text") or ""), split, row)
        for split in HELD_OUT
        for row in bundle.read_split(split)
    ]


def _scores(ctx: RunContext, trainer: Trainer, items: List[PredictItem]) -> Dict[str, Dict[str, float]]:
    """{schema: {"<split>_<measure>": score}} of a fit on the held-out items (CURVE_MEASURES: those the
    scheme's kind has)."""
    predicted = {(p.instance_id, p.schema_name): p.label for p in trainer.predict(ctx, items)}
    out: Dict[str, Dict[str, float]] = {}
    for schema in ctx.schemas:
        out[schema.name] = {}
        for split in HELD_OUT:
            targets = {i.instance_id: gold_label(i.targets.get(schema.name)) for i in items if i.split == split}
            got = score(
                {k: v for k, v in targets.items() if v is not None},
                {i: predicted.get((i, schema.name)) for i in targets},
                schema.kind,
                ctx.bundle.scale(schema.name).get("points"),
            )
            for measure in CURVE_MEASURES if got["n"] else ():
                if got.get(measure) is not None:
                    out[schema.name]["%s_%s" % (split, measure)] = got[measure]
    return out


def _partial_fit(
    ctx: RunContext, part: RunContext, trainer: Trainer, items: List[PredictItem]
) -> Optional[Dict[str, Dict[str, float]]]:
    """One smaller share's fit and scores; None (said in run.log) when the trainer refuses the share or
    fails on it: a curve point missing is no reason to fail the run, whose own fit comes after."""
    problems = trainer.validate(part)
    if problems:
        ctx.reporter.log(
            "warning",
            "learning curve: %d %% of the train items is left out: %s"
            % (part.bundle.split_size("train") * 100 // max(1, ctx.bundle.split_size("train")), "; ".join(problems)),
        )
        return None
    try:
        trainer.fit(part)
    except (TrainerError, ValueError) as exc:
        ctx.reporter.log(
            "warning",
            "learning curve: the fit on %d train items failed and is left out: %s"
            % (part.bundle.split_size("train"), exc),
        )
        return None
    ctx.check_stop("during the learning curve")
    return _scores(part, trainer, items)


def fit_curve(
    ctx: RunContext, new_trainer: Callable[[], Trainer], make_context: Callable[[Bundle, str], RunContext]
) -> None:
    """Fit a new trainer on each smaller share of the train items and report its held-out scores; the run's
    own fit (100 %) comes after, in run.py. *make_context(bundle, workdir)* builds a partial fit's context.
    A run that resumes from a checkpoint (preempted, retried) skips them: they were not checkpointed."""
    if ctx.checkpoints.latest() is not None:
        ctx.reporter.log(
            "warning", "learning curve: the run resumes from a checkpoint, so only its own fit (100 %) is on the curve"
        )
        return
    train_ids = [str(row["instance_id"]) for row in ctx.bundle.read_split("train")]
    items = _held_out_items(ctx.bundle)
    for percent in CURVE_PERCENTS[:-1]:
        keep = curve_train_ids(train_ids, percent, ctx.spec.seed)
        ctx.reporter.status(
            "running",
            "learning curve: fitting on %d %% of the train items (%d of %d)" % (percent, len(keep), len(train_ids)),
        )
        scratch = os.path.join(ctx.workdir, ".curve-%d" % percent)
        started_s = time.monotonic()
        try:
            scores = _partial_fit(ctx, make_context(_SubsetBundle(ctx.bundle, keep), scratch), new_trainer(), items)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            gc.collect()  # the partial model's memory, before the next fit loads another
        if scores is not None:
            _report_point(ctx, percent, len(keep), scores, time.monotonic() - started_s)
    ctx.reporter.status("running", "learning curve: fitting on 100 % of the train items (the run's model)")


def _report_point(
    ctx: RunContext, percent: int, n_train: int, scores: Dict[str, Dict[str, float]], took_s: float
) -> None:
    for schema in ctx.schemas:
        ctx.reporter.metric(CURVE_SPLIT, curve_metric_name(percent, schema.name, "n_train"), n_train)
        ctx.reporter.metric(CURVE_SPLIT, curve_metric_name(percent, schema.name, "seconds"), round(took_s, 2))
        for measure, value in scores.get(schema.name, {}).items():
            ctx.reporter.metric(CURVE_SPLIT, curve_metric_name(percent, schema.name, measure), value)


def report_full_point(ctx: RunContext, n_train: int, metrics: Dict[str, float], took_s: float) -> None:
    """The 100 % point: the run's own held-out scores (run.py's metrics, named as ctx.metric_name gives them)."""
    scores: Dict[str, Dict[str, float]] = {}
    for schema in ctx.schemas:
        scores[schema.name] = {}
        for split in HELD_OUT:
            for measure in CURVE_MEASURES:
                value = metrics.get(ctx.metric_name(schema, "%s_%s" % (split, measure)))
                if value is not None:
                    scores[schema.name]["%s_%s" % (split, measure)] = value
    _report_point(ctx, 100, n_train, scores, took_s)


def quiet(ctx_reporter: Any) -> Any:
    """The reporter a partial fit gets."""
    return _QuietReporter(ctx_reporter)


def scratch_checkpoints(workdir: str) -> Checkpoints:
    """A partial fit's checkpoints: in its scratch folder, never due (it is not resumed)."""
    return Checkpoints(os.path.join(workdir, "checkpoints"), 0)
