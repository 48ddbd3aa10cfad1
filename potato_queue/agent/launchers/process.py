"""Processes: one /proc scan, and the local launcher (the worker as a process group).

Standard library only, Python 3.8+. The worker runs in its own process group
(in the agent's session): a signal to the group reaches every process the
trainer started (data loaders, tokenizer pools), and a memory limit counts
them all. scan_processes is shared with the server's local executor, which
finds what is left of a run by its session.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional

from potato_queue.agent.launchers.base import LaunchError, WorkerHandle, WorkerLauncher
from potato_queue.agent.relay import EventRelay, read_stderr, read_stdout
from potato_queue.wire.exit_codes import from_returncode
from potato_queue.wire.isolated import CODE_ROOT, allowed_env, python_argv

__all__ = [
    "ProcEntry",
    "scan_processes",
    "read_process",
    "group_rss_mb",
    "group_members",
    "worker_env",
    "WorkerProcess",
    "ProcessLauncher",
]

PAGE_MB = os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0) if hasattr(os, "sysconf") else 4096 / 1048576.0
PYTHON_HINT = "set the backend's python to an interpreter that exists on this host"


class ProcEntry(NamedTuple):
    """One process as /proc/<pid>/stat tells it (cmdline only when asked for)."""

    pid: int
    state: str  # "R", "S", ... "Z" for a zombie no one has reaped yet
    pgid: int
    sid: int
    rss_pages: int
    cmdline: bytes  # NUL-separated argv; b"" unless scan_processes(with_cmdline=True)

    @property
    def rss_mb(self) -> float:
        """Resident memory in MB."""
        return self.rss_pages * PAGE_MB


def read_process(pid: int, with_cmdline: bool = False) -> Optional[ProcEntry]:
    """The entry of one pid; None once it has ended (or its files cannot be read)."""
    base = "/proc/{}/".format(pid)
    try:
        with open(base + "stat", "rb") as fh:
            stat = fh.read()
        cmdline = b""
        if with_cmdline:
            with open(base + "cmdline", "rb") as fh:
                cmdline = fh.read()
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        return ProcEntry(
            pid, fields[0].decode("ascii", "replace"), int(fields[2]), int(fields[3]), int(fields[21]), cmdline
        )
    except (OSError, IndexError, ValueError):
        return None  # it ended while we looked


def scan_processes(with_cmdline: bool = False) -> List[ProcEntry]:
    """Every process on this host (zombies too, see `state`), in one pass over /proc; [] without /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    entries = (read_process(int(name), with_cmdline) for name in names if name.isdigit())
    return [entry for entry in entries if entry is not None]


def _have_proc() -> bool:
    return os.path.exists("/proc/self/stat")


def _live_group(pgid: int) -> List[ProcEntry]:
    return [entry for entry in scan_processes() if entry.pgid == pgid and entry.state != "Z"]


def _ps_group_rss_mb(pgid: int) -> Optional[float]:
    """The group's memory from ps (macOS and other hosts without /proc); None when ps fails."""
    try:
        out = subprocess.run(["ps", "-A", "-o", "pgid=,rss="], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total_kb = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == str(pgid) and parts[1].isdigit():
            total_kb += int(parts[1])
    return total_kb / 1024.0


def group_rss_mb(pgid: int) -> Optional[float]:
    """Resident memory of a whole process group in MB; None when it cannot be measured here."""
    if _have_proc():
        return sum(entry.rss_pages for entry in _live_group(pgid)) * PAGE_MB
    return _ps_group_rss_mb(pgid)


def group_members(pgid: int) -> List[int]:
    """Live (not zombie) processes of group `pgid`, sorted; empty where there is no /proc."""
    return sorted(entry.pid for entry in _live_group(pgid))


def worker_env() -> Dict[str, str]:
    """The worker's environment: the allow-listed part of the agent's (isolated.allowed_env)."""
    return allowed_env()


class WorkerProcess(WorkerHandle):
    """`python -m potato_queue.worker --spec SPEC` in a process group of its own, stdout and stderr piped.

    With spec_path None the worker is started ahead of time (`--spec-on-stdin`):
    it starts Python and imports itself, then waits for assign(spec_path).
    """

    stop_target = "the worker's process group"

    def __init__(self, python: str, spec_path: Optional[str], cwd: str, env: Dict[str, str]) -> None:
        argv = python_argv(python, "potato_queue.worker", ["--spec", spec_path] if spec_path else ["--spec-on-stdin"])
        # A process group of its own (signals reach the worker and whatever it
        # starts), but the agent's session: whoever started the agent can
        # still find, and stop, everything of the run by that session.
        group: Dict[str, Any] = {"process_group": 0}
        if sys.version_info < (3, 11):
            group = {"preexec_fn": os.setpgrp}
        self.popen = subprocess.Popen(  # type: subprocess.Popen[bytes]
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if spec_path is None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            **group,
        )
        # The worker leads its group: the group id is its pid.
        self.pgid = self.popen.pid
        self._readers = []  # type: List[threading.Thread]

    def assign(self, spec_path: Optional[str]) -> None:
        """Hand a started-ahead worker its spec (None: there is no run; it exits)."""
        stdin = self.popen.stdin
        if stdin is None or stdin.closed:
            return
        try:
            if spec_path is not None:
                stdin.write((spec_path + "\n").encode("utf-8"))
            stdin.close()
        except OSError:
            pass  # it died waiting; the runner sees its exit code

    def relay_output(self, relay: EventRelay) -> None:
        """Reader threads on the worker's stdout (events) and stderr (log lines)."""
        self._readers = [
            threading.Thread(target=read_stdout, args=(self.popen.stdout, relay), daemon=True),
            threading.Thread(target=read_stderr, args=(self.popen.stderr, relay), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def wait_relayed(self, timeout_s: float) -> bool:
        """The pipes close once the whole group is gone (cleanup), and then the readers end."""
        deadline = time.monotonic() + timeout_s
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        return not any(reader.is_alive() for reader in self._readers)

    def poll(self) -> Optional[int]:
        """The worker's exit code, or None while it runs."""
        returncode = self.popen.poll()
        return None if returncode is None else from_returncode(returncode)

    def wait(self, timeout_s: float) -> Optional[int]:
        """The exit code once the worker has exited, else None after timeout_s (wakes at the exit)."""
        try:
            return from_returncode(self.popen.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, signum: int) -> bool:
        """Send a signal to every process of the worker's group; False when none is left."""
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def terminate(self) -> None:
        """SIGTERM to the worker's process group."""
        self.signal_group(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the worker's process group."""
        self.signal_group(signal.SIGKILL)

    def rss_mb(self) -> Optional[float]:
        """Resident memory of the worker and everything in its group, in MB."""
        return group_rss_mb(self.pgid)

    def local_group(self) -> Optional[int]:
        """The worker's process group: it runs here."""
        return self.pgid

    def describe(self) -> str:
        """`pid N` (the group's id too)."""
        return "pid {}".format(self.pgid)

    def cleanup(self, timeout_s: float = 5.0) -> None:
        """After the worker exits: SIGKILL what it left behind in its group, and wait for it to go."""
        self.popen.wait()
        deadline = time.monotonic() + timeout_s
        while self.signal_group(signal.SIGKILL) and time.monotonic() < deadline:
            # killpg also succeeds on zombies no one has reaped yet; /proc tells them apart.
            if _have_proc() and not group_members(self.pgid):
                return
            time.sleep(0.05)


class ProcessLauncher(WorkerLauncher):
    """Workers as child processes of the agent, on this host, with the agent's environment.

    `prestarted` (or prestart()) is a worker started ahead of time: the local
    backend's warm agent hands it its spec instead of waiting for Python to start.
    """

    def __init__(self, python: str, env: Dict[str, str], prestarted: Optional[WorkerProcess] = None) -> None:
        self.python = python
        self.env = env
        self.prestarted = prestarted

    def prestart(self) -> None:
        """Start a worker now that waits for its spec; a failure shows at start() instead."""
        try:
            # In the code's own folder: the working directory is not on its sys.path (isolated.py),
            # and a folder we do not own is no place to wait in.
            self.prestarted = WorkerProcess(self.python, None, CODE_ROOT, self.env)
        except OSError:
            self.prestarted = None

    def start(self, spec_path: str, workdir: str) -> WorkerProcess:
        """The pre-started worker when it is still alive, else a new one."""
        ready, self.prestarted = self.prestarted, None
        if ready is not None and ready.poll() is None:
            ready.assign(spec_path)
            return ready
        try:
            return WorkerProcess(self.python, spec_path, workdir, self.env)
        except OSError as exc:
            text = "{} was not found on {} ({})".format(self.python, socket.gethostname(), exc.strerror)
            raise LaunchError("python_not_found", text, PYTHON_HINT) from exc

    def close(self) -> None:
        """A pre-started worker that got no run is told so (it exits)."""
        if self.prestarted is not None:
            self.prestarted.assign(None)
            self.prestarted = None
