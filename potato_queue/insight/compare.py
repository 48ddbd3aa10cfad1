"""Two runs of the project side by side, on the held-out items both scored.

The items compared are those in both runs' val or test splits with a prediction from each, scored
against the newer run's gold label (the annotators may have labelled more since the older run). Per
label, the confusion matrices, McNemar's test of the difference, and the items where the two runs
disagree, with each annotator's label beside them. The scores are the kind's (wire/scoring.py): a
multiselect's macro-F1 over its labels, not over their combinations; a likert's and a slider's MAE too.
"""

from __future__ import annotations

from typing import Any

from potato_queue.bundle import read_answers
from potato_queue.bundle.aggregate import all_targets
from potato_queue.bundle.read import schema_kind
from potato_queue.config import ProjectConfig
from potato_queue.errors import Invalid
from potato_queue.insight.measures import Scored, confusion, mcnemar, per_label
from potato_queue.insight.report import TEXT_CHARS
from potato_queue.insight.run_data import RunData, as_scored, potato_item_path, shown
from potato_queue.runs.gate import label_of
from potato_queue.runs.reproducibility import differences
from potato_queue.wire.scoring import score

__all__ = ["compare_runs", "annotator_labels", "SIGNIFICANT_P", "MAX_DISAGREEMENTS"]

SIGNIFICANT_P = 0.05
MAX_DISAGREEMENTS = 200


def annotator_labels(config: ProjectConfig, ids: set[str]) -> dict[str, dict[str, dict[str, str]]]:
    """{instance id: {schema: {annotator: label}}} for `ids`, from the project's annotations now."""
    kinds = {str(s.get("name")): schema_kind(s) for s in config.annotation_schemes}
    out: dict[str, dict[str, dict[str, str]]] = {}
    found = read_answers(config)
    for user in found.users:
        for schema, answers in found.by_user[user].items():
            if schema not in kinds:
                continue  # an answer to a scheme the config no longer has
            targets, _ = all_targets(
                {iid: {schema: value_map} for iid, value_map in answers.items() if iid in ids}, {schema: kinds[schema]}
            )
            for iid, target in targets.items():
                label = shown(target[schema])
                if label is not None:
                    out.setdefault(iid, {}).setdefault(schema, {})[user] = label
    return out


def _scored(run: RunData, schema: str, gold: dict[str, str]) -> list[Scored]:
    out = []
    for iid in sorted(gold):
        p = run.predictions[(iid, schema)]
        confidence = p.get("confidence")
        out.append(
            Scored(
                iid, gold[iid], shown(label_of(p)), float(confidence) if isinstance(confidence, (int, float)) else None
            )
        )
    return out


def _said(a: str, b: str, test: dict[str, Any], acc_a: float | None, acc_b: float | None) -> str:
    if test["only_a"] == test["only_b"] == 0:
        return f"{a} and {b} are right and wrong on the same items"
    verdict = (
        "the difference is unlikely to be chance"
        if test["p_value"] < SIGNIFICANT_P
        else "the difference could be chance"
    )
    return (
        f"{b} is right on {test['only_b']} items {a} gets wrong, and wrong on {test['only_a']} it gets right "
        f"(accuracy {acc_a} against {acc_b}); McNemar p = {test['p_value']}: {verdict}"
    )


def _schema(config: ProjectConfig, a: RunData, b: RunData, schema: str, newer: RunData) -> dict[str, Any]:
    ids = {
        iid
        for iid in set(a.gold.get(schema, {})) & set(b.gold.get(schema, {}))
        if (iid, schema) in a.predictions and (iid, schema) in b.predictions
    }
    gold = {iid: newer.gold[schema][iid] for iid in ids}
    items_a, items_b = _scored(a, schema, gold), _scored(b, schema, gold)
    kind, points = newer.kinds.get(schema, "nominal"), newer.scales.get(schema, {}).get("points")
    scores_a, scores_b = (
        score(
            {i: as_scored(g, kind) for i, g in gold.items()},
            {i.instance_id: as_scored(i.predicted, kind) for i in items},
            kind,
            points,
        )
        for items in (items_a, items_b)
    )
    test = mcnemar([i.right for i in items_a], [i.right for i in items_b])
    differ = [(x, y) for x, y in zip(items_a, items_b, strict=True) if x.predicted != y.predicted]
    labels = annotator_labels(config, {x.instance_id for x, _ in differ[:MAX_DISAGREEMENTS]})
    disagreements = [
        {
            "instance_id": x.instance_id,
            "split": newer.split_of.get(x.instance_id),
            "text": newer.texts.get(x.instance_id, "")[:TEXT_CHARS],
            "gold": x.gold,
            "a": x.predicted,
            "b": y.predicted,
            "annotators": labels.get(x.instance_id, {}).get(schema, {}),
            "potato_item": potato_item_path(x.instance_id),
        }
        for x, y in differ[:MAX_DISAGREEMENTS]
    ]
    return {
        "n": len(ids),
        "a": {**scores_a, "per_label": per_label(items_a), "confusion": confusion(items_a)},
        "b": {**scores_b, "per_label": per_label(items_b), "confusion": confusion(items_b)},
        "mcnemar": test,
        "disagree": len(differ),
        "disagreements": disagreements,
        "said": _said(a.run_id, b.run_id, test, scores_a["accuracy"], scores_b["accuracy"]),
    }


def compare_runs(config: ProjectConfig, a: RunData, b: RunData) -> dict[str, Any]:
    """Run `a` against run `b` on every schema both trained; Invalid when there is nothing to compare."""
    if a.run_id == b.run_id:
        raise Invalid(f"both runs are {a.run_id}", fix="pick two different runs of the project")
    shared = [s for s in a.schemas if s in b.schemas]
    if not shared:
        raise Invalid(
            f"runs {a.run_id} ({', '.join(a.schemas)}) and {b.run_id} ({', '.join(b.schemas)}) trained "
            "no schema in common",
            fix="compare two runs of the same schema",
        )
    newer = b if str(b.record.get("created_at") or "") >= str(a.record.get("created_at") or "") else a
    schemas = {s: _schema(config, a, b, s, newer) for s in shared}
    if not any(v["n"] for v in schemas.values()):
        raise Invalid(
            f"runs {a.run_id} and {b.run_id} scored no held-out item in common (their val and test "
            "splits do not overlap)",
            fix="compare runs made with the same split (the same seed and splits)",
        )
    return {
        "a": a.run_id,
        "b": b.run_id,
        "gold_from": newer.run_id,
        "trainers": {"a": a.record.get("trainer"), "b": b.record.get("trainer")},
        "schemas": schemas,
        # What made the two runs, where it differed (a re-run's question: the code, packages, GPU, host, seeds).
        "reproducibility": differences(a.record.get("reproducibility") or {}, b.record.get("reproducibility") or {})
        if a.record.get("reproducibility") and b.record.get("reproducibility")
        else None,
    }
