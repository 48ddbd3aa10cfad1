"""The model files to the server, for a run whose job asks for them (a ray run's: nothing else reaches its node).

Standard library only, Python 3.8+. What is sent is one file, written in the
run's folder and PUT like predictions.jsonl: a JSON line {"manifest": {name:
bytes}, "kept": {name: bytes}} naming the files that go and those too big to, then an uncompressed tar of exactly those
(host/fetch.py's choice of files: regular ones, no links, not predictions.jsonl).
A file over the job's cap stays in work/ and the log names it. Once the server
has stored the upload, the files it holds are removed from work/; the executor
unpacks them into the run's artifacts/ by the rules of an ssh copy.
"""

import json
import os
import tarfile
from typing import Callable, Dict, List, Optional, Tuple

from potato_queue.agent.client import RunClient
from potato_queue.agent.run_files import RunFiles
from potato_queue.agent.transport import ApiError, Unreachable
from potato_queue.host.fetch import COPY_BUFFER_BYTES, files_of

__all__ = ["pack_model_files", "send_model_files"]


def pack_model_files(work: str, out_path: str, limit_bytes: int) -> Tuple[Dict[str, int], List[Tuple[str, int]]]:
    """Write the upload (0600) to out_path: (the files in it with their sizes, the files kept for their size)."""
    found = files_of(work) if os.path.isdir(work) else []
    sent = {name: size for name, size in found if size <= limit_bytes}
    kept = [(name, size) for name, size in found if size > limit_bytes]
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb", buffering=COPY_BUFFER_BYTES) as out:
        out.write(json.dumps({"manifest": sent, "kept": dict(kept)}).encode() + b"\n")
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=COPY_BUFFER_BYTES) as archive:
            for name in sorted(sent):
                archive.add(os.path.join(work, name), arcname=name, recursive=False)
    return sent, kept


def send_model_files(
    files: RunFiles,
    limit_bytes: int,
    client: RunClient,
    log: Callable[[str], None],
    patience_s: Optional[float],
) -> Optional[str]:
    """Pack and PUT the model files; None when the server has them (they leave work/), else the problem."""
    try:
        sent, kept = pack_model_files(files.work, files.model_upload, limit_bytes)
        for name, size in kept:
            log(
                "{} ({:.0f} MB) is over max_artifact_mb ({:g} MB): it stays here in {}".format(
                    name, size / 1e6, limit_bytes / 1e6, files.work
                )
            )
        reply = client.upload_model(files.model_upload, give_up_s=patience_s)
    except OSError as exc:
        return "the model files could not be packed: {}".format(exc)
    except ApiError as exc:
        return "the model files were refused: {}".format(exc.detail)
    except Unreachable as exc:
        return "the model files could not be sent: {}".format(exc)
    finally:
        if os.path.exists(files.model_upload):
            os.unlink(files.model_upload)
    log("model files sent: {} files, {} bytes".format(len(sent), reply.get("bytes")))
    for name in sent:
        try:
            os.unlink(os.path.join(files.work, name))
        except OSError:
            pass  # the server has it; a copy left here is only disk
    return None
