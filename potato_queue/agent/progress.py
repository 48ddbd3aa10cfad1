"""How far a download has got: a bar redrawn in place on a terminal, a few plain log lines otherwise.

Standard library only, Python 3.8+.
"""

import sys
import time
from typing import IO, Callable, Optional

__all__ = ["Progress", "MIN_LOGGED_BYTES"]

# Below this a download is quick: no bar and no lines but the runner's own when it is done.
MIN_LOGGED_BYTES = 8 * 1024 * 1024
REDRAW_S = 0.1
BAR_WIDTH = 30
_MB = 1024 * 1024


class Progress:
    """Call update(done) as bytes arrive, finish() at the end."""

    def __init__(self, what: str, total: int, log: Callable[[str], None], stream: Optional[IO[str]] = None) -> None:
        self.what, self.total, self.log = what, total, log
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.quiet = total < MIN_LOGGED_BYTES
        self.next_quarter = 1
        self.drawn_at = 0.0

    def update(self, done: int) -> None:
        if self.quiet:
            return
        if self.tty:
            now = time.monotonic()
            if now - self.drawn_at >= REDRAW_S or done >= self.total:
                self.drawn_at = now
                self._draw(done)
        elif self.next_quarter < 4 and done * 4 >= self.total * self.next_quarter:
            self.log(
                "{}: {}% ({:.0f} of {:.0f} MB)".format(self.what, 25 * self.next_quarter, done / _MB, self.total / _MB)
            )
            self.next_quarter += 1

    def _draw(self, done: int) -> None:
        share = min(1.0, done / self.total) if self.total else 1.0
        filled = int(share * BAR_WIDTH)
        self.stream.write(
            "\r{} [{}{}] {:3.0f}% {:.0f}/{:.0f} MB".format(
                self.what, "#" * filled, "-" * (BAR_WIDTH - filled), share * 100, done / _MB, self.total / _MB
            )
        )
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()
