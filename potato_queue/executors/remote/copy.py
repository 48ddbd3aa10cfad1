"""The model files back from a host over ssh, shared by the ssh and slurm backends (not an executor).

The host's side is host/fetch.py (through stage.py's first stage): after the
stage's marker (what the login printed before it is skipped), a tar stream of
the job's work/ folder on stdout, notes on stderr (the total, files over
max_artifact_mb). This side waits for the manifest, then extracts the stream
by untar.py's rules (regular files the host announced, with their sizes,
nothing else), shows progress on the step line, and ends a copy that sends
nothing for COPY_STALL_S (ERR-7). A copy is whole only when the sender exited
0 and every file it announced arrived with its size. Anything less, and
anything refused, fails the copy and removes what arrived here; the host's
files stay (the handle removes the job folder only after a whole copy), and
the error and the run's artifact_uri say where they are.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from potato_queue.code_package import host_source
from potato_queue.errors import PotatoQueueError
from potato_queue.executors import untar
from potato_queue.executors.base import LaunchSpec, ModelFilesMissing
from potato_queue.executors.remote.openssh import RemoteBackend, SshTarget, run_script, ssh_argv, ssh_failure
from potato_queue.executors.remote.stage import (
    NoMarker,
    new_marker,
    read_past_marker,
    stage_argv,
    stage_input,
)
from potato_queue.host import fetch as remote_fetch
from potato_queue.settings import COPY_STALL_S

__all__ = ["ModelCopy"]

NOTES_WAIT_S = 10.0
PIPE_BYTES = 1 << 20
NOTES_KEPT_BYTES = 64 << 10


class ModelCopy:
    """The model files back over one ssh (host/fetch.py's tar stream): progress on the step line, files
    over max_artifact_mb named in run.log and left there, and a copy that sends nothing for
    COPY_STALL_S ended (ERR-7)."""

    def __init__(
        self, target: SshTarget, backend: RemoteBackend, spec: LaunchSpec, job: str, stall_s: float = COPY_STALL_S
    ) -> None:
        """`job` is the job folder on the host; `stall_s`: COPY_STALL_S, shortened by tests only."""
        self.target, self.backend, self.spec, self.job = target, backend, spec, job
        self.marker = new_marker()
        self.total = 0
        self.received = 0
        self.last_byte_s = time.monotonic()
        self.stall_s = stall_s
        self.kept_there = False
        self.stalled = False
        self.manifest: dict[str, int] | None = None  # what the sender said it will send
        self.noted = threading.Event()  # the manifest arrived, or the sender's stderr ended
        self.limit_bytes = int(self.backend.max_artifact_mb * 1_000_000)

    def where(self) -> str:
        """Where the model files stay when the copy is not whole: the run's artifact_uri then."""
        return f"{self.backend.host}:{self.job}/work"

    def run(self) -> bool:
        """Copies; True when some model files stayed on the host. ModelFilesMissing after a stall, a
        copy cut short, or one refused (untar.py's rules), with the host's folder as its artifact_uri."""
        artifacts = self.spec.paths.artifacts
        artifacts.mkdir(mode=0o700, exist_ok=True)
        asked = json.dumps({"job": self.job, "limit_bytes": self.limit_bytes}).encode() + b"\n"
        with subprocess.Popen(
            ssh_argv(self.target, stage_argv(self.backend.python, self.marker)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            with contextlib.suppress(OSError):
                proc.stdin.write(stage_input(host_source(remote_fetch)) + asked)
            proc.stdin.close()
            stderr: list[str] = []
            notes = threading.Thread(target=self._read_notes, args=(proc.stderr, stderr), daemon=True)
            notes.start()
            threading.Thread(target=self._watch, args=(proc, lambda: self.received), daemon=True).start()
            refused, failure = self._receive(proc, artifacts)
            if refused is not None:
                proc.kill()
            proc.wait()
            notes.join(NOTES_WAIT_S)  # the manifest is read before the copy is judged
        self._judge(proc.returncode, refused, failure, "".join(stderr), artifacts)
        return self.kept_there

    def _receive(self, proc: subprocess.Popen[bytes], artifacts: Path) -> tuple[str | None, str | None]:
        """(why the copy was refused, why it failed): the manifest first, then the stream by its rules."""
        assert proc.stdout is not None
        try:
            read_past_marker(proc.stdout.fileno(), self.marker)  # what the login printed is not the stream
        except NoMarker:
            return None, None  # _cut_short says so
        while not self.noted.wait(1.0):
            if self.stalled:
                return None, None
        if self.manifest is None:
            return None, None  # _cut_short says so
        with contextlib.suppress(OSError):  # a bigger pipe: fewer, larger splices (P5)
            fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        try:
            untar.check_manifest(self.manifest, self.limit_bytes, artifacts)
            untar.extract(proc.stdout.fileno(), artifacts, self.manifest, self.got)
        except untar.CopyRefused as exc:
            return (None, None) if self.stalled else (str(exc), None)
        except untar.CopyCutShort as exc:
            return None, str(exc)
        except OSError as exc:  # this server's disk: full, or taking no writes
            return None, f"writing {artifacts} failed: {exc}"
        return None, None

    def _judge(
        self, sender_exit: int | None, refused: str | None, failure: str | None, stderr: str, artifacts: Path
    ) -> None:
        host = self.backend.host
        if self.stalled:
            self._end_the_sender()
            self._discard(artifacts)
            self._missing(f"The copy from {host} sent nothing for {self.stall_s:g} s")
        if refused is not None:
            self._end_the_sender()
            self._discard(artifacts)
            self.spec.log(
                f"the copy from {host} was refused: {refused}; nothing of it was kept here (only regular "
                "files the host announced land in artifacts/)"
            )
            self._missing(f"The copy from {host} was refused: {refused}")
        if sender_exit == 255:
            self._discard(artifacts)
            failure_there = ssh_failure(host, stderr)
            self._missing(f"The copy from {host} failed: {failure_there.message}")
        # the sender's exit, or the file that did not come, explains an early end better than the stream does
        cut_short = self._cut_short(sender_exit, artifacts) or failure
        if cut_short:
            self._discard(artifacts)
            self._missing(f"The copy from {host} was cut short: {cut_short}")

    def _missing(self, what: str) -> None:
        """The run's end when the copy is not whole: the predictions count, the model files stay on the host."""
        host, work = self.backend.host, f"{self.job}/work"
        there = (
            f"the model files stay on {host} in {work}: fetch them with `ssh {host} tar -C {work} -cf - . | "
            f"tar -xf - -C {self.spec.paths.artifacts}`"
        )
        message = f"{what}; the predictions are stored, and {there}"
        self.spec.log(message)
        raise ModelFilesMissing(message, artifact_uri=self.where())

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

    def _end_the_sender(self) -> None:
        """A stalled sender (stopped, stuck on a dead disk) outlives its ssh: end it by the stage's marker in
        its argv, and its tar by the folder in tar's."""
        script = f"pkill -KILL -f -- {self.marker}\npkill -KILL -f -- {shlex.quote(self.job + '/work')}\n"
        with contextlib.suppress(PotatoQueueError):
            run_script(self.target, script, timeout_s=30)

    def _read_notes(self, stream: IO[bytes], rest: list[str]) -> None:
        """The sender's JSON lines (a line is bounded: a host's stderr is not trusted); other text is kept,
        up to NOTES_KEPT_BYTES, for ssh's own errors."""
        kept = 0
        try:
            while raw := stream.readline(untar.MAX_NOTE_BYTES):
                line = raw.decode(errors="replace")
                try:
                    note = json.loads(line)
                except ValueError:
                    note = None
                if isinstance(note, dict):
                    self._take_note(note)
                elif kept < NOTES_KEPT_BYTES:
                    rest.append(line[: NOTES_KEPT_BYTES - kept])
                    kept += len(line)
        finally:
            self.noted.set()

    def _take_note(self, note: dict[str, Any]) -> None:
        if "manifest" in note:
            self.manifest = untar.manifest_of(note)
            self.noted.set()
        elif isinstance(note.get("total"), int):
            self.total = note["total"]
        elif isinstance(note.get("too_big"), str) and isinstance(note.get("bytes"), (int, float)):
            self.kept_there = True
            name = note["too_big"][:300]
            name = name if name.isprintable() else repr(name)  # a host's text: no forged run.log lines
            self.spec.log(
                f"{name} ({note['bytes'] / 1e6:.0f} MB) is over max_artifact_mb "
                f"({self.backend.max_artifact_mb:g} MB): it stays on {self.backend.host} in "
                f"{self.job}/work"
            )

    def _watch(self, proc: subprocess.Popen[bytes], arrived: Callable[[], int]) -> None:
        """Once a second: the step line, and the stall watch."""
        last = -1
        while proc.poll() is None:
            now_s, got = time.monotonic(), arrived()
            if got != last:
                last, self.last_byte_s = got, now_s
            if now_s - self.last_byte_s > self.stall_s:
                self.stalled = True
                proc.kill()
                return
            self.spec.step(f"copying the model back: {got / 1e6:.0f} of {self.total / 1e6:.0f} MB")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)

    def got(self, size: int) -> None:
        self.received += size
