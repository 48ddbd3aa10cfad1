"""The model files back from a host over ssh, shared by the ssh and slurm backends (not an executor).

The host's side is host/fetch.py (`python -c`): a tar stream of the job's work/
folder on stdout, notes on stderr (the total, files over max_artifact_mb).
This side pipes the stream straight into this machine's tar (Python's tarfile
where there is none), shows progress on the step line, and ends a copy that
sends nothing for COPY_STALL_S (ERR-7). A copy is whole only when the sender
exited 0 and every file it announced (its manifest) arrived with its size: tar
takes a stream that ends between two files for a whole one. Anything less
fails the copy and removes what arrived.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from potato_queue.errors import PotatoQueueError
from potato_queue.executors.base import LaunchSpec, ModelFilesMissing
from potato_queue.executors.remote.openssh import SshTarget, run_ssh, ssh_argv, ssh_failure
from potato_queue.host import fetch as remote_fetch

__all__ = ["ModelCopy", "FETCH_SOURCE", "COPY_STALL_S", "stall_s"]

FETCH_SOURCE = Path(remote_fetch.__file__).read_text()
COPY_STALL_S = 180.0
COPY_BLOCK_BYTES = 1 << 20
WRITE_BLOCK_BYTES = 32 << 10
NOTES_WAIT_S = 10.0


class ModelCopy:
    """The model files back over one ssh (host/fetch.py's tar stream): progress on the step line, files
    over max_artifact_mb named in run.log and left there, and a copy that sends nothing for
    COPY_STALL_S ended (ERR-7)."""

    def __init__(self, target: SshTarget, backend: Any, spec: LaunchSpec, job: str, cleanup: str) -> None:
        """`job` is the job folder on the host; `cleanup` a shell command run there once the stream is
        sent (or the copy stalled): what else the run left."""
        self.target, self.backend, self.spec, self.job, self.cleanup = target, backend, spec, job, cleanup
        self.total = 0
        self.received = 0
        self.last_byte_s = time.monotonic()
        self.stall_s = stall_s()
        self.kept_there = False
        self.stalled = False
        self.manifest: dict[str, int] | None = None  # what the sender said it will send

    def command(self) -> list[str]:
        keep = "1" if self.backend.keep_remote else "0"
        script = f'"$0" -c "$1" "$2" "$3" "$4"; status=$?; {self.cleanup}; exit $status'
        limit = str(int(self.backend.max_artifact_mb * 1_000_000))
        return ["sh", "-c", script, self.backend.python, FETCH_SOURCE, self.job, limit, keep]

    def run(self) -> bool:
        """Copies; True when some model files stayed on the host. ModelFilesMissing after a stall."""
        artifacts = self.spec.paths.artifacts
        artifacts.mkdir(mode=0o700, exist_ok=True)
        tar = shutil.which("tar")
        with subprocess.Popen(ssh_argv(self.target, self.command()), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, bufsize=COPY_BLOCK_BYTES) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            stderr: list[str] = []
            notes = threading.Thread(target=self._read_notes, args=(proc.stderr, stderr), daemon=True)
            notes.start()
            if tar is not None:
                failure = self._untar(tar, proc, artifacts)
            else:
                threading.Thread(target=self._watch, args=(proc, lambda: self.received), daemon=True).start()
                failure = self._untar_in_python(proc, artifacts)
            notes.join(NOTES_WAIT_S)  # the manifest is read before the copy is judged
        if self.stalled:
            self._end_the_sender()
            self._discard(artifacts)
            raise ModelFilesMissing(f"The copy from {self.backend.host} sent nothing for {self.stall_s:g} s "
                                    "(the predictions are stored; only model files are missing from artifacts/)")
        if proc.returncode == 255:
            self._discard(artifacts)
            raise ssh_failure(self.backend.host, "".join(stderr))
        cut_short = failure or self._cut_short(proc.returncode, artifacts)
        if cut_short:
            self._discard(artifacts)
            raise ModelFilesMissing(f"The copy from {self.backend.host} was cut short: {cut_short} (the predictions "
                                    "are stored; only model files are missing from artifacts/)")
        return self.kept_there

    def _cut_short(self, sender_exit: int | None, artifacts: Path) -> str | None:
        """What is wrong with a copy that ended by itself: the sender's exit, a file missing or short."""
        if sender_exit:
            return f"the sender on {self.backend.host} exited with code {sender_exit}"
        if self.manifest is None:
            return f"the sender on {self.backend.host} did not say what it would send"
        for name, size in sorted(self.manifest.items()):
            path = artifacts / name
            if not path.is_file() or path.is_symlink():
                return f"{name} did not arrive"
            if path.stat().st_size != size:
                return f"{name} arrived with {path.stat().st_size} of its {size} bytes"
        return None

    @staticmethod
    def _discard(artifacts: Path) -> None:
        """A copy that is not whole leaves nothing: a half model file must not pass for the model."""
        shutil.rmtree(artifacts, ignore_errors=True)

    def _untar(self, tar: str, proc: subprocess.Popen[bytes], artifacts: Path) -> str | None:
        """ssh's stdout straight into this machine's tar: no Python between them, which on a small
        server is what the copy's speed is (P5). Progress is what has landed in artifacts/."""
        untar = subprocess.Popen([tar, "-x", "-f", "-", "-C", str(artifacts), "--no-same-owner",
                                  "--no-same-permissions"], stdin=proc.stdout, stderr=subprocess.PIPE)
        assert proc.stdout is not None and untar.stderr is not None
        proc.stdout.close()  # tar holds the pipe now
        threading.Thread(target=self._watch, args=(proc, lambda: _size_of(artifacts), untar), daemon=True).start()
        problem = untar.stderr.read().decode(errors="replace").strip()
        untar.wait()
        proc.wait()
        return None if untar.returncode == 0 or self.stalled else problem or f"tar exited {untar.returncode}"

    def _untar_in_python(self, proc: subprocess.Popen[bytes], artifacts: Path) -> str | None:
        assert proc.stdout is not None
        try:
            # Big reads (tarfile's default 10 KiB ones cost a core), small writes: a large write is
            # backed by large page-cache folios, whose fresh memory costs a VM twice the kernel time.
            with tarfile.open(fileobj=_Counted(proc.stdout, self), mode="r|", bufsize=COPY_BLOCK_BYTES) as archive:
                archive.copybufsize = WRITE_BLOCK_BYTES  # type: ignore[attr-defined]  # tarfile has it, typeshed not
                archive.extractall(artifacts, filter="data")
        except (tarfile.TarError, OSError) as exc:
            return None if self.stalled else str(exc)
        return None

    def _end_the_sender(self) -> None:
        """A stalled sender (stopped, stuck on a dead disk) outlives its ssh: end it by its job folder."""
        with contextlib.suppress(PotatoQueueError):
            run_ssh(self.target, ["pkill", "-KILL", "-f", "--", self.job], timeout_s=30)
        with contextlib.suppress(PotatoQueueError):
            run_ssh(self.target, ["sh", "-c", self.cleanup], timeout_s=30)

    def _read_notes(self, stream: IO[bytes], rest: list[str]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace")
            try:
                note = json.loads(line)
            except ValueError:
                rest.append(line)
                continue
            if not isinstance(note, dict):
                rest.append(line)
            elif "manifest" in note and isinstance(note["manifest"], dict):
                self.manifest = {str(name): int(size) for name, size in note["manifest"].items()}
            elif "total" in note:
                self.total = int(note["total"])
            elif "too_big" in note:
                self.kept_there = True
                self.spec.log(f"{note['too_big']} ({int(note['bytes']) / 1e6:.0f} MB) is over max_artifact_mb "
                              f"({self.backend.max_artifact_mb:g} MB): it stays on {self.backend.host} in "
                              f"{self.job}/work")

    def _watch(self, proc: subprocess.Popen[bytes], arrived: Callable[[], int],
               untar: subprocess.Popen[bytes] | None = None) -> None:
        """Once a second (arrived() may walk the artifacts folder): the step line, and the stall watch."""
        last = -1
        while proc.poll() is None or (untar is not None and untar.poll() is None):
            now_s, got = time.monotonic(), arrived()
            if got != last:
                last, self.last_byte_s = got, now_s
            if now_s - self.last_byte_s > self.stall_s:
                self.stalled = True
                for process in (proc, untar):
                    if process is not None and process.poll() is None:
                        process.kill()
                return
            self.spec.step(f"copying the model back: {got / 1e6:.0f} of {self.total / 1e6:.0f} MB")
            _wait_s(proc, untar, 1.0)

    def got(self, size: int) -> None:
        self.received += size


class _Counted(io.RawIOBase):
    """The tar stream as it arrives, counted for the progress line and the stall watch."""

    def __init__(self, stream: IO[bytes], copy: ModelCopy) -> None:
        self.stream, self.copy = stream, copy

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read1(len(buffer)) if hasattr(self.stream, "read1") else self.stream.read(len(buffer))
        buffer[:len(data)] = data
        self.copy.got(len(data))
        return len(data)


def _wait_s(proc: subprocess.Popen[bytes], untar: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """Up to timeout_s, less when the last of them still running ends."""
    running = [process for process in (untar, proc) if process is not None and process.poll() is None]
    if running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            running[0].wait(timeout=timeout_s)


def _size_of(folder: Path) -> int:
    return sum(entry.stat().st_size for entry in folder.rglob("*") if entry.is_file())


def stall_s() -> float:
    """ERR-7's 180 s; POTATO_QUEUE_COPY_STALL_S shortens it, for testing only."""
    return float(os.environ.get("POTATO_QUEUE_COPY_STALL_S") or COPY_STALL_S)
