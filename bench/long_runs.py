"""The long runs of the benchmarks that cancel, stop or time a run (bench_lifecycle, bench_agent, bench_ssh,
bench_slurm): the fine-tune their figures are measured on, or, with --quick, majority-baseline.

majority-baseline's `hold_s` is a run in the train phase that honours a stop as the fine-tune does, in a worker that
imports no torch (a fine-tune's worker spends about 3 s of a core on that before it reads its bundle, and a bench
built a tiny model first, as long again): the queue's side of each figure is the same (trainers/majority.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tests.lifecycle_helpers import build_tiny_model

__all__ = ["HF", "HOLD", "trainer_arg", "until_stopped", "fit"]

HF = "hf-text-classification"
HOLD = "majority-baseline"


def trainer_arg(parser: argparse.ArgumentParser, runs: str) -> None:
    """--trainer, for quick_args (a default of None: a trainer given with --quick still wins)."""
    parser.add_argument("--trainer", choices=[HF, HOLD], default=None, help=f"{runs}' trainer (default {HF})")


def until_stopped(tmp: Path, trainer: str) -> dict[str, Any]:
    """The params of a `trainer` run that trains until it is stopped (its tiny model built in `tmp`)."""
    if trainer == HOLD:
        return {"hold_s": 600}
    return {"model_name": str(_tiny_model(tmp)), "epochs": 1000, "batch_size": 4}


def fit(tmp: Path, trainer: str, epochs: int) -> dict[str, Any]:
    """The params of a run that fits and ends: `epochs` of the tiny fine-tune (majority-baseline has none)."""
    if trainer == HOLD:
        return {}
    return {"model_name": str(_tiny_model(tmp)), "epochs": epochs, "batch_size": 8}


def _tiny_model(tmp: Path) -> Path:
    return build_tiny_model(tmp / "model")
