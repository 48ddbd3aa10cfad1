"""`potato-queue training compare | next | quality`: what a run says beyond its scores, as text tables (or
`--json`, the API's own answer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from potato_queue.cli.options import CONFIG, REDIS, run_command, runs_for

if TYPE_CHECKING:
    from potato_queue.runs.service import RunService

__all__ = ["compare", "next_", "quality", "comparison_table", "next_table", "quality_table", "threshold_said", "loaded"]

SHOWN_DISAGREEMENTS = 10


def _f(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _table(rows: list[list[Any]]) -> str:
    from potato_queue.cli.output import aligned  # the CLI's other tables' columns

    return aligned([[_f(c) for c in row] for row in rows])


def _per_label_table(per_label_a: list[dict[str, Any]], per_label_b: list[dict[str, Any]]) -> str:
    rows_a = {r["label"]: r for r in per_label_a}
    rows_b = {r["label"]: r for r in per_label_b}
    return _table(
        [["label", "precision A", "recall A", "F1 A", "precision B", "recall B", "F1 B", "support"]]
        + [
            [
                label,
                *(rows.get(label, {}).get(k) for rows in (rows_a, rows_b) for k in ("precision", "recall", "f1")),
                (rows_a.get(label) or rows_b[label])["support"],
            ]
            for label in sorted(rows_a.keys() | rows_b.keys())
        ]
    )


def comparison_table(found: dict[str, Any]) -> str:
    """The comparison as text: scores, per label, McNemar, the first disagreements."""
    a, b = found["a"], found["b"]
    out = [f"A: run {a} ({found['trainers']['a']})   B: run {b} ({found['trainers']['b']})"]
    for schema, s in found["schemas"].items():
        out += [
            "",
            f"{schema}: {s['n']} held-out items both runs scored (gold labels from run {found['gold_from']})",
            _table(
                [
                    ["", "A", "B"],
                    ["accuracy", s["a"]["accuracy"], s["b"]["accuracy"]],
                    ["macro-F1", s["a"]["macro_f1"], s["b"]["macro_f1"]],
                ]
            ),
            "",
        ]
        out.append(_per_label_table(s["a"]["per_label"], s["b"]["per_label"]))
        test = s["mcnemar"]
        out += [
            "",
            f"McNemar ({test['method']}): A right where B is wrong {test['only_a']}, B right where A is wrong "
            f"{test['only_b']}, p = {test['p_value']}",
            s["said"],
            "",
            f"they disagree on {s['disagree']} items"
            + (f" (the first {SHOWN_DISAGREEMENTS}):" if s["disagree"] else ""),
        ]
        if s["disagreements"]:
            out.append(
                _table(
                    [["item", "gold", "A", "B", "annotators", "text"]]
                    + [
                        [
                            d["instance_id"],
                            d["gold"],
                            d["a"],
                            d["b"],
                            ", ".join(f"{u}: {label}" for u, label in d["annotators"].items()) or "-",
                            d["text"][:60],
                        ]
                        for d in s["disagreements"][:SHOWN_DISAGREEMENTS]
                    ]
                )
            )
    return "\n".join(out + _made_differently(found.get("reproducibility")))


def _made_differently(differed: list[dict[str, Any]] | None) -> list[str]:
    """What made the two runs, where it differed (their reproducibility records)."""
    if differed is None:
        return []
    if not differed:
        return ["", "made the same way: code, data, trainer, params, seeds, packages, GPUs, backend and host"]
    rows = [["made with", "A", "B"]] + [[d["field"], json.dumps(d["a"]), json.dumps(d["b"])] for d in differed]
    return ["", "made differently:", _table(rows)]


def next_table(found: dict[str, Any]) -> str:
    rows = [["rank", "item", "uncertainty", "predicted", "text"]]
    rows += [
        [
            i["rank"],
            i["instance_id"],
            i["uncertainty"],
            ", ".join(f"{k}: {v}" for k, v in i["predicted"].items()),
            i["text"][:70] + (f"  (near-copy of {i['near_copy_of']})" if i["near_copy_of"] else ""),
        ]
        for i in found["items"]
    ]
    return found["said"] + ("\n" + _table(rows) if found["items"] else "")


def loaded(runs: RunService, run_id: str) -> Any:
    """A run's data for the insight (its predictions, splits, gold labels, texts)."""
    from potato_queue.insight.run_data import load_run

    return load_run(runs.store, runs.record(run_id))


def _inputs(runs: RunService, run_id: str) -> Any:
    from potato_queue.insight.inputs import read_inputs

    return read_inputs(runs.store, runs.record(run_id))


@click.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@CONFIG
@REDIS
@click.option("--json", "as_json", is_flag=True, help="The API's answer (GET /runs/RUN_A/compare/RUN_B).")
def compare(run_a: str, run_b: str, config: Path, redis_url: str, as_json: bool) -> None:
    """Two runs side by side on the held-out items both scored: per label, McNemar, where they disagree."""
    from potato_queue.insight.compare import compare_runs

    runs = runs_for(config, redis_url)
    found = compare_runs(runs.config, loaded(runs, run_a), loaded(runs, run_b))
    click.echo(json.dumps(found, ensure_ascii=False) if as_json else comparison_table(found))


@run_command("next")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10000))
@click.option("--measure", type=click.Choice(["margin", "entropy"]), default="margin", show_default=True)
@click.option(
    "--to-potato",
    is_flag=True,
    help="Write the whole order into the data files for Potato's priority assignment (read at Potato's next start).",
)
@click.option("--json", "as_json", is_flag=True)
def next_(run_id: str, config: Path, redis_url: str, limit: int, measure: str, to_potato: bool, as_json: bool) -> None:
    """What to label next: RUN_ID's unlabelled items, least sure first, near-copies held back."""
    from potato_queue.insight.potato_order import hand_to_potato
    from potato_queue.insight.report import next_items

    runs = runs_for(config, redis_url)
    found = next_items(runs.config, _inputs(runs, run_id), None if to_potato else limit, measure)
    if to_potato:
        found = {**found, "potato": hand_to_potato(runs.config, [i["instance_id"] for i in found["items"]])}
        found["items"] = found["items"][:limit]
    click.echo(json.dumps(found, ensure_ascii=False) if as_json else next_table(found))
    if to_potato and not as_json:
        click.echo(found["potato"]["said"])


@run_command("quality")
@click.option("--target-precision", default=0.9, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--json", "as_json", is_flag=True)
def quality(run_id: str, config: Path, redis_url: str, target_precision: float, as_json: bool) -> None:
    """Is RUN_ID good enough to prelabel with: per label, calibration, the min_confidence for a precision."""
    from potato_queue.insight.report import quality as quality_of

    runs = runs_for(config, redis_url)
    found = quality_of(_inputs(runs, run_id), target_precision)
    click.echo(json.dumps(found, ensure_ascii=False) if as_json else quality_table(found))


def quality_table(found: dict[str, Any]) -> str:
    out = []
    for schema, s in found["schemas"].items():
        rel, th = s["reliability"], s["threshold"]
        out += [
            f"{schema}: {s['n']} held-out items",
            _table(
                [["label", "precision", "recall", "F1", "support"]]
                + [[r["label"], r["precision"], r["recall"], r["f1"], r["support"]] for r in s["per_label"]]
            ),
            "",
            _table(
                [["confidence", "items", "mean confidence", "accuracy"]]
                + [
                    [f"{b['lo']:.1f}-{b['hi']:.1f}", b["n"], b["confidence"], b["accuracy"]]
                    for b in rel["bins"]
                    if b["n"]
                ]
            ),
            f"expected calibration error {_f(rel['ece'])}",
            threshold_said(th),
            "",
        ]
    return "\n".join(out).rstrip()


def threshold_said(th: dict[str, Any]) -> str:
    if th["min_confidence"] is None:
        best = th.get("best") or {}
        return (
            f"no min_confidence keeps precision at {th['target_precision']} on these items (the most precise: "
            f"{_f(best.get('precision'))} at min_confidence {_f(best.get('min_confidence'))})"
        )
    return (
        f"min_confidence {th['min_confidence']} keeps precision at {th['precision']} (target {th['target_precision']}),"
        f" prelabelling {th['kept']} of {th['of']} held-out items; not applied: set "
        "model_training.writeback.min_confidence to use it"
    )
