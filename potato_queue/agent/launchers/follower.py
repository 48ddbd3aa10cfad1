"""Following a file that grows, line by line: how the sbatch launcher reads a job's events.jsonl and
stderr.log on shared storage. Standard library only, Python 3.8+ (it runs on login nodes)."""

import os
import re
import threading
from typing import Callable

from potato_queue.agent.relay import MAX_LINE

__all__ = ["Follower", "FOLLOW_S", "read_end"]

FOLLOW_S = 0.05


class Follower:
    """Hands each line of a file that grows to `on_line`, until finish() and the file's end."""

    def __init__(self, path: str, on_line: Callable[[bytes], None], split: "re.Pattern[bytes]") -> None:
        self.path, self.on_line, self.split = path, on_line, split
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._run, name="follow-" + os.path.basename(path), daemon=True)
        self.thread.start()

    def _run(self) -> None:
        handle, pending = None, b""
        while True:
            last = self.finished.is_set()  # read once more after finish: the file's last bytes
            if handle is None and os.path.exists(self.path):
                handle = open(self.path, "rb")
            chunk = handle.read(1 << 20) if handle is not None else b""
            if chunk:
                parts = self.split.split(pending + chunk)
                pending = parts.pop()
                for part in parts:
                    self.on_line(part)
                if len(pending) > MAX_LINE:
                    self.on_line(pending)
                    pending = b""
                continue
            if last:
                break
            self.finished.wait(FOLLOW_S)
        if pending:
            self.on_line(pending)
        if handle is not None:
            handle.close()


def read_end(path: str, limit: int = 64000) -> str:
    """The last `limit` bytes of a file the job writes, as text; "" when it is not there (yet)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
