"""potato-queue's standard-library code as one file: what goes to a training machine.

The agent, the worker and the trainers (which import their heavy packages
only inside their functions) run on any Python 3.8+. The agent backend
serves them as a zipapp (`python3 agent.pyz --server URL --backend NAME`);
the ssh backend copies the same archive to `remote_dir/code/<sha256>`. The
archive is built from the installed package, byte for byte the same for the
same code (fixed timestamps and order), so its sha256 names the code.
"""

from __future__ import annotations

import functools
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from potato_queue.wire.isolated import BARE_PACKAGES

__all__ = ["CodePackage", "agent_zipapp", "host_source", "ZIPAPP_MAIN"]

ROOT = Path(__file__).resolve().parent
# The zipapp's entry: `python3 agent.pyz ARGS` is `python -m potato_queue.agent serve ARGS`.
ZIPAPP_MAIN = """\
import sys
from potato_queue.agent.__main__ import main, serve_main
argv = sys.argv[1:]
sys.exit(main(argv) if argv[:1] in (["run"], ["serve"]) else serve_main(argv, prog="python3 agent.pyz"))
"""
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class CodePackage:
    data: bytes
    sha256: str


def _files() -> list[tuple[str, bytes]]:
    files = [("potato_queue/__init__.py", (ROOT / "__init__.py").read_bytes())]
    for name in BARE_PACKAGES:
        for path in sorted((ROOT / name).rglob("*.py")):
            files.append((path.relative_to(ROOT.parent).as_posix(), path.read_bytes()))
    return files + [("__main__.py", ZIPAPP_MAIN.encode())]


@functools.lru_cache(maxsize=1)
def agent_zipapp() -> CodePackage:
    """The archive (built once per process: the code does not change under a running server)."""
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")  # a zipapp may start with a shebang line
    with zipfile.ZipFile(buffer, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in _files():
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o600 << 16
            archive.writestr(info, data)
    data = buffer.getvalue()
    return CodePackage(data, hashlib.sha256(data).hexdigest())


def host_source(module: ModuleType) -> str:
    """The text of one of host/'s self-contained programs, as it is sent to a machine (`python -c` or stdin),
    read once a process: the code does not change under a running server."""
    return _source(module.__file__ or "")


@functools.cache
def _source(path: str) -> str:
    return Path(path).read_text()
