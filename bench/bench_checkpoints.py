"""Checkpoints: what they cost a run, and what they save one that is preempted, against the alternatives.

    .venv/bin/python bench/bench_checkpoints.py [--epochs 30] [--every 5] [--items 400] [--quick]

--quick: 64 items, 2 epochs, a checkpoint every update, the independent runs two at a time, and the
started-over side's second half the no-checkpoint run already timed (--side-by-side, --reuse-none).

Both sides are the real worker (`python -m potato_queue.worker`) running hf-llm-lora on the CPU, on a
small Llama built here (4 layers, 128 wide) and a synthetic project of 400 items:

- cost: the same run with a checkpoint every `--every` updates, against the run with none
  (`checkpoint_every_steps: 0`), the alternative of a trainer that cannot resume; goal: at most 1.10x.
- resume: a run preempted (SIGUSR1) at half its updates and resumed from its checkpoint, against the
  same run preempted there and started over, which is what a job without checkpoints does when it is
  requeued; both measured from the first start to the end, the preempted part counted; goal: under 0.80x.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.quick import both, quick_args  # noqa: E402
from tests.e2e.trainers.test_worker import synthetic_items, worker_env, write_bundle, write_spec  # noqa: E402
from tests.tiny_llm import build_tiny_llm  # noqa: E402

SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def run(spec: Path, preempt_at: int | None = None) -> tuple[float, int, int]:
    """Wall seconds, exit code, the last train update seen; SIGUSR1 at update `preempt_at`."""
    started_s = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "potato_queue.worker", "--spec", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=worker_env(),
        cwd=str(ROOT),
    )
    last = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "progress" and event["phase"] == "train":
            last = int(event["current"])
            if preempt_at is not None and last == preempt_at:
                proc.send_signal(signal.SIGUSR1)
                preempt_at = None
    return time.monotonic() - started_s, proc.wait(), last


def fresh(tmp: Path, name: str, bundle: Path, params: dict[str, Any]) -> Path:
    folder = tmp / name
    folder.mkdir()
    return write_spec(folder, bundle, "hf-llm-lora", params)


def report(name: str, ours: float, theirs: float, what: str, goal: str) -> None:
    print(f"{name}: {what}: {ours:.2f} s against {theirs:.2f} s, ratio {ours / theirs:.2f} (goal {goal})", flush=True)


Timed = tuple[float, int, int]  # run()'s


def cost(tmp: Path, bundle: Path, base: dict[str, Any], args: argparse.Namespace) -> Timed:
    """The checkpoint cost's runs, its line printed; the run without checkpoints (the updates: its last)."""
    none, every = both(
        lambda: run(fresh(tmp, "none", bundle, {**base, "checkpoint_every_steps": 0})),
        lambda: run(fresh(tmp, "every", bundle, {**base, "checkpoint_every_steps": args.every})),
        args.side_by_side,
    )
    assert none[1] == every[1] == 0, (none, every)
    report("checkpoint cost", every[0], none[0], f"{none[2]} updates, a checkpoint every {args.every}", "<= 1.10")
    return none


def resume(tmp: Path, bundle: Path, base: dict[str, Any], args: argparse.Namespace, none: Timed) -> None:
    """Preempted at half the updates: resumed from a checkpoint, against started over (the preempted part counted
    in both). The second half of the started-over side is a run without checkpoints, the same as `none`: with
    --reuse-none, that run's time, not another's."""
    half = none[2] // 2
    spec = fresh(tmp, "resumed", bundle, {**base, "checkpoint_every_steps": args.every})

    def resumed() -> tuple[Timed, Timed]:
        return run(spec, preempt_at=half), run(spec)

    def started_over() -> tuple[Timed, Timed]:
        lost = run(fresh(tmp, "over", bundle, {**base, "checkpoint_every_steps": 0}), preempt_at=half)
        return lost, none if args.reuse_none else run(
            fresh(tmp, "again", bundle, {**base, "checkpoint_every_steps": 0})
        )

    (cut, rest), (lost, again) = both(resumed, started_over, args.side_by_side)
    codes = (cut[1], rest[1], lost[1], again[1])
    assert codes == (6, 0, 6, 0), codes
    report(
        "resume",
        cut[0] + rest[0],
        lost[0] + again[0],
        f"preempted at update {half} of {none[2]}, resumed vs started over",
        "< 0.80",
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--side-by-side", action="store_true", help="two runs at a time (the figures mean nothing)")
    parser.add_argument("--reuse-none", action="store_true", help="start over with the no-checkpoint run's time")
    args = quick_args(parser, epochs=2, every=1, items=64, side_by_side=True, reuse_none=True)
    with tempfile.TemporaryDirectory(prefix="pq-bench-ckpt-") as folder:
        tmp = Path(folder)
        items = synthetic_items(args.items)
        model = build_tiny_llm(tmp / "model", [i["text"] for i in items], **SHAPE)
        bundle = tmp / "bundle"
        write_bundle(bundle, items)
        base = {
            "model_name": str(model),
            "epochs": args.epochs,
            "batch_size": 8,
            "grad_accum_steps": 2,
            "max_length": 16,
            "lora": {"r": 8, "alpha": 16},
        }
        resume(tmp, bundle, base, args, cost(tmp, bundle, base, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
