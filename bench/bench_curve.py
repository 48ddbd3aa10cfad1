"""A learning curve as one run, against the same four fits by hand.

    .venv/bin/python bench/bench_curve.py [--trainer sklearn-text|hf-text-classification]

Both sides are the real worker (`python -m potato_queue.worker`) on the README's example project
(examples/reviews, bundled as a run bundles it):

- one run with `learning_curve: true` (the trainer fit on 25, 50, 75 and 100 % of the train items);
- by hand, what an admin does without it: four worker runs, each on a copy of the bundle whose train
  split is cut to the same items (the same nested, seeded shares).

It prints both walls, their ratio, and the curve run's overhead beyond its fits: its wall less the
seconds each fit reported (goal: a few seconds). hf-text-classification fine-tunes a small BERT built
here (no download), 3 epochs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.quick import quick_args  # noqa: E402
from potato_queue.bundle import build_bundle  # noqa: E402
from potato_queue.validate import load_checked  # noqa: E402
from potato_queue.wire.curve import CURVE_PERCENTS, curve_train_ids  # noqa: E402
from tests.e2e.trainers.test_worker import worker_env, write_spec  # noqa: E402
from tests.lifecycle_helpers import build_tiny_model  # noqa: E402


def spec_in(folder: Path, bundle: Path, trainer: str, params: dict[str, Any]) -> Path:
    folder.mkdir()
    return write_spec(folder, bundle, trainer, params)  # seed 7


def run(spec: Path) -> tuple[float, list[dict[str, Any]]]:
    """Wall seconds and the run's events."""
    started_s = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
        capture_output=True,
        text=True,
        env=worker_env(),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        timeout=3600,
    )
    wall_s = time.monotonic() - started_s
    if done.returncode != 0:
        raise SystemExit(f"the worker failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall_s, [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def cut_bundle(bundle: Path, out: Path, keep: set[str]) -> Path:
    shutil.copytree(bundle, out)
    rows = [
        line for line in (bundle / "train.jsonl").read_text().splitlines() if json.loads(line)["instance_id"] in keep
    ]
    (out / "train.jsonl").write_text("".join(line + "\n" for line in rows))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["splits"]["train"]["n"] = len(rows)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", default="sklearn-text", choices=["sklearn-text", "hf-text-classification"])
    args = quick_args(parser)  # the sizes are the example project's already
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        bundle = tmp / "bundle"
        build_bundle(load_checked(ROOT / "examples" / "reviews" / "config.yaml"), bundle, ["sentiment"])
        params: dict[str, Any] = {}
        if args.trainer == "hf-text-classification":
            params = {
                "model_name": str(build_tiny_model(tmp / "model")),
                "epochs": 3,
                "batch_size": 16,
                "max_length": 64,
            }
        curve_wall_s, events = run(spec_in(tmp / "curve", bundle, args.trainer, {**params, "learning_curve": True}))
        fits_s = sum(
            e["value"]
            for e in events
            if e["event"] == "metric" and e["split"] == "curve" and e["name"].endswith("/seconds")
        )
        train_ids = [json.loads(line)["instance_id"] for line in (bundle / "train.jsonl").read_text().splitlines()]
        hand_s = 0.0
        for percent in CURVE_PERCENTS:
            cut = cut_bundle(bundle, tmp / f"bundle-{percent}", set(curve_train_ids(train_ids, percent, 7)))
            hand_s += run(spec_in(tmp / f"hand-{percent}", cut, args.trainer, params))[0]
    print(
        f"learning curve, {args.trainer}, examples/reviews ({len(train_ids)} train items), "
        f"fits at {', '.join(map(str, CURVE_PERCENTS))} %:"
    )
    print(
        f"  one run with learning_curve: {curve_wall_s:.2f} s; four runs by hand: {hand_s:.2f} s; "
        f"ratio {curve_wall_s / hand_s:.2f}"
    )
    print(
        f"  the curve run's overhead beyond its fits (wall less the fits' own seconds): {curve_wall_s - fits_s:.2f} s "
        f"(goal: a few seconds)"
    )


if __name__ == "__main__":
    main()
