"""Taking an agent out of service without killing its run: drain.

A draining agent finishes the run in flight, claims no new one, then exits 0. Three ways to ask it:
SIGUSR1; `potato-queue training agent --drain [--workdir DIR]`, which sends that signal to the agent serving
from DIR (its pid is in DIR/agent.pid, written while it serves); and the server's switch for the backend
(the page, `POST .../backends/{backend}/drain`), answered to the agent's next claim.

Standard library only, Python 3.8+.
"""

import argparse
import os
import signal
from typing import Any, List, Optional, Tuple

from potato_queue.wire.files import write_atomic

__all__ = ["PID_FILE", "write_pid_file", "remove_pid_file", "drain_main", "drain_on_sigusr1"]

PID_FILE = "agent.pid"


def _pid_path(workdir: str) -> str:
    return os.path.join(workdir, PID_FILE)


def write_pid_file(workdir: str, backend: str) -> None:
    """`<pid> <backend>` in DIR/agent.pid (0600, whole), for `--drain` to find this agent."""
    write_atomic(_pid_path(workdir), "{} {}\n".format(os.getpid(), backend), mode=0o600, durable=False)


def remove_pid_file(workdir: str) -> None:
    """At the agent's exit: only our own (another agent may have started since in the same folder)."""
    found = _read_pid_file(workdir)
    if found is not None and found[0] == os.getpid():
        try:
            os.unlink(_pid_path(workdir))
        except OSError:
            pass


def _read_pid_file(workdir: str) -> Optional[Tuple[int, str]]:
    try:
        with open(_pid_path(workdir), encoding="utf-8") as fh:
            pid, _, backend = fh.readline().strip().partition(" ")
        return int(pid), backend
    except (OSError, ValueError):
        return None


def _is_an_agent(pid: int) -> bool:
    """Whether `pid` is a potato-queue agent (a pid file outlives its process, and pids are reused); True
    where /proc cannot tell (the signal then reaches it only if it is this account's)."""
    try:
        with open("/proc/{}/cmdline".format(pid), "rb") as fh:
            command = fh.read()
        # `potato-queue training agent`, `python -m potato_queue.agent serve` or `python agent.pyz`, serving a backend
        return (b"potato_queue" in command or b".pyz" in command) and b"--backend" in command

    except FileNotFoundError:
        return False
    except OSError:
        return True


def drain_main(argv: List[str], prog: str, default_workdir: str) -> int:
    """`--drain`: tell the agent serving from --workdir to drain; 0 when told, 1 when none serves there."""
    parser = argparse.ArgumentParser(prog=prog + " --drain", description="Tell a running agent to drain.")
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--workdir", default=default_workdir, metavar="DIR", help="the agent's --workdir")
    args, _ = parser.parse_known_args(argv)  # the agent's other options may be given too: they are its
    workdir = os.path.expanduser(args.workdir)
    found = _read_pid_file(workdir)
    fix = "fix: give --workdir the folder the agent was started with"
    if found is None:
        print("no agent serves from {} (no {} there); {}".format(workdir, PID_FILE, fix))
        return 1
    pid, backend = found
    try:
        if not _is_an_agent(pid):
            raise ProcessLookupError
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        print("the agent that served from {} (pid {}) is gone; nothing to drain".format(workdir, pid))
        return 1
    except PermissionError:
        print("pid {} in {} is another account's process: not signalled; {}".format(pid, _pid_path(workdir), fix))
        return 1
    print(
        "told the agent of backend {} (pid {}) to drain: it finishes its run, claims no new one, then exits".format(
            backend, pid
        )
    )
    return 0


def drain_on_sigusr1(agent: Any) -> None:
    """SIGUSR1 drains `agent` (a BackendAgent): with no run in flight it leaves the claim it waits in, at once."""

    def handler(signum: int, _frame: object) -> None:
        if agent.runner is None and agent.in_claim:
            raise SystemExit(0)  # nothing to finish: the claim that waits (and has claimed nothing) is left
        agent.drain("the agent got SIGUSR1")  # a flag: a run claimed a moment ago still runs, then it exits

    signal.signal(signal.SIGUSR1, handler)
