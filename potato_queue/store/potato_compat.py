"""Whether runs are written back into Potato's own store (project.sqlite), and why (not).

Write-back needs potato-annotation installed here, in the range potato-queue is tested with, and a
database whose tables have the columns we write. validate, `training check` and the Training page say so
before any run; the ledger (potato_ledger.py) asks once and writes nothing when it is off. This is the
only part that looks at the installed Potato and at the database's schema, with no write, so it lives
apart from the writer.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from potato_queue.config import ProjectConfig
from potato_queue.store.keys import potato_database_path

__all__ = [
    "POTATO_DIST",
    "TESTED_RANGE",
    "INSTALL_FIX",
    "COLUMNS",
    "LedgerStatus",
    "ledger_status",
    "installed_potato",
    "columns_problem",
]

POTATO_DIST = "potato-annotation"
TESTED_RANGE = ">=2.12.1,<2.13"
_TESTED_FROM, _TESTED_BEFORE = (2, 12, 1), (2, 13)
INSTALL_FIX = "pip install 'potato-queue[potato]' where potato-queue runs (potato-annotation>=2.12.1,<2.13)"

# The columns potato-queue writes through Potato's functions, as Potato 2.12 creates them.
COLUMNS: dict[str, tuple[str, ...]] = {
    "training_runs": (
        "project",
        "run_id",
        "trainer",
        "backend",
        "schema_names",
        "kinds",
        "status",
        "trigger",
        "created_at",
        "started_at",
        "finished_at",
        "n_train",
        "n_val",
        "n_test",
        "split_seed",
        "params",
        "metrics",
        "artifact_dir",
        "model_version",
        "bundle_digest",
        "error",
        "error_code",
        "pid",
        "host",
    ),
    "training_run_items": ("project", "run_id", "instance_id", "split"),
    "training_predictions": ("project", "instance_id", "schema_name", "run_id", "payload", "confidence", "created_at"),
}


def installed_potato() -> str | None:
    try:
        return metadata.version(POTATO_DIST)
    except metadata.PackageNotFoundError:
        return None


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def columns_problem(db: Path) -> str | None:
    """Why the database cannot take our writes (a table without a column we write), or None."""
    if not db.exists():
        return None  # Potato's own functions create the tables
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            have = {t: {row[1] for row in conn.execute(f"PRAGMA table_info({t})")} for t in COLUMNS}
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return f"{db} cannot be read: {exc}"
    for table, wanted in COLUMNS.items():
        missing = [c for c in wanted if have[table] and c not in have[table]]
        if missing:
            return (
                f"{db} has a table {table} without the column(s) {', '.join(missing)}: a Potato version "
                f"potato-queue was not tested with made it"
            )
    return None


@dataclass(frozen=True)
class LedgerStatus:
    """Whether runs are recorded in Potato's store, and why (not)."""

    on: bool
    why: str
    fix: str | None = None

    def line(self) -> str:
        text = f"Potato write-back is {'on' if self.on else 'off'}: {self.why}"
        return f"{text}; fix: {self.fix}" if self.fix else text


def ledger_status(config: ProjectConfig) -> LedgerStatus:
    """Checked without writing anything (validate and training check call it)."""
    version, db = installed_potato(), potato_database_path(config)
    if not config.model_training.enabled:
        return LedgerStatus(
            False, "model_training.enabled is false, so no run starts", "set model_training.enabled: true"
        )
    if version is None:
        return LedgerStatus(
            False,
            f"potato-annotation is not installed here, so Potato's Training page and "
            f"prelabels ({db}) do not see these runs; predictions.jsonl is still written",
            INSTALL_FIX,
        )
    if not _TESTED_FROM <= _version_tuple(version) < _TESTED_BEFORE:
        return LedgerStatus(
            False,
            f"potato-annotation {version} is installed, and potato-queue writes Potato's "
            f"store only for the versions it is tested with ({TESTED_RANGE}); "
            f"predictions.jsonl is still written",
            f"pip install 'potato-annotation{TESTED_RANGE}', or a potato-queue tested with {version}",
        )
    problem = columns_problem(db)
    if problem is not None:
        return LedgerStatus(
            False,
            f"{problem}; predictions.jsonl is still written",
            f"run the Potato version that made {db.name} in the range {TESTED_RANGE}",
        )
    return LedgerStatus(True, f"runs, their splits and predictions are recorded in {db} (potato-annotation {version})")
