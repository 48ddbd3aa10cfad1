"""What the CLI prints: validate's report, the runs table, a run's log, and --follow's progress and scores."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from potato_queue.lab.usage import gpu_hours
from potato_queue.run import FINAL_STATES, RunState
from potato_queue.store import RunStore
from potato_queue.store.keys import project_predictions_path
from potato_queue.store.records import epoch_of
from potato_queue.wire.exit_codes import EXIT_FOR_STATE

if TYPE_CHECKING:
    from potato_queue.runs.service import RunService

__all__ = [
    "print_report",
    "runs_table",
    "agreement_lines",
    "aligned",
    "print_log",
    "follow",
    "held_out_table",
    "compare_table",
    "progress_line",
    "progress_mark",
]


def aligned(rows: list[list[str]]) -> str:
    """Rows of text as columns two spaces apart, each as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def usage_cells(usage: dict[str, Any] | None) -> list[str]:
    """A run's GPU-hours and watt-hours for the runs table: `cpu` where it measured no GPU, blank where
    nothing was reported."""
    if not usage:
        return ["", ""]
    if not usage.get("gpus"):
        return ["cpu", ""]
    energy = usage.get("energy_wh")
    return [f"{gpu_hours(usage):.3g}", "" if energy is None else f"{energy:.3g}"]


# Each kind's own held-out measures beyond accuracy and macro-F1, in the page's order (static/common.js):
# a multiselect's micro-F1, a likert's MAE and QWK, a slider's MAE and Spearman, a span scheme's F1s.
KIND_MEASURES = (
    ("micro_f1", "micro-F1"),
    ("mae", "MAE"),
    ("qwk", "QWK"),
    ("spearman", "Spearman"),
    ("f1", "span F1"),
    ("partial_f1", "partial F1"),
)


def kind_measures(split: dict[str, Any]) -> str:
    """A split's measures of its kind beyond accuracy and macro-F1 (`MAE 11.2  Spearman 0.41`), or ""."""
    return "  ".join(f"{name} {split[key]:.3f}" for key, name in KIND_MEASURES if isinstance(split.get(key), float))


def held_out_words(record: dict[str, Any]) -> str:
    """Each scheme's test scores (val where no test item was scored) in its kind's measures, for one line."""
    parts = []
    for schema, splits in (record.get("held_out") or {}).items():
        split = splits.get("test") if (splits.get("test") or {}).get("n") else splits.get("val")
        if not split or not split.get("n"):
            continue
        shown = [f"acc {split['accuracy']:.3f}"] if isinstance(split.get("accuracy"), float) else []
        shown += [f"F1 {split['macro_f1']:.3f}"] if isinstance(split.get("macro_f1"), float) else []  # an old record
        shown = [" ".join(shown)] if shown else []
        shown += [kind_measures(split)] if kind_measures(split) else []
        parts.append(f"{schema}: {'  '.join(shown) or '-'}")
    return "; ".join(parts)


def runs_table(records: list[dict[str, Any]]) -> str:
    if not records:
        return "no runs yet"
    rows = [["RUN", "STATE", "RAN ON", "TRAINER", "SCHEMAS", "TRIGGER", "CREATED", "GPU-HOURS", "WH", "HELD-OUT"]]
    rows += [
        [
            r["run_id"],
            r["state"],
            r.get("backend") or "",
            r["trainer"],
            ",".join(r["schemas"]),
            r.get("trigger") or "",
            r["created_at"],
            *usage_cells(r.get("gpu_usage")),
            held_out_words(r),
        ]
        for r in records
    ]
    return aligned([[str(c) for c in row] for row in rows])


def agreement_lines(records: list[dict[str, Any]]) -> str:
    """How each run agrees with the annotators, a line a run and scheme (`training runs --agreement`)."""
    said = [
        f"{r['run_id']} {schema}: {figures.get('said')}"
        for r in records
        for schema, figures in sorted((r.get("agreement") or {}).items())
        if isinstance(figures, dict)
    ]
    if not said:
        return "\nno run listed has agreement figures"
    return "\nthe model against the annotators, on held-out items:\n" + "\n".join(said)


def print_log(service: RunService, run_id: str, *, follow: bool, poll_s: float = 0.5) -> None:
    """run.log (RunService.log_on_disk); with follow, until the run ends."""
    offset = 0
    while True:
        chunk, ended = service.log_on_disk(run_id, offset)
        offset += len(chunk)
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        if not follow or ended:
            return
        time.sleep(poll_s)


def progress_line(record: dict[str, Any], width: int = 30) -> str:
    progress = record.get("progress") or {}
    current, total = progress.get("current"), progress.get("total")
    if isinstance(current, (int, float)) and isinstance(total, (int, float)) and total:
        done = int(width * min(1.0, current / total))
        bar = f"[{'#' * done}{'.' * (width - done)}] {current}/{total}"
    else:
        bar = f"[{'.' * width}]"
    return f"{record['state']:<10} {bar}  {record.get('step') or ''}"


def progress_mark(record: dict[str, Any]) -> tuple[Any, ...]:
    """What a log's progress line changes with: the state, the step, the quarter of the step's progress."""
    progress = record.get("progress") or {}
    current, total = progress.get("current"), progress.get("total")
    quarter = (
        int(4 * min(1.0, current / total))
        if isinstance(current, (int, float)) and isinstance(total, (int, float)) and total
        else None
    )
    return record["state"], record.get("step"), progress.get("phase"), quarter


def held_out_table(held_out: dict[str, Any]) -> str:
    lines = [f"{'schema':<20} {'split':<6} {'accuracy':>9} {'macro_f1':>9} {'n':>5}  by its kind"]
    for schema, splits in held_out.items():
        for split, s in splits.items():
            lines.append(
                f"{schema:<20} {split:<6} {_score(s, 'accuracy'):>9} {_score(s, 'macro_f1'):>9} {s.get('n', 0):>5}  "
                f"{kind_measures(s)}".rstrip()
            )
    return "\n".join(lines)


def compare_table(records: list[dict[str, Any]]) -> str:
    """Runs side by side: each schema's held-out accuracy and macro-F1 on val and test, the test split's
    measures of the scheme's kind (MAE, QWK, Spearman, micro-F1, span F1), and the run's time."""
    lines = [
        f"{'trainer':<24} {'schema':<14} {'val acc':>8} {'val F1':>7} {'test acc':>9} {'test F1':>8} {'n test':>7} "
        f"{'time':>7}  test, by its kind"
    ]
    for record in records:
        held_out, duration_s = record.get("held_out") or {}, _duration_s(record)
        took = "-" if duration_s is None else f"{duration_s:.0f} s"
        if not held_out:
            lines.append(f"{record['trainer']:<24} {'-':<14} {record['state']:>8}")
        for schema, splits in held_out.items():
            val, test = splits.get("val") or {}, splits.get("test") or {}
            lines.append(
                f"{record['trainer']:<24} {schema:<14} {_score(val, 'accuracy'):>8} {_score(val, 'macro_f1'):>7} "
                f"{_score(test, 'accuracy'):>9} {_score(test, 'macro_f1'):>8} {test.get('n', 0):>7} {took:>7}  "
                f"{kind_measures(test)}".rstrip()
            )
    return "\n".join(lines)


def _score(split: dict[str, Any], name: str) -> str:
    return "-" if split.get(name) is None else f"{split[name]:.3f}"


def _duration_s(record: dict[str, Any]) -> float | None:
    started, finished = epoch_of(record.get("started_at")), epoch_of(record.get("finished_at"))
    return None if started is None or finished is None else finished - started


def follow(store: RunStore, run_id: str, *, poll_s: float = 0.25, summary: bool = True) -> int:
    """Print progress until the run ends (then, with summary, its held-out table and where its files
    went); the exit code says how it ended."""
    last: Any = ""
    tty = sys.stdout.isatty()
    while True:
        record = store.get(run_id)
        line = progress_line(record)
        # A terminal redraws one line; a log (CI, a pipe) gets a line at each step and each quarter of it.
        shown = line if tty else progress_mark(record)
        if shown != last:
            print(("\r" if tty else "") + line, end="" if tty else "\n", flush=True)
            last = shown
        if record["state"] in FINAL_STATES:
            break
        time.sleep(poll_s)
    print()
    if record.get("error"):
        print(f"error: {record['error']}")
    if record.get("held_out") and summary:
        print(held_out_table(record["held_out"]))
    if record["state"] == RunState.SUCCEEDED and summary:
        print(
            f"\npredictions: {project_predictions_path(store.config)} (this run's: {store.paths(run_id).predictions})"
        )
        if record.get("artifact_uri"):
            print(f"model files: {record['artifact_uri']}")
    return EXIT_FOR_STATE.get(record["state"], 1)


def print_report(config: Path, report: Any, strict: bool) -> None:
    for text in report.errors:
        click.echo(f"error: {text}")
    for text in report.warnings:
        click.echo(f"warning: {text}")
    for text in report.acknowledged:
        click.echo(f"acknowledged: {text}")
    counts = (
        f"{len(report.errors)} error(s), {len(report.warnings)} warning(s), {len(report.acknowledged)} acknowledged"
    )
    if report.errors:
        click.echo(f"{config}: invalid ({counts})")
    elif strict and report.warnings:
        click.echo(
            f"{config}: fails --strict ({counts}); fix each warning or acknowledge it under validation.acknowledge"
        )
    else:
        click.echo(f"{config}: valid ({counts})")
