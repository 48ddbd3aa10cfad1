"""The worker as a process group: start, signal, measure, clean up.

Standard library only, Python 3.8+. The worker runs in its own session (so
its own process group): a signal to the group reaches every process the
trainer started (data loaders, tokenizer pools), and a memory limit counts
them all.
"""

import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

__all__ = ["WorkerProcess", "group_rss_mb", "group_members", "exit_code_of", "DEFAULT_GRACE_S"]

DEFAULT_GRACE_S = 20.0
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0) if hasattr(os, "sysconf") else 4096 / 1048576.0


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: a death by signal N reads as 128 + N (137 for SIGKILL)."""
    return 128 - returncode if returncode < 0 else returncode


def _proc_group(pgid: int) -> Dict[int, int]:
    """pid -> resident pages of the live (not zombie) processes of group `pgid`, from /proc."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # it ended while we looked
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 21 and int(fields[2]) == pgid and fields[0] != b"Z":
            found[int(name)] = int(fields[21])
    return found


def _ps_group_rss_mb(pgid: int) -> float:
    """The same from ps (macOS and other hosts without /proc)."""
    try:
        out = subprocess.run(["ps", "-A", "-o", "pgid=,rss="], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0.0
    total_kb = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == str(pgid) and parts[1].isdigit():
            total_kb += int(parts[1])
    return total_kb / 1024.0


def group_rss_mb(pgid: int) -> float:
    """Resident memory of a whole process group, in MB."""
    if os.path.isdir("/proc/self"):
        return sum(_proc_group(pgid).values()) * _PAGE_MB
    return _ps_group_rss_mb(pgid)


def group_members(pgid: int) -> List[int]:
    """Live (not zombie) processes of group `pgid`; empty where there is no /proc."""
    return sorted(_proc_group(pgid)) if os.path.isdir("/proc/self") else []


class WorkerProcess:
    """`python -m potato_queue.worker --spec SPEC` in a new session, stdout and stderr piped.

    With spec_path None the worker is started ahead of time (`--spec-on-stdin`):
    it starts Python and imports itself, then waits for assign(spec_path).
    """

    def __init__(self, python: str, spec_path: Optional[str], cwd: str, env: Dict[str, str]) -> None:
        argv = [python, "-m", "potato_queue.worker"] + (["--spec", spec_path] if spec_path else ["--spec-on-stdin"])
        # A process group of its own (signals reach the worker and whatever it
        # starts), but the agent's session: whoever started the agent can
        # still find, and stop, everything of the run by that session.
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        self.popen = subprocess.Popen(  # type: ignore[call-overload]
            argv, cwd=cwd, env=env, stdin=subprocess.PIPE if spec_path is None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True, **group,
        )
        # The worker leads its group: the group id is its pid.
        self.pgid = self.popen.pid

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
            pass  # it died waiting; run() sees its exit code

    def poll(self) -> Optional[int]:
        """The worker's return code, or None while it runs."""
        return self.popen.poll()

    def wait(self, timeout_s: float) -> Optional[int]:
        """The exit code once the worker has exited, else None after timeout_s (wakes at the exit)."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, signum: int) -> bool:
        """Send a signal to every process of the worker's group; False when none is left."""
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def rss_mb(self) -> float:
        """Resident memory of the worker and everything in its group, in MB."""
        return group_rss_mb(self.pgid)

    def reap_group(self, timeout_s: float = 5.0) -> None:
        """After the worker exits: SIGKILL what it left behind in its group, and wait for it to go."""
        self.popen.wait()
        deadline = time.monotonic() + timeout_s
        while self.signal_group(signal.SIGKILL) and time.monotonic() < deadline:
            # killpg also succeeds on zombies no one has reaped yet; /proc tells them apart.
            if sys.platform.startswith("linux") and not group_members(self.pgid):
                return
            time.sleep(0.05)
