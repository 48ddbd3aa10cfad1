"""Potato write-back's own rules: which Potato it writes, a database a running Potato holds locked, the
run when training is off. Potato's store is the real one (potato-annotation 2.12.1, the `potato` extra)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from potato_queue.store import potato_compat
from potato_queue.store.keys import new_run_id, potato_database_path
from potato_queue.store.potato_compat import ledger_status
from potato_queue.store.potato_ledger import PotatoLedger, potato_config, potato_metrics
from potato_queue.store.records import utc_now, utc_of
from potato_queue.validate import load_checked
from tests.conftest import run_cli
from tests.lifecycle_helpers import make_project


def _record(**fields: Any) -> dict[str, Any]:
    return {
        "run_id": new_run_id(),
        "state": "queued",
        "backend": "local",
        "trainer": "sklearn-text",
        "schemas": ["sentiment"],
        "params": {},
        "trigger": "cli",
        "created_at": utc_now(),
        **fields,
    }


def test_a_database_a_running_potato_holds_locked_is_retried_and_the_run_log_says_so(tmp_path: Path) -> None:
    from potato.training import store

    config = load_checked(make_project(tmp_path))
    said: list[str] = []
    ledger = PotatoLedger(config, log=lambda run_id, line: said.append(line))
    record = _record()
    ledger.record(record)  # Potato's tables now exist, as in a project Potato has run on
    holder = sqlite3.connect(potato_database_path(config), check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # Potato mid-write: the one writer's lock is taken
    release = threading.Timer(1.0, holder.rollback)
    release.start()
    try:
        ledger.record({**record, "state": "running", "started_at": utc_now()})
    finally:
        release.join()
        holder.close()
    assert store.load_run(potato_config(config), record["run_id"]).status == "running"
    assert any(
        line.startswith(
            "Potato's database was locked (a running Potato was writing): the run's state (running) recorded after"
        )
        for line in said
    ), said


def test_write_back_refuses_a_potato_outside_the_tested_range_and_the_run_still_succeeds(tmp_path: Path) -> None:
    """A newer Potato is stood in for by its package metadata alone (a dist-info folder first on
    PYTHONPATH), which is all the version check reads; installing a second Potato would cost CI a minute."""
    site = tmp_path / "site" / "potato_annotation-2.13.0.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: potato-annotation\nVersion: 2.13.0\n")
    config = make_project(tmp_path)
    env = {"PYTHONPATH": str(site.parent)}
    checked = run_cli("validate", config, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (
        "Potato write-back is off: potato-annotation 2.13.0 is installed, and potato-queue writes Potato's store "
        "only for the versions it is tested with (>=2.12.1,<2.13); predictions.jsonl is still written; fix: pip "
        "install 'potato-annotation>=2.12.1,<2.13', or a potato-queue tested with 2.13.0"
    ) in checked.stdout
    up = run_cli("up", config, "--port", "0", "--run", "sklearn-text", env=env, timeout_s=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stderr.count("Potato write-back is off: potato-annotation 2.13.0") == 1, up.stderr
    assert (config.parent / "annotation_output" / "training" / "predictions.jsonl").stat().st_size > 0
    assert not potato_database_path(load_checked(config)).exists(), "nothing was written to Potato's store"


def test_a_database_a_potato_we_do_not_know_made_is_refused_with_the_columns(tmp_path: Path) -> None:
    config = load_checked(make_project(tmp_path))
    with sqlite3.connect(potato_database_path(config)) as db:
        db.execute("CREATE TABLE training_runs (project TEXT, run_id TEXT, trainer TEXT, status TEXT)")
    status = ledger_status(config)
    assert not status.on
    assert "has a table training_runs without the column(s) backend, schema_names" in status.why
    said: list[str] = []
    PotatoLedger(config, log=lambda run_id, line: said.append(line)).record(_record())
    assert said == [], "nothing written, nothing to warn about per run: the status said why once"


def test_without_potato_installed_write_back_is_off_and_says_how_to_turn_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test environment has the extra; a second environment without it is stood in for here."""
    monkeypatch.setattr(potato_compat, "installed_potato", lambda: None)
    status = ledger_status(load_checked(make_project(tmp_path)))
    assert not status.on and status.line().startswith("Potato write-back is off: potato-annotation is not installed")
    assert status.fix == "pip install 'potato-queue[potato]' where potato-queue runs (potato-annotation>=2.12.1,<2.13)"


def test_validate_and_check_say_write_back_is_on_and_where(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    db = potato_database_path(load_checked(config))
    for args in (("validate", config), ("training", "check", "local", config)):
        proc = run_cli(*args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"Potato write-back is on: runs, their splits and predictions are recorded in {db}" in proc.stdout


def test_a_project_with_training_off_starts_no_run_and_says_which_key(tmp_path: Path) -> None:
    config = make_project(tmp_path, enabled=False)
    proc = run_cli("training", "run", config, "--trainer", "majority-baseline", "--schema", "sentiment")
    assert proc.returncode == 1
    assert f"error: Training is off for this project: model_training.enabled is false in {config}" in proc.stderr
    assert "fix: set model_training.enabled: true there" in proc.stderr
    assert not (config.parent / "annotation_output" / "training" / "runs").exists()


def test_potatos_page_gets_accuracy_from_the_held_out_test_split() -> None:
    record = {
        "metrics": {"train/loss": 0.3, "val/accuracy": 0.8},
        "held_out": {
            "sentiment": {
                "val": {"accuracy": 0.8, "macro_f1": 0.7, "n": 10},
                "test": {"accuracy": 0.75, "macro_f1": 0.74, "n": 12},
            },
            "topic": {
                "val": {"accuracy": None, "macro_f1": None, "n": 0},
                "test": {"accuracy": 0.5, "macro_f1": 0.4, "n": 4},
            },
        },
    }
    assert potato_metrics(record) == {
        "train_loss": 0.3,
        "val_accuracy": 0.8,
        "val_macro_f1": 0.7,
        "test_accuracy": 0.75,
        "test_macro_f1": 0.74,
        "accuracy": 0.75,
        "macro_f1": 0.74,
        "topic_test_accuracy": 0.5,
        "topic_test_macro_f1": 0.4,
        "topic_accuracy": 0.5,
        "topic_macro_f1": 0.4,
    }


def test_the_config_potato_reads_names_the_project_and_its_task_dir_as_potato_resolves_it(tmp_path: Path) -> None:
    config_path = make_project(tmp_path)
    data = yaml.safe_load(config_path.read_text())
    data["task_dir"] = "./sub/../"
    (config_path.parent / "sub").mkdir()
    config_path.write_text(yaml.safe_dump(data))
    cfg = potato_config(load_checked(config_path))
    assert cfg["task_dir"] == str(config_path.parent) and cfg["annotation_task_name"] == "Review Sentiment"


def test_old_runs_whose_predictions_are_not_live_leave_potatos_store_with_their_items(tmp_path: Path) -> None:
    """Potato's run-items table grows by a run's whole item list each run (20 MB a run at 100,000 items):
    after a success, Potato's own prune keeps the newest retain_runs runs and every run still cited by a
    live prediction, and drops the rest with their items; one run's splits are written whole."""
    from potato.training import store

    config = load_checked(make_project(tmp_path))
    cfg = potato_config(config)
    ledger = PotatoLedger(config, log=lambda run_id, line: None)
    ids = [f"i{n:04d}" for n in range(3000)]
    runs = []
    for n in range(5):
        record = _record(state="succeeded", created_at=utc_of(time.time() - 60 * (5 - n)), finished_at=utc_now())
        ledger.record(record)
        ledger.record_splits(record, {"train": ids[:2000], "val": ids[2000:2500], "test": ids[2500:]})
        # the first run predicted an item no later run predicts again: its prediction stays live
        predicted = ["only-first"] if n == 0 else ids[:10]
        assert ledger.record_predictions(
            record,
            [
                {"instance_id": i, "schema_name": "sentiment", "payload": "positive", "confidence": 0.9}
                for i in predicted
            ],
        )
        runs.append(record["run_id"])
    assert len(store.run_item_splits(cfg, runs[-1])) == 3000
    pruned = ledger.prune({"run_id": runs[-1]}, retain=2)
    assert set(pruned) == set(runs[1:3]) and len(pruned) == 2, "the newest two kept, the first for its live prediction"
    for run_id in runs:
        kept = run_id not in pruned
        assert (store.load_run(cfg, run_id) is not None) == kept
        assert len(store.run_item_splits(cfg, run_id)) == (3000 if kept else 0)
    assert store.all_training_split_ids(cfg) == set(ids[:2000])
