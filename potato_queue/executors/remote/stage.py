"""Python on a host whatever its login shell, and the line that ends what a chatty login printed.

sshd runs every remote command as `<the account's login shell> -c <command>`,
and shells read quotes differently: csh and tcsh cannot have a newline inside
quotes and expand `!` even inside single quotes; fish takes `$$` for an error
and `\\` for an escape. So a command potato-queue sends is one line of plain
words and one single-quoted word with none of newline, `!`, `$`, backslash or
a quote in it: `<python> -c '<STAGE1>' <marker>`. STAGE1 writes the marker as a
line of its own, reads one line from stdin (the real program, zlib'd and in
base64, read a byte at a time so that nothing after it is taken) and runs it as
`__main__`. What the program reads next on stdin is its own.

Whatever the login prints before the marker (an echo in ~/.bashrc above its
interactive guard, a conda or module banner, all of ~/.cshrc) is the host's,
not ours: it is skipped, and said once with the way to silence it. The marker
is new for every command and in the interpreter's argv, so a hard stop finds an
interpreter that hung before it said anything (`pkill -f <marker>`).
"""

from __future__ import annotations

import base64
import functools
import os
import re
import secrets
import zlib

from potato_queue.errors import PotatoQueueError

__all__ = [
    "STAGE1",
    "MARKER_RE",
    "new_marker",
    "stage_argv",
    "stage_input",
    "split_banner",
    "read_past_marker",
    "banner_note",
    "NoMarker",
]

STAGE1 = (
    "import os,sys,zlib,base64;n=bytes([10]);os.write(1,sys.argv[1].encode()+n);"
    'exec(zlib.decompress(base64.b64decode(b"".join(iter(lambda:os.read(0,1)or n,n)))),{"__name__":"__main__"})'
)
MARKER_RE = re.compile(r"potato-queue-[0-9a-f]{16}")
MAX_BANNER_BYTES = 1 << 20  # a login that prints more than this before our line is not a banner
BANNER_SHOWN_CHARS = 120


class NoMarker(PotatoQueueError):
    """The stream ended, or ran past MAX_BANNER_BYTES, before the marker: the program never started."""

    def __init__(self, banner: bytes) -> None:
        super().__init__("the marker never came")
        self.banner = banner


def new_marker() -> str:
    return f"potato-queue-{secrets.token_hex(8)}"


def stage_argv(python: str, marker: str) -> list[str]:
    """The remote command: `python` runs STAGE1, which says `marker` and then runs what stdin brings."""
    if not MARKER_RE.fullmatch(marker):
        raise ValueError(f"not a marker: {marker!r}")
    return [python, "-c", STAGE1, marker]


@functools.lru_cache(maxsize=8)
def stage_input(source: str) -> bytes:
    """The first line STAGE1 reads: `source`, compressed, in base64 (no newline inside)."""
    return base64.b64encode(zlib.compress(source.encode(), 9)) + b"\n"


def split_banner(stdout: str, marker: str) -> tuple[str, str] | None:
    """(what the login printed, what the program printed) of a command's whole stdout; None without the marker."""
    at = stdout.find(marker + "\n")
    if at < 0:
        return None
    return stdout[:at], stdout[at + len(marker) + 1 :]


def read_past_marker(fd: int, marker: str) -> bytes:
    """Reads `fd` a byte at a time up to and with the marker's line (what follows stays in the pipe for the
    program's reader); returns what came before it. NoMarker when it never comes."""
    want = marker.encode() + b"\n"
    seen = bytearray()
    while not seen.endswith(want):
        byte = os.read(fd, 1)
        if not byte or len(seen) > MAX_BANNER_BYTES:
            raise NoMarker(bytes(seen))
        seen += byte
    return bytes(seen[: -len(want)])


def banner_note(host: str, banner: str) -> str | None:
    """What run.log and the check say about a login that printed before our line; None when it printed nothing."""
    lines = [line.strip() for line in banner.splitlines() if line.strip()]
    if not lines:
        return None
    shown = lines[0][:BANNER_SHOWN_CHARS]
    shown = shown if shown.isprintable() else repr(shown)  # a host's text: no forged log lines
    more = f" (and {len(lines) - 1} more line(s))" if len(lines) > 1 else ""
    return (
        f'{host}\'s shell start-up prints "{shown}"{more} for non-interactive commands; potato-queue skipped '
        "it, but scp, rsync and sftp break on it. Fix: print only in interactive shells: in ~/.bashrc after its "
        "`case $- in *i*)` guard, in ~/.cshrc inside `if ($?prompt) then`, in fish's config.fish inside "
        "`if status is-interactive`"
    )
