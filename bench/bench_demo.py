"""The README's first command, and its fine-tune through the queue against the same fine-tune by hand.

    .venv/bin/python bench/bench_demo.py first-command   a fresh clone: `make venv`, then `make demo`, timed
    .venv/bin/python bench/bench_demo.py p9              the demo's fine-tune (all-MiniLM-L6-v2 on
                                                         examples/reviews): through the queue vs the worker
                                                         started by hand on the same bundle
    .venv/bin/python bench/bench_demo.py all
    .venv/bin/python bench/bench_demo.py all --quick     P9 with one epoch of a tiny BERT, its hand run beside
                                                         the queue's; no first command

first-command clones this checkout's HEAD into a temporary folder and runs the
README's command there as a new user would (pip's cache warm, as on a second
machine of the same admin); its Redis is the embedded one (POTATO_QUEUE_REDIS_URL
points where nothing answers). Everything is real: no step is skipped.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_lifecycle import epoch, first_bundle, hand_worker, report  # noqa: E402
from bench.quick import quick_args  # noqa: E402
from potato_queue.processes.embedded_redis import EmbeddedRedis  # noqa: E402
from tests.lifecycle_helpers import TERMINAL, Services, build_tiny_model, make_project  # noqa: E402

# The Makefile's demo params for hf-text-classification (keep them in step).
DEMO_PARAMS = {"epochs": 8, "batch_size": 8, "learning_rate": 1e-4}
NOBODY = "redis://127.0.0.1:9/0"  # the discard port: no Redis answers, so `up` starts its own


def first_command(tmp: Path) -> None:
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home()), "POTATO_QUEUE_REDIS_URL": NOBODY}
    t0 = time.monotonic()
    subprocess.run(["make", "venv"], cwd=clone, env=env, check=True, capture_output=True)
    venv_s = time.monotonic() - t0
    t1 = time.monotonic()
    done = subprocess.run(["make", "demo"], cwd=clone, env=env, capture_output=True, text=True)
    demo_s = time.monotonic() - t1
    if done.returncode != 0:
        raise SystemExit(f"make demo failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    table = done.stdout.split("Held-out scores, the same split for every run:\n", 1)[1].split("\n\n", 1)[0]
    print(table)
    hf = re.search(r"^hf-text-classification .* (\d+) s$", table, re.M)
    print(
        f"first command: make venv {venv_s:.0f} s (warm pip cache) + make demo {demo_s:.0f} s = "
        f"{venv_s + demo_s:.0f} s; the fine-tune itself {hf.group(1) if hf else '?'} s",
        flush=True,
    )


def by_hand(tmp: Path, bundle: Path, params: dict[str, Any]) -> float:
    """The worker started by hand on the run's bundle: its wall seconds."""
    t0 = time.monotonic()
    proc, _ = hand_worker(tmp, bundle, "hf-text-classification", params, "p9-demo")
    proc.communicate()
    assert proc.returncode == 0, proc.returncode
    return time.monotonic() - t0


def p9(tmp: Path, quick: bool = False, side_by_side: bool = False) -> None:
    """The demo's fine-tune; --quick: one epoch of a tiny BERT built here (the path, not the figure), the hand
    run at the same time as the queue's (`side_by_side`), not after it."""
    model = str(build_tiny_model(tmp / "model")) if quick else "sentence-transformers/all-MiniLM-L6-v2"
    params = {"model_name": model, **DEMO_PARAMS, **({"epochs": 1, "max_length": 64} if quick else {})}
    with tempfile.TemporaryDirectory() as folder, EmbeddedRedis(Path(folder)) as redis, ThreadPoolExecutor(1) as aside:
        svc = Services(make_project(tmp / "queue", source=ROOT / "examples" / "reviews"), redis.url, tmp / "queue")
        try:
            svc.serve()
            svc.executor()
            bundle = first_bundle(svc)
            hand = aside.submit(by_hand, tmp, bundle, params) if side_by_side else None
            posted = time.time()
            run_id = svc.start_run(trainer="hf-text-classification", schemas=["sentiment"], params=params)
            run = svc.wait_for(run_id, TERMINAL, timeout_s=3600)
            assert run["state"] == "succeeded", run
            queue_s = epoch(run["finished_at"]) - posted
        finally:
            svc.stop()
    report(
        "P9",
        queue_s,
        hand.result() if hand else by_hand(tmp, bundle, params),
        "s",
        f"the demo's fine-tune ({'a tiny BERT' if quick else 'all-MiniLM-L6-v2'}, {params['epochs']} epochs, 244 items, CPU)",
        "ratio <= 1.05",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["first-command", "p9", "all"])
    parser.add_argument("--side-by-side", action="store_true", help="P9's hand run at once with the queue's")
    args = quick_args(parser, side_by_side=True)
    with tempfile.TemporaryDirectory(prefix="pq-bench-demo-") as folder:
        tmp = Path(folder)
        if args.which in ("p9", "all"):
            p9(tmp / "p9", quick=args.quick, side_by_side=args.side_by_side)
        if args.which in ("first-command", "all") and args.quick:
            print("first command: not run with --quick (a fresh venv and the whole demo take minutes)")
        elif args.which in ("first-command", "all"):
            first_command(tmp / "first")


if __name__ == "__main__":
    main()
