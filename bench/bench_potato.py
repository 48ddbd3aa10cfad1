"""Potato write-back: a run's N predictions into Potato's store, ours against Potato's own.

Side by side on the same project and the same N predictions (unlabeled items, one schema):
1. Potato's own path, `potato.training.writeback.ingest_predictions` (what Potato's manager calls when
   its own run ends: store every prediction, gate, publish), with item publication left out (there is
   no running Potato server here), so both sides write the same rows;
2. potato-queue's finalize path for a run: refuse what is not this run's, store through Potato's
   functions (potato_ledger), gate by Potato's four rules, write predictions.jsonl.

Prints the seconds of each and the ratio (ours / Potato's).

    .venv/bin/python bench/bench_potato.py [--items 20000]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import yaml  # noqa: E402

from bench.quick import quick_args  # noqa: E402
from potato_queue.processes.embedded_redis import EmbeddedRedis  # noqa: E402
from potato_queue.runs.finalize import finalize_predictions  # noqa: E402
from potato_queue.store import RunStore  # noqa: E402
from potato_queue.store.potato_ledger import potato_config  # noqa: E402
from potato_queue.validate import load_checked  # noqa: E402

__all__ = ["main"]


def _project(folder: Path, n: int) -> Path:
    (folder / "data").mkdir(parents=True)
    items = [{"id": f"i{k:06d}", "text": f"review number {k}"} for k in range(n)]
    (folder / "data" / "items.json").write_text(json.dumps(items))
    (folder / "annotation_output").mkdir()
    config = {
        "annotation_task_name": "bench",
        "task_dir": ".",
        "data_files": ["data/items.json"],
        "output_annotation_dir": "annotation_output",
        "admin_api_key": "bench-admin-key-123",
        "annotation_schemes": [{"annotation_type": "radio", "name": "sentiment", "labels": ["positive", "negative"]}],
        "model_training": {
            "enabled": True,
            "writeback": {"schemas": ["sentiment"], "min_confidence": 0.6, "include_unlabeled": True},
        },
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder / "config.yaml"


def _predictions(ids: list[str]) -> list[str]:
    rng = random.Random(0)
    lines = []
    for item in ids:
        confidence = round(rng.uniform(0.5, 1.0), 4)
        label = rng.choice(["positive", "negative"])
        lines.append(
            json.dumps(
                {
                    "instance_id": item,
                    "schema_name": "sentiment",
                    "payload": {"label": label, "confidence": confidence},
                    "confidence": confidence,
                }
            )
        )
    return lines


def _bundle(run_dir: Path, ids: list[str]) -> None:
    bundle = run_dir / "bundle"
    bundle.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        (bundle / f"{split}.jsonl").write_text("")
    (bundle / "unlabeled.jsonl").write_text("".join(json.dumps({"instance_id": i, "text": i}) + "\n" for i in ids))
    (bundle / "manifest.json").write_text(
        json.dumps({"schemas": [{"name": "sentiment", "kind": "nominal", "labels": ["negative", "positive"]}]})
    )


def potato_side(folder: Path, n: int) -> float:
    from potato.training import store, writeback

    config = load_checked(_project(folder, n))
    cfg = potato_config(config)
    ids = [f"i{k:06d}" for k in range(n)]
    path = folder / "predictions.jsonl"
    path.write_text("\n".join(_predictions(ids)) + "\n")
    run = store.TrainingRun(run_id="20260101T000000-000001", trainer="sklearn-text", status="success")
    store.record_run(cfg, run)

    class NoServer:  # Potato's item manager: no items are loaded without its server
        def set_prediction(self, *a: object, **k: object) -> bool:
            return False

        def clear_prediction(self, *a: object, **k: object) -> bool:
            return False

    started = time.perf_counter()
    report = writeback.ingest_predictions(run, str(path), cfg, item_manager=NoServer())
    took = time.perf_counter() - started
    assert report.n_read == n, report.to_dict()
    return took


def ours(folder: Path, n: int, client: redis.Redis) -> float:
    config = load_checked(_project(folder, n))
    store = RunStore(config, client)
    record = store.create(trainer="sklearn-text", schemas=["sentiment"], backend="local")
    ids = [f"i{k:06d}" for k in range(n)]
    paths = store.paths(record["run_id"])
    _bundle(paths.dir, ids)
    paths.predictions.write_text("\n".join(_predictions(ids)) + "\n")
    started = time.perf_counter()
    _, prelabels = finalize_predictions(config, store, record)
    took = time.perf_counter() - started
    assert prelabels is not None and prelabels["predictions"] == n, prelabels
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=20000)
    args = quick_args(parser, items=500)
    tmp = Path(tempfile.mkdtemp(prefix="bench-potato-"))
    server = EmbeddedRedis(tmp / "redis")
    try:
        client = redis.Redis.from_url(server.start())
        theirs_s = potato_side(tmp / "potato", args.items)
        ours_s = ours(tmp / "ours", args.items, client)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"{args.items} predictions into Potato's store: Potato's own ingest {theirs_s:.2f} s, "
        f"potato-queue's finalize {ours_s:.2f} s (refuse, store, gate, predictions.jsonl), "
        f"ratio {ours_s / theirs_s:.2f}"
    )


if __name__ == "__main__":
    main()
