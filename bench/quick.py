"""--quick, the same in every benchmark: small sizes that run in seconds.

The suite runs each benchmark so (tests/e2e/runs/test_benchmarks.py) to see that it still reaches its figure; the
figures themselves are measured full size.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["quick_args", "both"]

A = TypeVar("A")
B = TypeVar("B")

QUICK_HELP = "small sizes, all of it in seconds: the suite runs it to see the benchmark still reaches its figure"


def quick_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, **sizes: Any) -> argparse.Namespace:
    """The parsed arguments with --quick added; under --quick, each of `sizes` the user left at its default
    takes the quick value given here."""
    parser.add_argument("--quick", action="store_true", help=QUICK_HELP)
    args = parser.parse_args(argv)
    for name, size in sizes.items() if args.quick else ():
        if getattr(args, name) == parser.get_default(name):
            setattr(args, name, size)
    return args


def both(first: Callable[[], A], second: Callable[[], B], side_by_side: bool) -> tuple[A, B]:
    """first() then second(), or the two at once (a --quick run's): where each is a worker process that spends
    seconds of a core importing torch before it does anything, and the machine has a core to spare for the other.
    The figures they make then mean nothing, as every --quick figure."""
    if not side_by_side:
        return first(), second()
    with ThreadPoolExecutor(2) as pool:
        one, two = pool.submit(first), pool.submit(second)
        return one.result(), two.result()
