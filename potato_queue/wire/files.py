"""Writing files so that a reader sees the old content or the new, never half.

Standard library only (the agent uses it on bare hosts). The one atomic-write
helper of potato-queue: a temp file beside the target, fsync, rename; the
temp file is removed when anything fails. New files are 0600: hosts are
shared with accounts we do not trust. And the one reader of JSON Lines files
(read_jsonl).
"""

import hashlib
import json
import os
import re
import tempfile
from typing import Any, Callable, Iterable, Iterator, Literal, Optional, Tuple, Union

__all__ = ["write_atomic", "file_sha256", "STAGED_RE", "read_json", "read_jsonl", "JsonLineError"]

# A temp file in a staging folder: .<target's name>.<pid of its writer>.<mkstemp's tail>
STAGED_RE = re.compile(r"^\..*\.(\d+)\.[^.]+$")

Data = Union[bytes, str, Iterable[Union[bytes, str]]]


def _chunks(data: Data) -> Iterable[bytes]:
    if isinstance(data, (bytes, str)):
        data = [data]
    for chunk in data:
        yield chunk.encode("utf-8") if isinstance(chunk, str) else chunk


def write_atomic(
    path: "Union[str, os.PathLike[str]]",
    data: Data,
    mode: int = 0o600,
    durable: bool = True,
    staging: "Optional[Union[str, os.PathLike[str]]]" = None,
) -> None:
    """Replace `path` with `data` (bytes, text, or an iterable of either) in one rename.

    durable=False skips the fsync: for a file that is of no use after a crash anyway (a run's
    spec.json), where the fsync's milliseconds would sit on every run's start. `staging`: the folder
    for the temp file instead of the target's (on the same filesystem, or the rename fails with
    EXDEV), for a target in a folder that is not ours; its name carries our pid (STAGED_RE), so
    what a killed process left there can be told from what a live one is writing.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    prefix = "." + os.path.basename(path) + (f".{os.getpid()}." if staging is not None else ".")
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=folder if staging is None else staging)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in _chunks(data):
                fh.write(chunk)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def file_sha256(path: "Union[str, os.PathLike[str]]") -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: "Union[str, os.PathLike[str]]", what: str, error: Callable[[str], Exception]) -> Any:
    """A JSON file's value; `error` (the caller's own error type) with `what` the file is, when it cannot be
    read or is not JSON: "Could not read <what>: ..." and "<What> is not valid JSON: ..."."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise error("Could not read %s: %s" % (what, exc)) from exc
    except ValueError as exc:
        raise error("%s is not valid JSON: %s" % (what[:1].upper() + what[1:], exc)) from exc


class JsonLineError(ValueError):
    """A line of a JSON Lines file that is not JSON: its file, its number (from 1) and json's reason."""

    def __init__(self, path: "Union[str, os.PathLike[str]]", line: int, reason: str) -> None:
        super().__init__("%s line %d is not JSON: %s" % (path, line, reason))
        self.path = path
        self.line = line
        self.reason = reason


def read_jsonl(
    path: "Union[str, os.PathLike[str]]",
    *,
    not_json: Literal["raise", "skip", "none"] = "raise",
    missing_ok: bool = False,
    errors: str = "strict",
) -> Iterator[Tuple[int, Any]]:
    """Each non-blank line of a JSON Lines file (UTF-8) as (its line number from 1, its JSON value).

    The one reader of potato-queue's JSON Lines files (bundle splits, predictions, events), so that what a
    line, a blank line and a bad line are is decided in one place; each caller says only what a bad line
    means to it. A line of whitespace only is passed over. A line that is not JSON: not_json="raise"
    raises JsonLineError (a ValueError naming the file and the line), "skip" passes over it, "none" gives
    it as None (for a caller that counts bad lines, to which a JSON null is bad too). Values are not
    checked: a line may hold any JSON value, and what one that is not an object means is the caller's to
    say. missing_ok: an absent file gives no lines instead of FileNotFoundError. errors: open()'s handling
    of bytes that are not UTF-8 ("strict" raises UnicodeDecodeError, "replace" reads them as U+FFFD).
    """
    if not_json not in ("raise", "skip", "none"):
        raise ValueError("not_json must be 'raise', 'skip' or 'none', not %r" % (not_json,))
    try:
        fh = open(path, encoding="utf-8", errors=errors)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    with fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                if not_json == "raise":
                    raise JsonLineError(path, number, str(exc)) from exc
                if not_json == "skip":
                    continue
                value = None
            yield number, value
