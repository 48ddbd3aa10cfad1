"""One run, looked into: is it good enough to prelabel with, will more labels help, what to label next.

Each answer reads the run's predictions and bundle (run_data.py) and, for what to label next, the
project's annotations now (an item labelled since the run is no longer asked for).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict, Invalid
from potato_queue.insight.inputs import RunInputs, labelled_now
from potato_queue.insight.measures import DEFAULT_TARGET_PRECISION, schema_quality
from potato_queue.insight.next_items import MEASURES, LazyVectors, rank_next
from potato_queue.wire.curve import CURVE_PARAM, read_curve

__all__ = ["quality", "learning_curve", "curve_said", "next_items", "DEFAULT_TARGET_PRECISION", "TEXT_CHARS"]

TEXT_CHARS = 200  # of an item's text in a listing


def quality(data: RunInputs, target_precision: float = DEFAULT_TARGET_PRECISION) -> dict[str, Any]:
    """Per schema: per-label precision and recall, the reliability diagram, and the min_confidence that keeps
    precision at `target_precision` on the held-out items (shown, never applied)."""
    if not 0 < target_precision <= 1:
        raise Invalid(
            f"target_precision must be above 0 and at most 1, got {target_precision}",
            fix="give a precision such as 0.9",
        )
    if target_precision == DEFAULT_TARGET_PRECISION and data.quality is not None:
        out = data.quality  # worked out at the run's finalize
    else:
        out = {schema: schema_quality(data.held_out.get(schema, []), target_precision) for schema in data.schemas}
    return {"run_id": data.run_id, "target_precision": target_precision, "schemas": out}


def _fit_log(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares of score = a + b * ln(items): (a, b), or None under two distinct sizes."""
    xs = [math.log(n) for n, _ in points]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(y for _, y in points) / len(points)
    b = sum((x - mx) * (y - my) for x, (_, y) in zip(xs, points, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def curve_measure(points: list[dict[str, Any]], split: str) -> str:
    """What a curve is read by: macro-F1, or the MAE of a scale that has no classes (a slider)."""
    return "macro_f1" if any(f"{split}_macro_f1" in p for p in points) else "mae"


def curve_said(points: list[dict[str, Any]], split: str) -> str:
    """The curve's gain in words: what the last quarter added, and what another would add on its trend
    (macro-F1; a slider's MAE, which falls as the model gets better)."""
    measure = curve_measure(points, split)
    have = [
        (float(p["n_train"]), float(p[f"{split}_{measure}"]))
        for p in points
        if isinstance(p.get(f"{split}_{measure}"), (int, float)) and isinstance(p.get("n_train"), (int, float))
    ]
    if len(have) < 2:
        return "not enough points to say"
    (n0, f0), (n1, f1) = have[-2], have[-1]
    quarter = f"the last {round((n1 - n0) / n1 * 100)} % of the train items ({int(n1 - n0)})"
    if measure == "macro_f1":
        said = f"{quarter} {'added' if f1 >= f0 else 'took away'} {abs(f1 - f0):.2f} {split} macro-F1 ({f0:.2f} to {f1:.2f})"
    else:
        said = f"{quarter} {'lowered' if f1 <= f0 else 'raised'} the {split} MAE by {abs(f1 - f0):.2f} ({f0:.2f} to {f1:.2f})"
    fit = _fit_log(have)
    if fit is not None:
        more = n1 * 1.25
        gain = (fit[0] + fit[1] * math.log(more)) - (fit[0] + fit[1] * math.log(n1))
        name = "macro-F1" if measure == "macro_f1" else "MAE"
        change = (
            f"add about {gain:.2f}"
            if measure == "macro_f1"
            else f"{'lower' if gain <= 0 else 'raise'} it by about {abs(gain):.2f}"
        )
        said += (
            f"; on the curve's trend ({name} against the log of the items), another {int(more - n1)} "
            f"labelled items would {change}"
        )
    return said


def learning_curve(record: Mapping[str, Any]) -> dict[str, Any]:
    """The run's learning curve (a run with params.learning_curve), per schema, and the gain in words."""
    curve = read_curve(record.get("metrics") or {})
    if not curve:
        asked = bool((record.get("params") or {}).get(CURVE_PARAM))
        raise Conflict(
            f"run {record['run_id']} has no learning curve"
            + (" yet" if asked else f" (it was not started with params.{CURVE_PARAM}: true)"),
            fix="start a run with a learning curve: `potato-queue training run CONFIG --learning-curve`, "
            "or tick 'learning curve' on the Training page",
        )
    out = {}
    for schema, points in curve.items():
        split = "test" if any("test_macro_f1" in p or "test_mae" in p for p in points) else "val"
        out[schema] = {"points": points, "split": split, "said": curve_said(points, split)}
    return {"run_id": record["run_id"], "schemas": out}


def next_items(
    config: ProjectConfig, data: RunInputs, limit: int | None = 20, measure: str = "margin"
) -> dict[str, Any]:
    """The unlabelled items the run predicted, not labelled since, ranked (next_items.py): the first `limit`
    (None: every one, the order handed to Potato). Near-linear: the uncertainties and word counts were worked
    out at the run's finalize, and only the texts the ranking reaches are made vectors."""
    if measure not in MEASURES:
        raise Invalid(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}", fix="use margin or entropy")
    labelled = labelled_now(config, data.annotations)
    open_items = {c.instance_id: c for c in data.candidates if c.instance_id not in labelled}
    if not open_items:
        why = (
            "every unlabelled item it predicted has been labelled since"
            if data.candidates
            else "it predicted no unlabelled item (model_training.writeback.include_unlabeled is off)"
        )
        return {"run_id": data.run_id, "measure": measure, "total": 0, "items": [], "said": f"nothing to rank: {why}"}
    uncertain = {iid: c.uncertainty[measure] for iid, c in open_items.items()}
    ranked = rank_next(uncertain, LazyVectors(data.texts, data.documents, len(data.texts)), limit=limit)
    held = sum(1 for r in ranked if r.near_copy_of)
    items = [
        {
            "rank": n,
            "instance_id": r.instance_id,
            "uncertainty": r.uncertainty,
            "near_copy_of": r.near_copy_of,
            "text": data.texts.get(r.instance_id, "")[:TEXT_CHARS],
            "predicted": open_items[r.instance_id].predicted,
        }
        for n, r in enumerate(ranked, 1)
    ]
    said = (
        f"{len(uncertain)} unlabelled items, the run's least sure first ({measure}); "
        f"near-copies of an item above them held back to the end ({held}{' in this list' if limit else ''})"
    )
    return {"run_id": data.run_id, "measure": measure, "total": len(uncertain), "items": items, "said": said}
