"""The copy of a run's model files back from an ssh host: `python -c <this source> JOB LIMIT_BYTES KEEP`.

Standard library only, Python 3.8+, self-contained (it runs with the host's
Python, beside nothing else of ours). It writes an uncompressed tar of
JOB/work (the predictions went back over HTTP already) to stdout, and JSON
lines to stderr: first {"total": bytes}, then {"too_big": path, "bytes": n}
for each file over LIMIT_BYTES, which stays on the host. Once the tar is
written whole it removes JOB, unless KEEP is 1 or a file stayed behind.
"""

import json
import os
import shutil
import sys
import tarfile
from typing import List, Tuple

COPY_BUFFER_BYTES = 1 << 20
SKIPPED = ("predictions.jsonl",)


def say(**fields: object) -> None:
    sys.stderr.write(json.dumps(fields) + "\n")
    sys.stderr.flush()


def files_of(work: str) -> List[Tuple[str, int]]:
    found = []
    for folder, _dirs, names in os.walk(work):
        for name in sorted(names):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, work)
            if relative not in SKIPPED and os.path.isfile(path) and not os.path.islink(path):
                found.append((relative, os.path.getsize(path)))
    return found


def main(job: str, limit_bytes: int, keep: bool) -> int:
    work = os.path.join(job, "work")
    files = files_of(work) if os.path.isdir(work) else []
    sent = [(name, size) for name, size in files if size <= limit_bytes]
    say(total=sum(size for _, size in sent))
    for name, size in files:
        if size > limit_bytes:
            say(too_big=name, bytes=size)
    out = os.fdopen(1, "wb", buffering=COPY_BUFFER_BYTES)
    with tarfile.open(fileobj=out, mode="w|", bufsize=COPY_BUFFER_BYTES) as archive:
        archive.copybufsize = COPY_BUFFER_BYTES
        for name, _size in sent:
            archive.add(os.path.join(work, name), arcname=name, recursive=False)
    out.flush()
    if not keep and len(sent) == len(files):
        shutil.rmtree(job, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"))
