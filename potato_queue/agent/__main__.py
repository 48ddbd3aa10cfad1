"""python -m potato_queue.agent: run one assigned job (filled by the run-lifecycle work)."""

import sys


def main() -> int:
    sys.stderr.write("potato_queue.agent: not built yet; it arrives with the run-lifecycle work\n")
    return 3


if __name__ == "__main__":
    sys.exit(main())
