"""The exit codes of a run, defined once (Potato 2.12's worker protocol).

Standard library only: the worker, the agent on a bare host, the server's
run lifecycle and the CLI all import them from here.
"""

__all__ = [
    "EXIT_OK",
    "EXIT_UNEXPECTED",
    "EXIT_BAD_SPEC",
    "EXIT_MISSING_DEPENDENCY",
    "EXIT_CANCELLED",
    "EXIT_OOM",
    "EXIT_PREEMPTED",
    "EXIT_FOR_STATE",
    "from_returncode",
]

EXIT_OK = 0
#: Anything unexpected; also the agent's "the run failed" when it has no better code.
EXIT_UNEXPECTED = 1
#: A bad spec or bundle (and, on the agent, a setup that could not start the worker).
EXIT_BAD_SPEC = 2
EXIT_MISSING_DEPENDENCY = 3
EXIT_CANCELLED = 4
EXIT_OOM = 5
#: Ours, beyond Potato's: the machine was taken back (SLURM preemption, SIGUSR1); the trainer saved a
#: checkpoint first where it could, and a requeued job resumes from it.
EXIT_PREEMPTED = 6

#: What `training run --follow` exits with for a run's final state.
EXIT_FOR_STATE = {"succeeded": EXIT_OK, "failed": EXIT_UNEXPECTED, "cancelled": EXIT_CANCELLED}


def from_returncode(returncode: int) -> int:
    """A shell-style exit code: a death by signal N reads as 128 + N (137 for SIGKILL)."""
    return 128 - returncode if returncode < 0 else returncode
