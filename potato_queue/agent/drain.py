"""Taking an agent out of service without killing its run: drain.

A draining agent finishes the run in flight, claims no new one, then exits 0. Three ways to ask it:
SIGUSR1; `potato-queue training agent --drain [--workdir DIR]`, which sends that signal to the agent serving
from DIR; and the server's switch for the backend (the page, `POST .../backends/{backend}/drain`), answered to
the agent's next claim.

`--drain` finds the agent by DIR/agent.pid (`<pid> <backend>`), which the agent holds under an exclusive
flock for its whole life. A pid file alone proves nothing (it outlives its process, pids are reused, and
anyone of the account can write one), and a command line cannot tell an agent either (it may be the console
script, `python -m ...` or agent.pyz). The lock can: `--drain` signals the pid only while the file's lock is
held, and, where /proc/locks shows who holds it (Linux), only when that holder is the pid the file names.

Standard library only, Python 3.8+.
"""

import argparse
import fcntl
import os
import signal
import stat
import time
from typing import Any, Callable, List, Optional, Tuple

__all__ = ["PID_FILE", "PidFile", "flock_holders", "parse_pid_line", "drain_main", "drain_on_sigusr1"]

PID_FILE = "agent.pid"
PROC_LOCKS = "/proc/locks"
FIX = "fix: give --workdir the folder the agent was started with"
# A `--drain` holds a shared lock on the file for microseconds while it tests it: an agent starting in that
# moment tries again before it concludes that another agent holds the file.
LOCK_TRIES = 5
LOCK_RETRY_S = 0.05


def _pid_path(workdir: str) -> str:
    return os.path.join(workdir, PID_FILE)


def parse_pid_line(text: str) -> Optional[Tuple[int, str]]:
    """`<pid> <backend>` from a pid file's first line; None for anything else. A pid below 1 is refused:
    os.kill(0 or -1, ...) would signal a process group or every process of the account."""
    pid, _, backend = text.partition("\n")[0].strip().partition(" ")
    if not pid.isdigit() or int(pid) < 1:
        return None
    return int(pid), backend


def flock_holders(locks: str, ino: int) -> List[int]:
    """The pids that hold a flock on inode `ino`, from /proc/locks' text: `1: FLOCK  ADVISORY  WRITE 4242
    fd:01:1311 0 EOF` (the device's major and minor in hex, the inode in decimal). A waiter's line
    (`1: -> FLOCK ...`) holds nothing; POSIX, OFD locks and leases are not an agent's lock."""
    holders = []
    for line in locks.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        # Only the inode is compared: the device /proc/locks shows is the superblock's, which differs from
        # stat's st_dev on btrfs subvolumes; the pid must match too, so a same-numbered inode elsewhere does
        # not stand in for the file.
        try:
            pid, file_ino = int(fields[4]), int(fields[5].rsplit(":", 1)[1])
        except (ValueError, IndexError):
            continue
        if file_ino == ino and pid > 0:  # 0 or -1: a holder outside this pid namespace
            holders.append(pid)
    return holders


def _read_holders(ino: int) -> Optional[List[int]]:
    """flock_holders of /proc/locks; None where it cannot be read (not Linux): the held lock is the proof."""
    try:
        with open(PROC_LOCKS, encoding="ascii", errors="replace") as fh:
            return flock_holders(fh.read(), ino)
    except OSError:
        return None


def _regular(fd: int) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError("not a regular file")


def _same_file(fd: int, path: str) -> bool:
    """Whether `path` is still the file `fd` has open (an agent that exits unlinks it, then lets go)."""
    try:
        found, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def _locked_fd(path: str) -> Optional[int]:
    """`path` open under our exclusive flock; None where another agent holds it; OSError where it cannot be
    opened (O_NOFOLLOW: a link planted there is not followed)."""
    for _ in range(LOCK_TRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            _regular(fd)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            time.sleep(LOCK_RETRY_S)
            continue
        except OSError:
            os.close(fd)
            raise
        if _same_file(fd, path):
            return fd
        os.close(fd)  # we locked a file its agent unlinked as it exited: open the one there now
    return None


def _pid_in(path: str) -> Optional[int]:
    """The pid in another agent's file, for our line (reading it cannot touch its flock: that is its fd's)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            found = parse_pid_line(fh.read(256))
    except OSError:
        return None
    return None if found is None else found[0]


class PidFile:
    """DIR/agent.pid, held under an exclusive flock from the agent's start to its exit. The fd stays open all
    that time, and nothing else in the agent opens the file: the lock is what `--drain` takes as proof."""

    def __init__(self, workdir: str, log: Callable[[str], None]) -> None:
        self.path = _pid_path(workdir)
        self.workdir = workdir
        self.log = log
        self.fd = None  # type: Optional[int]

    def hold(self, backend: str) -> bool:
        """Lock the file and write `<pid> <backend>` in it. False where another agent holds it, or it cannot
        be opened: this agent then serves on (its runs matter more than --drain), and says how to drain it."""
        me = os.getpid()
        try:
            fd = _locked_fd(self.path)
            if fd is not None:
                self._write(fd, "{} {}\n".format(me, backend))
        except OSError as exc:
            self.log(
                "{} cannot be held ({}): --drain --workdir {} cannot reach this agent; it drains with "
                "kill -USR1 {}".format(self.path, exc, self.workdir, me)
            )
            return False
        if fd is None:
            other = _pid_in(self.path)
            self.log(
                "another agent serves from {0} ({1} is locked): --drain --workdir {0} reaches that one{2}; this "
                "one drains with kill -USR1 {3}".format(
                    self.workdir, self.path, " (pid {})".format(other) if other else "", me
                )
            )
            return False
        self.fd = fd
        return True

    @staticmethod
    def _write(fd: int, line: str) -> None:
        try:
            os.ftruncate(fd, 0)  # an earlier agent's line, left by a kill -9, is replaced whole
            os.write(fd, line.encode("utf-8"))
        except OSError:
            os.close(fd)  # a full disk: no half-written file is held (the lock goes with the fd)
            raise

    def release(self) -> None:
        """At exit: the file is removed only by the agent holding its lock, and only while it is still the
        file it locked (another agent may serve from DIR next); closing the fd then lets the lock go."""
        if self.fd is None:
            return
        if _same_file(self.fd, self.path):
            try:
                os.unlink(self.path)
            except OSError:
                pass
        os.close(self.fd)
        self.fd = None


def _lock_is_free(fd: int) -> bool:
    """Whether no agent holds the file: our shared lock is granted (and let go at once) only then."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def _refusal(fd: int, path: str, pid: int) -> Optional[str]:
    """Why `pid` must not be signalled as the agent holding `path` (open as `fd`); None when it is that agent."""
    if _lock_is_free(fd):
        return (
            "{0} names pid {1}, but no agent holds it: the file is stale or forged (its agent is gone, or never "
            "wrote it); nothing signalled; fix: remove {0}, and give --workdir the folder a running agent was "
            "started with".format(path, pid)
        )
    holders = _read_holders(os.fstat(fd).st_ino)
    if holders is None or pid in holders:
        return None
    if not holders:  # held by no process we can see: a shared workdir (NFS), or another pid namespace
        return (
            "{} is held by an agent, but not by pid {} as seen from here (it runs on another machine, or in "
            "another container): nothing signalled; fix: run --drain where that agent runs".format(path, pid)
        )
    return (
        "{} names pid {}, but pid {} holds it: the file was rewritten; nothing signalled; fix: kill -USR1 {} "
        "drains the agent that holds it".format(path, pid, holders[0], holders[0])
    )


def _signal_holder(fd: int, path: str, workdir: str) -> int:
    """Signal the agent named in `path` once the file's lock proves it is that agent's; the exit code."""
    regular = stat.S_ISREG(os.fstat(fd).st_mode)  # a FIFO or a device planted there is not read
    found = parse_pid_line(os.read(fd, 256).decode("utf-8", "replace")) if regular else None
    if found is None:
        print("{} does not hold an agent's `<pid> <backend>`: nothing signalled; {}".format(path, FIX))
        return 1
    pid, backend = found
    refusal = _refusal(fd, path, pid)
    if refusal is not None:
        print(refusal)
        return 1
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:  # it exited between the lock's test and the signal
        print("the agent that served from {} (pid {}) is gone; nothing to drain".format(workdir, pid))
        return 1
    except PermissionError:
        print("pid {} in {} is another account's process: not signalled; {}".format(pid, path, FIX))
        return 1
    print(
        "told the agent of backend {} (pid {}) to drain: it finishes its run, claims no new one, then exits".format(
            backend, pid
        )
    )
    return 0


def drain_main(argv: List[str], prog: str, default_workdir: str) -> int:
    """`--drain`: tell the agent serving from --workdir to drain; 0 when told, 1 when none is proven to serve there."""
    parser = argparse.ArgumentParser(prog=prog + " --drain", description="Tell a running agent to drain.")
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--workdir", default=default_workdir, metavar="DIR", help="the agent's --workdir")
    args, _ = parser.parse_known_args(argv)  # the agent's other options may be given too: they are its
    workdir = os.path.expanduser(args.workdir)
    path = _pid_path(workdir)
    try:
        # Read-only is enough for a shared flock; O_NONBLOCK: a FIFO planted there does not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        print("no agent serves from {} (no {} there); {}".format(workdir, PID_FILE, FIX))
        return 1
    except OSError as exc:
        print("{} cannot be read ({}): nothing signalled; {}".format(path, exc, FIX))
        return 1
    try:
        return _signal_holder(fd, path, workdir)
    finally:
        os.close(fd)


def drain_on_sigusr1(agent: Any) -> None:
    """SIGUSR1 drains `agent` (a BackendAgent): with no run in flight it leaves the claim it waits in, at once."""

    def handler(signum: int, _frame: object) -> None:
        if agent.runner is None and agent.in_claim:
            raise SystemExit(0)  # nothing to finish: the claim that waits (and has claimed nothing) is left
        agent.drain("the agent got SIGUSR1")  # a flag: a run claimed a moment ago still runs, then it exits

    signal.signal(signal.SIGUSR1, handler)
