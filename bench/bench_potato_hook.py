"""What the potato-queue-remote hook costs every Python start in Potato's environment.

`potato-queue potato install-trainer` writes one line (potato_queue_remote.pth) into the site-packages
of the Python that runs it; every start of that Python runs the line. Side by side, interleaved, in one
run: `python -c pass` with the line installed, and without it (the alternative: no hook at all). Then a
stale line, as `pip uninstall potato-queue` leaves it: the same line in the site folder of an interpreter
that cannot find potato_queue (`python -S`, then `site.addsitedir` of a folder holding the line), against
an empty folder. Then what Potato pays once a start, when it imports its registry: with the line
(potato-queue found and registered), against without. Last, the line alone, run in this process as
site.py runs it: a start's cost without a start's noise (a start's spread is milliseconds).

Prints the median and the spread of each, the difference in ms and the ratio. The installed line is put
back as it was found.

    .venv/bin/python bench/bench_potato_hook.py [--starts 50] [--quick: a site folder of its own, 3 starts]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.quick import quick_args  # noqa: E402
from potato_queue.potato_hook import PTH_LINE, PTH_NAME, pth_path, remove_pth, write_pth  # noqa: E402

PYTHON = sys.executable


def _start_ms(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([PYTHON, *args], check=True, cwd="/", stdin=subprocess.DEVNULL)
    return (time.perf_counter() - started) * 1000


def _side_by_side(
    starts: int, with_line: Callable[[], float], without: Callable[[], float]
) -> tuple[list[float], list[float]]:
    """Interleaved, so a change in the machine's load falls on both sides alike."""
    a, b = [], []
    for _ in range(starts):
        a.append(with_line())
        b.append(without())
    return a, b


def _row(what: str, a: list[float], b: list[float]) -> None:
    ma, mb = statistics.median(a), statistics.median(b)
    qa, qb = statistics.quantiles(a, n=4), statistics.quantiles(b, n=4)
    print(
        f"{what:<44} {ma:8.2f} ms ({qa[0]:.1f}-{qa[2]:.1f})  {mb:8.2f} ms ({qb[0]:.1f}-{qb[2]:.1f})  "
        f"{ma - mb:+7.2f} ms  {ma / mb:5.3f}x"
    )


def _installed(starts: int, args: list[str], site_dir: str | None) -> tuple[list[float], list[float]]:
    """The line in this Python's site-packages, or (`site_dir`, --quick) in a folder of the bench's own that
    the start adds after site-packages: the suite runs the quick mode beside tests that read the real one."""
    if site_dir is not None:
        packages = str(pth_path().parent)  # this Python's site-packages (under -S, sysconfig names the base's)
        args = ["-S", "-c", f"import site; site.addsitedir({packages!r}); site.addsitedir({site_dir!r}); {args[-1]}"]

    def with_line() -> float:
        write_pth(site_dir)
        return _start_ms(args)

    def without() -> float:
        remove_pth(site_dir)
        return _start_ms(args)

    return _side_by_side(starts, with_line, without)


def _stale(starts: int) -> tuple[list[float], list[float]]:
    """The line in a site folder of an interpreter that cannot find potato_queue (-S: no site-packages)."""
    with tempfile.TemporaryDirectory() as stale, tempfile.TemporaryDirectory() as empty:
        (Path(stale) / PTH_NAME).write_text(PTH_LINE)
        probe = "import site; site.addsitedir({!r})"
        return _side_by_side(
            starts,
            lambda: _start_ms(["-S", "-c", probe.format(stale)]),
            lambda: _start_ms(["-S", "-c", probe.format(empty)]),
        )


def _line_itself_us(runs: int = 2000) -> float:
    """The line as site.py runs it, in this process: the cost a start pays, without a start's noise."""
    started = time.perf_counter()
    for _ in range(runs):
        exec(PTH_LINE, {"__name__": "site"})  # noqa: S102 - what site.py does with the line
        del sys.meta_path[0]
    return (time.perf_counter() - started) / runs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=50)
    args = quick_args(parser, starts=3)
    with tempfile.TemporaryDirectory() as private:
        site_dir = private if args.quick else None  # --quick never touches this Python's own site-packages
        was_there = pth_path(site_dir).exists()
        try:
            _measure(args.starts, site_dir)
        finally:
            if was_there:
                write_pth(site_dir)
            else:
                remove_pth(site_dir)


def _measure(starts: int, site_dir: str | None) -> None:
    _start_ms(["-c", "pass"])  # the page cache warm for both sides
    print(f"{starts} starts each, interleaved; median (quartiles)\n")
    print(f"{'':<44} {'with the line':>24}  {'without':>24}  {'diff':>10}  ratio")
    _row("python -c pass (installed)", *_installed(starts, ["-c", "pass"], site_dir))
    _row("python -c pass (stale: potato-queue gone)", *_stale(starts))
    registry = ["-c", "import potato.training.registry"]
    _row("Potato imports its registry (once a start)", *_installed(max(10, starts // 5), registry, site_dir))
    print(f"\nthe line itself, as site.py runs it (in-process, 2000 runs): {_line_itself_us():.1f} us a start")


if __name__ == "__main__":
    main()
