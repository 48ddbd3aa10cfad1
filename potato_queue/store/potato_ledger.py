"""Potato's own training store: every run, its splits and its predictions, where Potato reads them.

Potato 2.12 keeps its training runs in the project's database, `<task_dir>/project.sqlite`
(training_runs, training_run_items, training_predictions). Its Training page and runs API read
those tables on every request; at its start it publishes the stored predictions that pass its
four rules as prelabels. Recording a run there is what makes it reach an annotation team.

Every write goes through Potato's own functions (`potato.training.store`), so Potato keeps its
tables, migrations and encoding; the only SQL of ours is potato_compat.py's read-only look at the
columns, which turns write-back off for a database a Potato we were not tested with made. Nothing here
may end a run: a write that fails is a warning in run.log, and predictions.jsonl is written either way.
"""

from __future__ import annotations

import logging
import socket
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from potato_queue.clock import REAL_CLOCK, Clock
from potato_queue.config import LOCAL, ProjectConfig
from potato_queue.lab.usage import usage_metrics
from potato_queue.run import RunState
from potato_queue.store.keys import potato_database_path, potato_task_dir
from potato_queue.store.potato_compat import LedgerStatus, ledger_status
from potato_queue.store.records import epoch_of

__all__ = [
    "RUN_STATE_IN_POTATO",
    "OWNED_BY_POTATO",
    "potato_config",
    "potato_metrics",
    "potato_run_fields",
    "PotatoLedger",
]

RUN_STATE_IN_POTATO = {
    RunState.QUEUED: "queued",
    RunState.STARTING: "building",
    RunState.RUNNING: "running",
    RunState.COLLECTING: "evaluating",
    RunState.SUCCEEDED: "success",
    RunState.FAILED: "error",
    RunState.CANCELLED: "cancelled",
}
# Potato keeps a run's unlabeled items out of its run items: they are predicted on, never fitted on.
RECORDED_SPLITS = ("train", "val", "test")
# A run record with this field set was started by Potato's own manager, which records it itself.
OWNED_BY_POTATO = "potato_run_id"

# How long one write keeps retrying a database a running Potato holds locked; each try waits
# BUSY_TIMEOUT_MS inside SQLite, so the retries (and the line saying so) are ours.
LOCKED_RETRY_S = 30.0
BUSY_TIMEOUT_MS = 250

_log = logging.getLogger("potato_queue.potato")


def potato_config(config: ProjectConfig) -> dict[str, Any]:
    """The part of Potato's config dict its store and write-back functions read."""
    out: dict[str, Any] = {
        "task_dir": potato_task_dir(config),
        "model_training": {"writeback": config.model_training.writeback.model_dump()},
    }
    if config.annotation_task_name is not None:
        out["annotation_task_name"] = config.annotation_task_name
    return out


def potato_metrics(record: Mapping[str, Any]) -> dict[str, Any]:
    """A run's numbers as Potato's page lists them: the training metrics as `<split>_<name>`, then the
    held-out scores, `accuracy` (which the runs table shows) being the first schema's test accuracy."""
    out: dict[str, Any] = {}
    for key, value in (record.get("metrics") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key.replace("/", "_")] = value
    held_out = record.get("held_out") or {}
    for position, (schema, splits) in enumerate(held_out.items()):
        prefix = "" if position == 0 else f"{schema}_"
        for split in ("val", "test"):
            for name in ("accuracy", "macro_f1"):
                value = (splits.get(split) or {}).get(name)
                if value is not None:
                    out[f"{prefix}{split}_{name}"] = value
        test = splits.get("test") or {}
        for name in ("accuracy", "macro_f1"):
            if test.get(name) is not None:
                out[f"{prefix}{name}"] = test[name]
    out.update(usage_metrics(record.get("gpu_usage")))
    return out


def _error_code(record: Mapping[str, Any]) -> str:
    if record.get("state") == RunState.CANCELLED:
        return "cancelled"
    if record.get("state") != RunState.FAILED:
        return ""
    code = record.get("exit_code")
    return f"exit_{code}" if code is not None else "potato_queue"


def potato_run_fields(record: Mapping[str, Any], *, split_seed: int, host: str, now_s: float) -> dict[str, Any]:
    """A potato-queue run record as the fields of Potato's TrainingRun (text in, text out); `now_s` stands in
    for a creation time the record lacks."""
    bundle = record.get("bundle") or {}
    counts = bundle.get("n") or {}
    return {
        "run_id": record["run_id"],
        "trainer": record["trainer"],
        "backend": f"potato-queue/{record['backend']}",
        "schema_names": list(record.get("schemas") or []),
        "kinds": list(bundle.get("kinds") or []),
        "status": RUN_STATE_IN_POTATO.get(record["state"], "error"),
        "trigger": record.get("trigger") or "api",
        "created_at": epoch_of(record.get("created_at")) or now_s,
        "started_at": epoch_of(record.get("started_at")),
        "finished_at": epoch_of(record.get("finished_at")),
        "n_train": int(counts.get("train", 0)),
        "n_val": int(counts.get("val", 0)),
        "n_test": int(counts.get("test", 0)),
        "split_seed": split_seed,
        "params": dict(record.get("params") or {}),
        "metrics": potato_metrics(record),
        "artifact_dir": record.get("artifact_uri") or "",
        "model_version": record.get("model_version") or "",
        "bundle_digest": bundle.get("digest") or "",
        "error": record.get("error") or "",
        "error_code": _error_code(record),
        "pid": None,
        "host": host,
    }


def _locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class PotatoLedger:
    """One project's runs mirrored into Potato's store; with write-back off, nothing (said once)."""

    def __init__(self, config: ProjectConfig, log: Callable[[str, str], None], clock: Clock = REAL_CLOCK) -> None:
        self.config, self.clock = config, clock
        self._log = log  # (run_id, line) -> run.log
        self._status: LedgerStatus | None = None
        self._cfg = potato_config(config)
        self._host = {
            name: getattr(config.model_training.backend_config(name), "host", None)
            for name in config.model_training.backend_names()
        }
        self._busy_timeout_set = False

    @property
    def status(self) -> LedgerStatus:
        if self._status is None:
            self._status = ledger_status(self.config)
            _log.info("%s", self._status.line())
        return self._status

    def _store(self) -> Any:
        from potato.persistence import get_db
        from potato.training import store

        if not self._busy_timeout_set:
            get_db(self._cfg["task_dir"]).execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._busy_timeout_set = True
        return store

    def _write(self, run_id: str, what: str, write: Callable[[Any], Any]) -> bool:
        """One write through Potato's store, retried while the database is locked; False when it failed."""
        started, tries = time.monotonic(), 0
        while True:
            try:
                write(self._store())
                break
            except sqlite3.OperationalError as exc:
                if not _locked(exc) or time.monotonic() - started > LOCKED_RETRY_S:
                    return self._failed(run_id, what, exc)
                tries += 1
                time.sleep(min(0.05 * 2**tries, 1.0))
            except Exception as exc:  # Potato's own code: whatever it raises, the run goes on
                return self._failed(run_id, what, exc)
        if tries:
            self._log(
                run_id,
                f"Potato's database was locked (a running Potato was writing): {what} recorded "
                f"after {tries} retr{'y' if tries == 1 else 'ies'}",
            )
        return True

    def _failed(self, run_id: str, what: str, exc: Exception) -> bool:
        self._log(
            run_id,
            f"warning: {what} could not be recorded in Potato's store "
            f"({potato_database_path(self.config)}): {type(exc).__name__}: {exc}",
        )
        return False

    def record(self, record: Mapping[str, Any]) -> None:
        """The run as it is now: on submit and at each change of state."""
        if record.get(OWNED_BY_POTATO) or not self.status.on:
            return
        # Potato fills an empty host with its own machine's name, which an agent's run never ran on.
        host = self._host.get(record["backend"]) or (
            socket.gethostname() if record["backend"] == LOCAL else f"an agent of {record['backend']}"
        )
        fields = potato_run_fields(
            record, split_seed=self.config.model_training.split_seed, host=host, now_s=self.clock.now_s()
        )

        def write(store: Any) -> None:
            store.record_run(self._cfg, store.TrainingRun(**fields))

        self._write(record["run_id"], f"the run's state ({fields['status']})", write)

    def record_splits(self, record: Mapping[str, Any], split_ids: dict[str, list[str]]) -> None:
        """Which item went into which split: Potato's leak guard never prelabels a `train` item."""
        if record.get(OWNED_BY_POTATO) or not self.status.on:
            return
        splits = {name: split_ids.get(name, []) for name in RECORDED_SPLITS}
        self._write(
            record["run_id"],
            "the run's splits",
            self._in_one_transaction(lambda store: store.record_run_items(self._cfg, record["run_id"], splits)),
        )

    def _in_one_transaction(self, write: Callable[[Any], Any]) -> Callable[[Any], None]:
        """`write` (many rows through one of Potato's functions, which commits at its end) in one transaction:
        Potato's connection commits each statement by itself, so 100,000 rows are 100,000 commits otherwise
        (bench/bench_scale.py measures it). All or nothing, and still short."""

        def in_one(store: Any) -> None:
            from potato.persistence import get_db

            conn = get_db(self._cfg["task_dir"])
            conn.execute("BEGIN IMMEDIATE")
            try:
                write(store)
            finally:
                if conn.in_transaction:
                    conn.rollback()

        return in_one

    def prune(self, record: Mapping[str, Any], retain: int) -> list[str]:
        """After a run succeeded, Potato's own pruning (potato.training.store.prune_runs, as Potato's manager
        runs it): the finished runs beyond the newest `retain` whose predictions are no longer live (a newer
        run's replaced them, or they were retracted) leave Potato's store with their run items, which would
        otherwise grow by a run's whole item list every run. The ids pruned."""
        if record.get(OWNED_BY_POTATO) or not self.status.on:
            return []
        pruned: list[str] = []
        self._write(
            record["run_id"],
            "the pruning of old runs",
            lambda store: pruned.extend(store.prune_runs(self._cfg, retain)),
        )
        return pruned

    def record_predictions(self, record: Mapping[str, Any], predictions: Iterable[dict[str, Any]]) -> bool:
        """Every valid prediction, ungated (Potato gates when it publishes); a newer run's replace an older's."""
        if record.get(OWNED_BY_POTATO) or not self.status.on:
            return False
        rows = [
            (str(p["instance_id"]), str(p["schema_name"]), p.get("payload"), p.get("confidence")) for p in predictions
        ]

        return self._write(
            record["run_id"],
            f"{len(rows)} predictions",
            self._in_one_transaction(lambda store: store.record_predictions(self._cfg, record["run_id"], rows)),
        )

    def _read(self, what: str, read: Callable[[Any], Any]) -> Any:
        """A read of Potato's store; None when write-back is off or the read failed (the caller then
        falls back to what potato-queue keeps itself)."""
        if not self.status.on:
            return None
        try:
            return read(self._store())
        except Exception as exc:  # Potato's own code: whatever it raises, the run goes on
            _log.warning("Potato's store could not be read (%s): %s: %s", what, type(exc).__name__, exc)
            return None

    def leak_guard(self) -> set[str] | None:
        """Every item any recorded run fitted on."""
        found: set[str] | None = self._read(
            "the leak guard", lambda store: set(store.all_training_split_ids(self._cfg))
        )
        return found

    def rejected(self) -> set[tuple[str, str]]:
        """(item, schema) pairs a reviewer rejected in Potato's model review."""

        def read(_store: Any) -> set[tuple[str, str]]:
            from potato import model_review

            return {
                (v.instance_id, v.schema_name) for v in model_review.load_verdicts(self._cfg) if v.verdict == "reject"
            }

        return self._read("reviewer rejections", read) or set()

    def stored_predictions(self) -> list[dict[str, Any]] | None:
        """Every prediction in Potato's store, latest per item and schema."""
        found: list[dict[str, Any]] | None = self._read(
            "the stored predictions", lambda store: list(store.load_predictions(self._cfg))
        )
        return found
