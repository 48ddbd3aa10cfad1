"""The copy of a run's model files back from an ssh host, run through executors/remote/stage.py's first stage.

Standard library only, Python 3.8+, self-contained (it runs with the host's
Python, beside nothing else of ours). From stdin, one JSON line: {"job",
"limit_bytes"}. It writes an uncompressed tar of JOB/work (the predictions
went back over HTTP already) to stdout, and JSON lines to stderr: first
{"manifest": {path: bytes}} (what it will send: the executor checks that each
file arrived whole), {"total": bytes}, then {"too_big": path, "bytes": n} for
each file over limit_bytes, which stays on the host. It removes nothing: the
job folder goes only once the executor has every file whole (a copy refused
or cut short leaves the host's files where they are). Its exit status is the
sender's (non-zero: a broken stream).
"""

import json
import os
import shutil
import subprocess
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


def send_with_tar(job: str, work: str, names: List[str]) -> int:
    """The host's tar writes the stream (C: a third of tarfile's CPU, which on a small host is the
    copy's speed). Names go in a list file as ./NAME, so none can read as an option."""
    listing = os.path.join(job, ".sent")
    with open(os.open(listing, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write("".join("./" + name + "\n" for name in names))
    try:
        return subprocess.run(["tar", "-C", work, "--no-recursion", "-T", listing, "-cf", "-"], check=False).returncode
    finally:
        os.unlink(listing)


def send_with_tarfile(work: str, names: List[str]) -> None:
    out = os.fdopen(1, "wb", buffering=COPY_BUFFER_BYTES)
    with tarfile.open(fileobj=out, mode="w|", bufsize=COPY_BUFFER_BYTES) as archive:
        archive.copybufsize = COPY_BUFFER_BYTES
        for name in names:
            archive.add(os.path.join(work, name), arcname=name, recursive=False)
    out.flush()


def main(job: str, limit_bytes: int) -> int:
    work = os.path.join(job, "work")
    files = files_of(work)  # none when there is no work folder
    sent = [(name, size) for name, size in files if size <= limit_bytes]
    say(manifest=dict(sent))
    say(total=sum(size for _, size in sent))
    for name, size in files:
        if size > limit_bytes:
            say(too_big=name, bytes=size)
    names = [name for name, _ in sent]
    if names and shutil.which("tar"):
        return send_with_tar(job, work, names)  # non-zero: the executor sees a broken stream
    send_with_tarfile(work, names)
    return 0


if __name__ == "__main__":
    asked = json.loads(sys.stdin.readline())
    sys.exit(main(asked["job"], int(asked["limit_bytes"])))
