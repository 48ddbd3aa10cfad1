"""python -m potato_queue.worker --spec spec.json (filled by the run-lifecycle work)."""

import sys


def main() -> int:
    sys.stderr.write("potato_queue.worker: not built yet; it arrives with the run-lifecycle work\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
