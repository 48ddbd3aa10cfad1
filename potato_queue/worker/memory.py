"""``limits.max_ram_mb``: a resident-memory watchdog.

Potato caps the address space with RLIMIT_AS, which makes torch and CUDA
fail at import time with an unrelated error. This watchdog instead samples
the worker's resident set size twice a second and, over the limit, reports
``error {code: "out_of_memory"}`` and exits 5.
"""

import os
import sys
import threading
from typing import Callable, Optional

from potato_queue.wire.exit_codes import EXIT_OOM

__all__ = ["rss_mb", "MemoryWatchdog"]


def rss_mb() -> Optional[float]:
    """This process's resident memory in MB (peak RSS where current is unknown)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # Unix only

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError, ValueError):
        return None
    # ru_maxrss is bytes on macOS, kilobytes on Linux and the BSDs.
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


class MemoryWatchdog:
    """Exits the process with code 5 once RSS passes *limit_mb*."""

    def __init__(
        self,
        limit_mb: int,
        on_exceeded: Callable[[str], None],
        interval_s: float = 0.5,
        exit_fn: Callable[[int], None] = os._exit,
    ) -> None:
        self.limit_mb = limit_mb
        self._on_exceeded = on_exceeded
        self._interval = interval_s
        self._exit = exit_fn
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="max-ram-watchdog", daemon=True)

    def start(self) -> "MemoryWatchdog":
        """Start sampling in a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling."""
        self._stopped.set()

    def _watch(self) -> None:
        while True:
            used = rss_mb()
            if used is not None and used > self.limit_mb:
                self._on_exceeded(
                    "The worker used %d MB of RAM, over the run's max_ram_mb of %d MB. "
                    "Use a smaller batch_size or model, fewer items, or raise max_ram_mb." % (used, self.limit_mb)
                )
                self._exit(EXIT_OOM)
                return
            if self._stopped.wait(self._interval):
                return
