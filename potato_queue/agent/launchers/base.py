"""How the agent starts a worker: the WorkerLauncher and WorkerHandle base classes.

Standard library only, Python 3.8+. The runner speaks the protocol (bundle,
events, cancel with grace, limits, predictions, result); a launcher only
starts `python -m potato_queue.worker` somewhere and hands back a handle to
it. The local launcher (proc.ProcessLauncher) runs it as a child process in
its own process group; a SLURM launcher submits it with sbatch and follows
its events.jsonl. The runner uses nothing but what these classes declare, so
it assumes no Popen, pipes, pids or process groups.

To write a launcher: subclass both, implement every method that raises
NotImplementedError, and keep the promises in the docstrings.
"""

from typing import Any, Dict, NamedTuple, Optional, Tuple

from potato_queue.agent.errors import LaunchError
from potato_queue.agent.relay import EventRelay

__all__ = ["LaunchError", "WorkerEnded", "WorkerHandle", "WorkerLauncher"]


class WorkerEnded(NamedTuple):
    """Something other than the worker ended it (a scheduler's time limit), or it never ran: the run's
    error `message` with its `code` and the fix, `hint`."""

    code: str
    message: str
    hint: str


class WorkerHandle:
    """One started worker, as the runner sees it.

    Exit codes are shell-style (potato_queue.wire.exit_codes.from_returncode):
    the worker's own code, or 128 + N for a death by signal N.
    """

    #: How the runner's log names what terminate() and kill() reach.
    stop_target = "the worker"

    def started_status(self) -> Tuple[str, str]:
        """The run's status once start() returned: (state, step). A batch job is `pending` until it runs,
        and the server keeps a pending run *waiting* (its wall clock has not started)."""
        return "running", "worker started"

    def ended(self) -> Optional[WorkerEnded]:
        """After the exit: what ended the worker when it was not the worker itself nor our stop, else None."""
        return None

    def relay_output(self, relay: EventRelay) -> None:
        """Start relaying the worker's events and its stderr lines (as `log {level: "stderr"}`) into `relay`.

        Returns at once; the relaying runs in the background until the
        worker's output ends (a local process: reader threads on its pipes;
        a batch job: following its events file).
        """
        raise NotImplementedError

    def wait_relayed(self, timeout_s: float) -> bool:
        """After the exit: wait until all the worker's output has been relayed; False after timeout_s."""
        raise NotImplementedError

    def poll(self) -> Optional[int]:
        """The exit code once the worker has exited, None while it runs."""
        raise NotImplementedError

    def wait(self, timeout_s: float) -> Optional[int]:
        """poll(), after waiting up to timeout_s for the exit (returning early when it comes)."""
        raise NotImplementedError

    def terminate(self) -> None:
        """Ask the whole worker to stop (SIGTERM to it and everything it started); it may take grace."""
        raise NotImplementedError

    def kill(self) -> None:
        """The hard stop: SIGKILL to the whole worker. Safe to call after the exit."""
        raise NotImplementedError

    def rss_mb(self) -> Optional[float]:
        """Resident memory of the whole worker in MB; None when this launcher cannot measure it.

        With None the runner skips the max_ram_mb check (the scheduler, say,
        enforces memory itself).
        """
        raise NotImplementedError

    def describe(self) -> str:
        """The worker in a few words for the run log's `worker started: ...` (e.g. `pid 1234`)."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """After the exit: make sure nothing of the worker is left running (reap its group, its job)."""
        raise NotImplementedError

    def local_group(self) -> Optional[int]:
        """The process group the worker leads on this host; None where it runs elsewhere (a batch job on a
        compute node). The runner samples this host's GPUs, and looks for the run's leftovers on them,
        only for a worker here."""
        return None

    def gpu_usage(self) -> Optional[Dict[str, Any]]:
        """After the exit, for a worker that ran elsewhere: the GPU use measured where it ran (the `usage`
        event's fields: agent/gpu_watch.py), or None when none was."""
        return None


class WorkerLauncher:
    """Starts workers for one agent."""

    def start(self, spec_path: str, workdir: str) -> WorkerHandle:
        """Start the worker on spec.json at `spec_path`, working in `workdir`.

        LaunchError when it cannot be started (an interpreter that does not
        exist, a submission refused).
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release what was prepared ahead of a start that never came (a pre-started worker).

        Called once the run is over, whether or not start() was called.
        """
