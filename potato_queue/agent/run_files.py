"""One run's folder on the training machine: its paths, the bundle unpacked safely, spec.json written.

Standard library only, Python 3.8+. Files live in `DIR/<run_id>/`:
bundle.tar.gz, bundle/, spec.json, work/ (the worker's workdir: model files
and predictions.jsonl), as docs/protocol.md lays out. Apart from the runner
(runner.py), which speaks the protocol around them, because what lands on disk
(and what a bundle may not write there) is one question of its own, asked by
the benchmarks too.
"""

import json
import os
import re
import shutil
import tarfile
from typing import Optional

from potato_queue.agent.errors import BundleDownloadError
from potato_queue.wire.files import write_atomic
from potato_queue.wire.job import Job

__all__ = ["RunFiles", "extract_bundle", "write_spec"]

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class RunFiles:
    """The paths of one run under the agent's --workdir."""

    def __init__(self, base_dir: str, run_id: str) -> None:
        if not _SAFE_ID.fullmatch(run_id):
            raise ValueError("not a run id: {!r}".format(run_id))
        self.root = os.path.join(os.path.abspath(base_dir), run_id)
        self.bundle_tar = os.path.join(self.root, "bundle.tar.gz")
        self.bundle_dir = os.path.join(self.root, "bundle")
        self.spec = os.path.join(self.root, "spec.json")
        self.work = os.path.join(self.root, "work")
        self.predictions = os.path.join(self.work, "predictions.jsonl")
        self.model_upload = os.path.join(self.root, "model.upload")  # agent/model_files.py's, while it is sent


def extract_bundle(tar_path: str, dest: str) -> None:
    """Unpack the bundle's regular files and folders into a fresh `dest`; refuse anything else.

    Done by hand, not extractall: Python 3.8 has no extraction filter, and a
    bundle naming `../x`, an absolute path or a link must not write outside dest.
    """
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    with tarfile.open(tar_path, "r:gz") as tar:
        for member in tar:
            parts = member.name.replace("\\", "/").split("/")
            if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
                raise BundleDownloadError("the bundle holds {!r}, which may not be unpacked".format(member.name))
            target = os.path.join(dest, *[p for p in parts if p not in ("", ".")])
            if member.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            source = tar.extractfile(member)
            if source is None:
                raise BundleDownloadError("the bundle's {!r} cannot be read".format(member.name))
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out, 1024 * 1024)


def write_spec(files: RunFiles, job: Job, checkpoint_dir: Optional[str] = None, gpus: Optional[str] = None) -> None:
    """spec.json as the worker reads it (docs/protocol.md)."""
    spec = job.worker_spec(files.bundle_dir, files.work, checkpoint_dir, gpus)
    write_atomic(files.spec, json.dumps(spec, indent=2, sort_keys=True), mode=0o600, durable=False)
