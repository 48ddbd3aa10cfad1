"""Writing files so that a reader sees the old content or the new, never half.

Standard library only (the agent uses it on bare hosts). The one atomic-write
helper of potato-queue: a temp file beside the target, fsync, rename; the
temp file is removed when anything fails. New files are 0600: hosts are
shared with accounts we do not trust.
"""

import hashlib
import os
import re
import tempfile
from typing import Iterable, Optional, Union

__all__ = ["write_atomic", "file_sha256", "STAGED_RE"]

# A temp file in a staging folder: .<target's name>.<pid of its writer>.<mkstemp's tail>
STAGED_RE = re.compile(r"^\..*\.(\d+)\.[^.]+$")

Data = Union[bytes, str, Iterable[Union[bytes, str]]]


def _chunks(data: Data) -> Iterable[bytes]:
    if isinstance(data, (bytes, str)):
        data = [data]
    for chunk in data:
        yield chunk.encode("utf-8") if isinstance(chunk, str) else chunk


def write_atomic(path: "Union[str, os.PathLike[str]]", data: Data, mode: int = 0o600, durable: bool = True,
                 staging: "Optional[Union[str, os.PathLike[str]]]" = None) -> None:
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
