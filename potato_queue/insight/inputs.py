"""What the insight pages read of a succeeded run, worked out once at its finalize and kept beside it.

At 100,000 items a run's predictions are 15 MB and its bundle 100,000 rows: read again for every look,
the run page's first paint cost seconds of server work. So the finalize that scored the run also keeps
`insight.json` (RunPaths.insight_inputs): per schema the held-out items scored (gold, predicted,
confidence), the unlabelled items the run predicted with their uncertainty by both measures, their
predicted labels and texts, the texts' word counts for TF-IDF, and the summary the page shows of the
predictions. A run finalized before this file existed is worked out from its files on each request, as
before. The items labelled since the run are read from the annotators' files when asked, remembered
until one of those files changes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from potato_queue.bundle.annotations import answered_ids
from potato_queue.bundle.inputs import annotation_files, read_inputs_file
from potato_queue.config import ProjectConfig
from potato_queue.insight.measures import DEFAULT_TARGET_PRECISION, Scored, schema_quality
from potato_queue.insight.next_items import MEASURES, document_frequencies, mean_uncertainty
from potato_queue.insight.run_data import RunData, refuse_unsucceeded, run_data, scored, shown
from potato_queue.runs.finalize import read_predictions
from potato_queue.runs.gate import label_of
from potato_queue.store import RunStore
from potato_queue.wire.files import write_atomic

__all__ = [
    "INPUTS_VERSION",
    "SAMPLE_LINES",
    "PARTS",
    "Candidate",
    "RunInputs",
    "write_inputs",
    "read_inputs",
    "predictions_summary",
    "predictions_summary_of",
    "labelled_now",
]

INPUTS_VERSION = 1
SAMPLE_LINES = 10  # predictions the run page shows as a sample


@dataclass(frozen=True)
class Candidate:
    """An unlabelled item the run predicted: how unsure it was (by measure), what it predicted (by schema)."""

    instance_id: str
    uncertainty: dict[str, float]
    predicted: dict[str, str | None]


@dataclass
class RunInputs:
    run_id: str
    schemas: list[str]
    held_out: dict[str, list[Scored]]  # schema: its held-out items with a gold label, by id
    candidates: list[Candidate]
    texts: dict[str, str]  # the candidates' texts
    documents: dict[str, int]  # word: in how many candidates' texts
    summary: dict[str, Any]  # predictions_summary's
    annotations: list[list[Any]] | None = None  # the annotators' files as the bundle was built (bundle.inputs)
    quality: dict[str, Any] | None = None  # the quality report at DEFAULT_TARGET_PRECISION, per schema


def _label_shown(payload: Any) -> str:
    """A prediction's label as the run page lists it: a multiselect's labels joined, else the label."""
    if isinstance(payload, list):
        return ", ".join(str(x.get("label")) for x in payload if isinstance(x, dict)) or "(no label)"
    label = payload.get("label") if isinstance(payload, dict) else payload
    return str(int(label)) if isinstance(label, float) and label.is_integer() else str(label)


def predictions_summary(path: Path) -> dict[str, Any]:
    """The run page's view of predictions.jsonl: how many, how many lines are not a prediction, the count of
    each schema's label, and the first SAMPLE_LINES (the file itself is a download)."""
    return _summary(*read_predictions(path), path)


def _summary(good: list[dict[str, Any]], bad: list[int], path: Path) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for p in good:
        key = f"{p['schema_name']}: {_label_shown(p.get('payload'))}"
        counts[key] = counts.get(key, 0) + 1
    return {
        "total": len(good),
        "not_predictions": len(bad),
        "counts": dict(sorted(counts.items())),
        "sample": good[:SAMPLE_LINES],
        "file": _file_signature(path),
    }


def _file_signature(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _inputs_of(data: RunData, summary: dict[str, Any]) -> RunInputs:
    open_ids = {iid for iid, split in data.split_of.items() if split == "unlabeled"}
    predictions = [p for (iid, _schema), p in data.predictions.items() if iid in open_ids]
    by_measure = {m: mean_uncertainty(predictions, m, data.kinds) for m in MEASURES}
    ids = sorted(by_measure[MEASURES[0]])
    candidates = [
        Candidate(
            iid,
            {m: by_measure[m][iid] for m in MEASURES},
            {s: shown(label_of(data.predictions[(iid, s)])) for s in data.schemas if (iid, s) in data.predictions},
        )
        for iid in ids
    ]
    texts = {iid: data.texts.get(iid, "") for iid in ids}
    return RunInputs(
        data.run_id,
        data.schemas,
        {s: scored(data, s) for s in data.schemas},
        candidates,
        texts,
        dict(document_frequencies(texts.values())),
        summary,
    )


def _from_files(store: RunStore, record: Mapping[str, Any]) -> RunInputs:
    """The inputs worked out from the run's predictions (read once) and bundle."""
    path = store.paths(record["run_id"]).predictions
    good, bad = read_predictions(path)
    return _inputs_of(run_data(store, record, good), _summary(good, bad, path))


# insight.json is four JSON lines, each read only by what needs it: the run and its predictions' summary, then
# what to label next's inputs, the held-out items the quality report reads, and that report at the page's
# precision.
PARTS = ("next", "held_out", "quality")


def write_inputs(store: RunStore, record: Mapping[str, Any]) -> None:
    """insight.json of a run whose predictions and bundle are in its folder (its finalize)."""
    paths = store.paths(record["run_id"])
    inputs = _from_files(store, record)
    lines = [
        {
            "v": INPUTS_VERSION,
            "run_id": inputs.run_id,
            "schemas": inputs.schemas,
            "summary": inputs.summary,
            "annotations": (read_inputs_file(paths.bundle_inputs) or {}).get("annotations"),
        },
        {
            "candidates": [[c.instance_id, c.uncertainty, c.predicted] for c in inputs.candidates],
            "texts": inputs.texts,
            "documents": inputs.documents,
        },
        {
            "held_out": {
                s: [[i.instance_id, i.gold, i.predicted, i.confidence] for i in items]
                for s, items in inputs.held_out.items()
            }
        },
        {"quality": {s: schema_quality(items, DEFAULT_TARGET_PRECISION) for s, items in inputs.held_out.items()}},
    ]
    write_atomic(
        paths.insight_inputs,
        "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines),
        durable=False,
    )


def _kept(store: RunStore, run_id: str, parts: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """insight.json's first line and the lines of `parts`, as one map; None when there is none of this version."""
    wanted = {1 + PARTS.index(part) for part in parts}
    try:
        with store.paths(run_id).insight_inputs.open(encoding="utf-8") as fh:
            doc = json.loads(fh.readline())
            if not isinstance(doc, dict) or doc.get("v") != INPUTS_VERSION:
                return None
            for number, line in enumerate(fh, 1):  # a line not asked for is read past, one at a time
                if number in wanted:
                    doc.update(json.loads(line))
                    wanted.discard(number)
                if not wanted:
                    break
    except (OSError, ValueError, TypeError):
        return None
    return None if wanted else doc


def predictions_summary_of(store: RunStore, run_id: str) -> dict[str, Any]:
    """The run page's summary of the run's predictions: the one kept at finalize while predictions.jsonl is
    the file it was made from, else made again (a run finalized before it was kept; a file replaced since)."""
    path = store.paths(run_id).predictions
    kept = (_kept(store, run_id) or {}).get("summary")
    if isinstance(kept, dict) and kept.get("file") == _file_signature(path):
        return kept
    return predictions_summary(path)


def read_inputs(store: RunStore, record: Mapping[str, Any], parts: tuple[str, ...] = PARTS) -> RunInputs:
    """The run's insight inputs (the `parts` asked for; the others left empty): its insight.json, else (a run
    finalized before it existed) its files read now. Conflict, as load_run, for a run that has none to read."""
    refuse_unsucceeded(record)
    doc = _kept(store, record["run_id"], parts)
    if doc is None:
        return _from_files(store, record)
    return RunInputs(
        doc["run_id"],
        doc["schemas"],
        {s: [Scored(*row) for row in rows] for s, rows in doc.get("held_out", {}).items()},
        [Candidate(iid, u, p) for iid, u, p in doc.get("candidates", [])],
        doc.get("texts", {}),
        doc.get("documents", {}),
        doc["summary"],
        doc.get("annotations"),
        doc.get("quality"),
    )


# The last reading per project: {output folder: (its annotators' files' names, sizes and times, the items)}.
_LABELLED: dict[str, tuple[list[list[Any]], frozenset[str]]] = {}
_LABELLED_LOCK = threading.Lock()


def labelled_now(config: ProjectConfig, since: list[list[Any]] | None = None) -> frozenset[str]:
    """Every item someone has answered, read again only when an annotator's file changed (name, size, time).
    `since`: the files as a run's bundle was built; unchanged, nothing was labelled since, and the run's
    unlabelled items are all still open: the empty set, nothing read (a 1,000,000-item project's files are
    seconds to parse)."""
    files = annotation_files(config)
    if since is not None and files == since:
        return frozenset()
    key = str(config.output_path)
    with _LABELLED_LOCK:
        known = _LABELLED.get(key)
    if known is not None and known[0] == files:
        return known[1]
    found = frozenset(answered_ids(config))
    with _LABELLED_LOCK:
        _LABELLED[key] = (files, found)
    return found
