"""Every benchmark still runs to its figure: each file in bench/, in its quick mode (small sizes, seconds).

No time is asserted here (speed is measured by the benchmarks themselves, full size, and quoted in notes);
what fails here is a benchmark that no longer runs. bench_events.py failed at once from a fresh clone for
several releases (it wrote a job by hand, in a shape the agent no longer took) and nobody saw. Each one runs
as a user runs it, `python bench/<file> ... --quick` from the checkout, on the suite's private Redis (its
environment), its real sshd, SLURM and network namespaces started by the benchmark itself.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_history import FIGURES as HISTORY_FIGURES

ROOT = Path(__file__).resolve().parents[3]
NUMBER = r"[0-9][0-9,.]*"

# file: (its arguments besides --quick, the figures its output must reach: one pattern a line)
QUICK_RUNS: dict[str, tuple[list[str], list[str]]] = {
    "bench_agent.py": (
        ["all"],
        [
            rf"^P1 \(agent backend\): .* ratio {NUMBER}",
            rf"^P4: agent .* vs curl: ratio {NUMBER}",
            rf"^P7: idle CPU at {NUMBER} agents, .* ratio ({NUMBER}|n/a)",
        ],
    ),
    "bench_checkpoints.py": ([], [rf"^checkpoint cost: .* ratio {NUMBER}", rf"^resume: .* ratio {NUMBER}"]),
    "bench_curve.py": ([], [rf"four runs by hand: {NUMBER} s; ratio {NUMBER}", rf"beyond its fits .*: {NUMBER} s"]),
    "bench_data_files.py": (
        [],
        [
            rf"^{fmt} +{NUMBER} items: potato-queue {NUMBER} s, Potato's parser {NUMBER} s, ratio {NUMBER}"
            for fmt in ("csv", "tsv", "jsonl", "json", "parquet")
        ]
        + [rf"^CSV project bundle, .* ratio {NUMBER} \(same digest: True\)"],
    ),
    "bench_demo.py": (["all"], [rf"^P9: the demo's fine-tune .* ratio {NUMBER}"]),
    "bench_events.py": ([], [rf"relayed \(agent\+server\): {NUMBER} events/s", rf"ratio relayed/by hand:\s+{NUMBER}"]),
    "bench_history.py": (
        [],
        [rf"^{name} +{NUMBER} (ms|MB) +{NUMBER} (ms|MB) +ratio {NUMBER}" for name in HISTORY_FIGURES],
    ),
    "bench_hostile.py": (
        [],
        [rf"^P11 \(netns\): .* idle: {NUMBER} ms", rf"bodies against empty ones, .* ratio {NUMBER}"],
    ),
    "bench_kinds.py": (
        [],
        [rf"macro-F1 ratio, potato-queue / Potato: {NUMBER}x", rf"^mean MAE: .* ratio .*: {NUMBER}x"],
    ),
    "bench_lifecycle.py": (["all"], [rf"^{name}: .* ratio {NUMBER}" for name in ("P1", "P2", "P3", "P9", "P10")]),
    "bench_potato.py": ([], [rf"predictions into Potato's store: .* ratio {NUMBER}"]),
    "bench_potato_hook.py": (
        [],
        [rf"^python -c pass \(installed\) .* {NUMBER}x$", rf"^the line itself, .*: {NUMBER} us"],
    ),
    "bench_ray.py": (
        ["all"],
        [rf"^no-op run, median .* ratio {NUMBER}", rf"^cancel of a running run, .* ratio {NUMBER}"],
    ),
    "bench_scale.py": (
        [],
        [
            rf"^ +1,000 -> 5,000: parse {NUMBER}, build {NUMBER}",
            rf"^5,000: build / parse {NUMBER}x",
            rf"^5,000: the run page's first paint {NUMBER} s",
        ],
    ),
    "bench_slurm.py": (
        ["all"],
        [
            rf"^SLURM start: .* median {NUMBER} s",
            rf"^SLURM cancel: .* p95 {NUMBER} s",
            rf"^SLURM no-op run .* ratio {NUMBER}",
        ],
    ),
    "bench_ssh.py": (
        ["all"],
        [
            rf"^P1 \(ssh backend\): .* ratio {NUMBER}",
            rf"^P5: .* ratio {NUMBER}",
            rf"^P6: a no-op run .* over ssh {NUMBER} s",
        ],
    ),
    "bench_transport.py": (
        [],
        [
            rf"^bundle down, MB/s +{NUMBER} +{NUMBER} +{NUMBER}x",
            rf"^predictions back, MB/s +{NUMBER} +{NUMBER} +{NUMBER}x",
        ],
    ),
    "gpu_check.py": (
        [],
        [
            r"^hf-text-classification, tiny, 1 GPU: exit 0",
            r"^hf-llm-lora, .*, tiny, GPUs 0: exit 0",
            rf"^P9: hf-text-classification, 1 epochs, GPU: queue .* \(succeeded\), .* ratio {NUMBER}",
        ],
    ),
}


def test_every_benchmark_has_a_quick_run_here() -> None:
    """A new benchmark is checked too: its file is named in QUICK_RUNS or this fails."""
    files = {path.name for path in (ROOT / "bench").glob("*.py") if "__main__" in path.read_text()}  # not quick.py
    assert files - set(QUICK_RUNS) == set(), "a benchmark without a quick run in tests/e2e/runs/test_benchmarks.py"
    assert set(QUICK_RUNS) - files == set(), "QUICK_RUNS names a benchmark that is gone"


@pytest.mark.parametrize("name", sorted(QUICK_RUNS))
def test_benchmark_runs_to_its_figure(name: str) -> None:
    args, figures = QUICK_RUNS[name]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / name), *args, "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} failed ({done.returncode}):\n{output[-4000:]}"
    missing = [figure for figure in figures if not re.search(figure, done.stdout, re.MULTILINE)]
    assert not missing, f"{name} ran but printed no figure for {missing}:\n{done.stdout[-4000:]}"
