"""The parent worker of a data-parallel run: start the ranks, pass them its stops, end with rank 0's code.

Standard library only, Python 3.8+. The ranks are this worker's children, in
its process group (the agent's SIGKILL of the group, its memory sum and its
clean-up reach them) and with their own stdin: a pipe on which the parent
writes each stop signal it gets (stop.stop_from_parent says why not the
signal itself). Rank 0 writes its events straight into the worker's event
stream; the others write nothing there (their events go to a pipe of which
the parent keeps only an error). A rank that fails while no stop was asked
ends the run: the others are killed at once (they would wait on it in their
next gradient exchange), and the error names the rank and its exit code.
A rank that ends after a stop leaves the others PEER_GRACE_S to end too: one
still running then waits on it inside a rendezvous or a collective it cannot
leave (and where no signal handler of its runs), and is killed; the run still
ends as the stop says.
"""

import os
import signal
import subprocess
import time
from types import FrameType
from typing import List, Optional, Tuple

from potato_queue.wire.events import Reporter, parse_line
from potato_queue.wire.exit_codes import EXIT_CANCELLED, EXIT_OK, EXIT_OOM, EXIT_PREEMPTED, EXIT_UNEXPECTED

from .parallel import RankLaunch
from .stop import term_is_preemption

__all__ = ["RankProcesses", "run_ranks"]

_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
_STOPPED = (EXIT_CANCELLED, EXIT_PREEMPTED)
# Ranks that stop together (at a check all of them agree on, the last one after rank 0's checkpoint) end
# within a moment of one another. A rank that stopped alone, before the trainer's loop, leaves a peer waiting
# on it in init_process_group's rendezvous (30 minutes) or a collective (NCCL's: for ever), and the agent's
# SIGKILL after its grace (agent/runner.py, 20 s) ended the run 137. Well inside that grace.
PEER_GRACE_S = 5.0
_POLL_S = 0.05


def _exit_code(status: int) -> int:
    """A wait status as a shell would say it (os.waitstatus_to_exitcode is 3.9+)."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class RankProcesses:
    """The running ranks: started, told of stops, reaped as they end."""

    def __init__(self, launches: List[RankLaunch], events: Optional[int]) -> None:
        self.launches = launches
        self.codes = {}  # type: Dict[int, int]
        self.killed = set()  # type: set
        # Killed PEER_GRACE_S after a rank ended on a stop: they waited on it.
        self.stuck = set()  # type: set
        self.stopped = False
        self.stop_name = ""
        self.procs = []  # type: List[subprocess.Popen]
        for launch in launches:
            # Rank 0 writes into the worker's own event stream; the others into a pipe read once they end.
            out = events if launch.rank == 0 else subprocess.PIPE
            self.procs.append(
                subprocess.Popen(
                    launch.argv, env=dict(os.environ, **launch.env), stdin=subprocess.PIPE, stdout=out, close_fds=True
                )
            )

    def forward(self, signum: int, frame: Optional[FrameType]) -> None:
        """A stop signal for the worker: each live rank gets it once, as a line on its stdin."""
        self.stopped = True
        self.stop_name = self.stop_name or signal.Signals(signum).name
        for rank, proc in enumerate(self.procs):
            if rank in self.codes or proc.stdin is None:
                continue
            try:
                proc.stdin.write((signal.Signals(signum).name + "\n").encode("ascii"))
                proc.stdin.flush()
            except (OSError, ValueError):
                pass  # it ended meanwhile; the wait sees it

    def wait_all(self) -> Optional[int]:
        """Reap every rank; the rank that failed first while no stop was asked (the rest then killed), or None."""
        by_pid = {proc.pid: rank for rank, proc in enumerate(self.procs)}
        failed = None
        deadline = None  # type: Optional[float]
        while len(self.codes) < len(self.procs):
            pid, status = _wait(deadline)
            if pid == 0:  # a rank ended after the stop PEER_GRACE_S ago and these still wait on it
                self._kill_others(self.stuck)
                deadline = None
                continue
            if pid not in by_pid or by_pid[pid] in self.codes:  # one _kill_others found ended (reaped by poll)
                continue
            rank = by_pid[pid]
            self.codes[rank] = _exit_code(status)
            self.procs[rank].returncode = status  # reaped here: Popen must not wait for it again
            if failed is None and self.codes[rank] != EXIT_OK and not self.stopped:
                failed = rank
                self._kill_others()
            elif self.stopped and self.codes[rank] != EXIT_OK and deadline is None and not self.stuck:
                deadline = time.monotonic() + PEER_GRACE_S
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        return failed

    def stopped_code(self) -> Optional[int]:
        """How the run ends when the parent had to kill rank 0 after a stop (it said nothing): as the ranks
        that did stop ended, else as the stop says (cancelled or preempted); None otherwise."""
        if 0 not in self.stuck:
            return None
        said = [code for code in self.codes.values() if code in _STOPPED]
        if said:
            return said[0]
        preempted = self.stop_name == "SIGUSR1" or (self.stop_name == "SIGTERM" and term_is_preemption())
        return EXIT_PREEMPTED if preempted else EXIT_CANCELLED

    def _kill_others(self, into: Optional[set] = None) -> None:
        """Kill the ranks still running, named in `into` (self.killed: stopped because a peer failed;
        self.stuck: waited on a peer that ended on a stop)."""
        for rank, proc in enumerate(self.procs):
            if rank in self.codes:
                continue
            if proc.poll() is not None:  # it had ended by itself already (reaped by poll: os.wait will not see it)
                self.codes[rank] = 128 - proc.returncode if proc.returncode < 0 else proc.returncode
                continue
            (self.killed if into is None else into).add(rank)
            try:
                proc.kill()
            except OSError:
                pass

    def first_cause(self, failed: Optional[int]) -> Optional[int]:
        """The rank whose end ended the run: a rank besides 0 that failed by itself (rank 0, when a peer dies,
        fails too, with the gradient exchange's error: the symptom, not the cause), else `failed`."""
        if failed != 0:
            return failed
        peers = [
            rank
            for rank, code in sorted(self.codes.items())
            if rank != 0 and code != EXIT_OK and rank not in self.killed
        ]
        return peers[0] if peers else failed

    def last_error(self, rank: int) -> Optional[dict]:
        """The error event rank `rank` wrote (ranks but 0 write nothing else), or None."""
        stream = self.procs[rank].stdout
        if stream is None:
            return None
        found = None
        for line in stream.read().decode("utf-8", "replace").splitlines():
            event = parse_line(line)
            if event is not None and event["event"] == "error":
                found = event
        stream.close()
        return found


def _wait(deadline: Optional[float]) -> Tuple[int, int]:
    """os.wait(), or (0, 0) once `deadline` (time.monotonic()) passes with no rank ended."""
    if deadline is None:
        return os.wait()
    while True:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid or time.monotonic() >= deadline:
            return pid, status
        time.sleep(_POLL_S)


def _others_words(stopped: List[int], ended: List[int]) -> str:
    """What became of the other ranks: stopped by the parent, or ended by themselves (a peer's death breaks
    the gradient exchange, so a rank may fail with it before the parent stops it)."""

    def ranks(found: List[int]) -> str:
        return "rank %d" % found[0] if len(found) == 1 else "ranks %s" % ", ".join(map(str, found))

    words = (["%s %s stopped" % (ranks(stopped), "was" if len(stopped) == 1 else "were")] if stopped else []) + (
        ["%s ended with it" % ranks(ended)] if ended else []
    )
    return " and ".join(words) or "no other rank was running"


def run_ranks(launches: List[RankLaunch], reporter: Reporter) -> int:
    """Start the ranks, pass on stops, wait for all; the run's exit code (rank 0's, or the failed rank's)."""
    reporter.flush()
    try:
        events = reporter.stream.fileno()  # type: Optional[int]
    except (AttributeError, OSError, ValueError):
        events = None  # not a file (a test's in-memory stream): rank 0 writes to the worker's own stdout
    ranks = RankProcesses(launches, events)
    previous = {sig: signal.signal(sig, ranks.forward) for sig in _STOPS}
    try:
        failed = ranks.first_cause(ranks.wait_all())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    ended_as = ranks.stopped_code()
    if ended_as is not None:  # rank 0 was killed waiting on a stopped peer: the parent says how the run ended
        gone = sorted(rank for rank in ranks.codes if rank not in ranks.stuck)
        reporter.status(
            "preempted" if ended_as == EXIT_PREEMPTED else "cancelled",
            "stopped on %s: %s ended while rank 0 waited on it, and rank 0 was ended %g s later"
            % (ranks.stop_name or "SIGTERM", ", ".join("rank %d" % rank for rank in gone), PEER_GRACE_S),
        )
        return ended_as
    if failed is None or (failed == 0 and ranks.codes[0] in range(1, 7)):
        return ranks.codes[0]  # rank 0 said how it ended (result, error, cancelled, preempted)
    code = ranks.codes[failed]
    said = ranks.last_error(failed) if failed else None
    why = ": %s" % said["message"] if said else ""
    stopped = sorted(ranks.killed)
    ended = sorted(rank for rank in ranks.codes if rank != failed and rank not in ranks.killed)
    reporter.error(
        "out_of_memory" if code == EXIT_OOM else (said or {}).get("code") or "fit_failed",
        "rank %d of %d (%s) exited with code %d%s; %s"
        % (failed, len(launches), launches[failed].device, code, why, _others_words(stopped, ended)),
        (said or {}).get("install_hint", ""),
    )
    return code if code in range(1, 6) else EXIT_UNEXPECTED
