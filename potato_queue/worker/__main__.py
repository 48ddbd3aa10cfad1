"""``python -m potato_queue.worker --spec spec.json``: run one training job.

Events go to stdout (one JSON object a line, see events.py), free text to
stderr, and the exit code says how it ended (see errors.py / protocol.md).
"""

import argparse
import os
import sys
from typing import IO, List, Optional

from potato_queue.wire.events import ErrorsOnly, Reporter
from potato_queue.wire.exit_codes import EXIT_BAD_SPEC, EXIT_CANCELLED

from .errors import Cancelled
from .parallel import rank_info
from .run import run
from .stop import StopFlag, ignore_stop_signals, install_signal_handlers, stop_from_parent, stop_when_orphaned

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m potato_queue.worker",
        description="Run one potato-queue training job from a spec file.",
    )
    parser.add_argument("--spec", help="path to the run's spec.json")
    parser.add_argument(
        "--spec-on-stdin",
        action="store_true",
        help="started ahead of time: wait for the spec's path as a line on stdin",
    )
    parser.add_argument(
        "--rank",
        type=int,
        metavar="R",
        help="one rank of a data-parallel run, started by the run's own worker (ranks.py)",
    )
    parser.add_argument(
        "--describe-device",
        metavar="DEVICE",
        help="print the device a run asking for DEVICE would use, in words, and exit",
    )
    return parser


def event_stream() -> IO[str]:
    """A private UTF-8 handle on stdout for events; fd 1 and sys.stdout then point at stderr.

    Libraries that print (Python or native code) would otherwise interleave
    free text with the events; this way stdout carries events only.
    """
    try:
        sys.stdout.flush()
        events_fd = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError, AttributeError):
        return sys.stdout
    sys.stdout = sys.stderr
    return os.fdopen(events_fd, "w", encoding="utf-8", buffering=1)


def main(argv: Optional[List[str]] = None) -> int:
    """Parse arguments, install signal handlers, run; return the exit code."""
    os.umask(0o077)  # files 0600, folders 0700: the host is shared with other accounts
    stop = StopFlag()
    install_signal_handlers(stop)
    reporter = Reporter(stream=event_stream(), should_stop=stop.poll)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            return 0
        reporter.error("bad_spec", "usage: python -m potato_queue.worker --spec spec.json")
        return EXIT_BAD_SPEC
    if args.describe_device:
        from .device import device_in_words

        sys.stderr.write(device_in_words(args.describe_device) + "\n")
        return 0
    if args.spec_on_stdin:
        try:
            args.spec = sys.stdin.readline().strip()
        except Cancelled:
            return EXIT_CANCELLED  # stopped while waiting for a run
        if not args.spec:
            return 0  # the agent that started us ahead of time had no run for us
        os.chdir(os.path.dirname(os.path.abspath(args.spec)))
    if not args.spec:
        reporter.error("bad_spec", "usage: python -m potato_queue.worker --spec spec.json")
        return EXIT_BAD_SPEC
    rank = None
    if args.rank is not None:
        rank = rank_info(os.environ)
        stop_from_parent()  # its stops come from its parent worker, which it also outlives by no more than a grace
        if rank.rank > 0:
            reporter = ErrorsOnly(stream=reporter.stream, should_stop=stop.poll)
    else:
        stop_when_orphaned()
    code = run(args.spec, reporter, stop, rank)
    ignore_stop_signals()  # decided and reported: the interpreter's shutdown must not be killed
    if rank is not None:
        # Decided, reported and written. A rank skips the interpreter's shutdown: there the DDP wrapper's
        # gloo process group is freed, and its destructor can wait forever on a rank that already left.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
