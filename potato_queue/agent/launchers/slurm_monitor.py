"""Following one submitted SLURM job to its end: when it runs, whether it was requeued, how it ended.

Standard library only, Python 3.8+ (it runs on login nodes). Its own module
because it is the launcher's one hard part: submitting and stopping a job
(launchers/slurm.py) are a command each, while knowing that a job has ended,
and why, takes squeue once per poll_interval_s, the `running` and exit_code
files job.sh writes, scontrol and slurm.out. A job missing from one squeue
answer is unknown, not finished. The monitor concludes the job whatever
happens: one that died without concluding left its runner waiting forever.
"""

import json
import os
import re
import threading
import time
from typing import Callable, Dict, List, Optional

from potato_queue.agent.launchers.base import WorkerEnded
from potato_queue.agent.launchers.follower import read_end
from potato_queue.agent.launchers.slurm_flags import SlurmTooOld
from potato_queue.agent.relay import EventRelay
from potato_queue.wire.exit_codes import EXIT_BAD_SPEC, EXIT_CANCELLED, EXIT_OOM, EXIT_UNEXPECTED
from potato_queue.wire.sbatch import SlurmSettings
from potato_queue.wire.slurm_state import (
    QUEUED_STATES,
    SLURM_ENDED_STATES,
    SQUEUE_FORMAT,
    QueueState,
    describe_state,
    end_fields,
    end_reason,
    parse_scontrol,
    parse_squeue,
    requeue_line,
)

__all__ = ["JobMonitor", "Command"]

KILLED = 128 + 9  # what a worker killed by SIGKILL exits with, shell-style
FILE_CHECK_S = 0.1  # how often exit_code is looked for: the end of a job is seen this fast
# squeue answers in a row that do not list the job, with scontrol unable to say, before it counts as gone.
MISSES_BEFORE_GONE = 3
# After a worker failed, how long SLURM may take to record why the job ended (its KillWait and more).
END_STATE_WAIT_S = 20.0
Log = Callable[[str], None]
# Runs a SLURM command: its stdout, or None when it failed (SlurmTooOld when it refused a flag).
Command = Callable[[List[str]], Optional[str]]


class JobMonitor:
    """One job's state as SLURM and its files tell it; run() follows it (a thread) until `exited` is set.

    `stopping` is set by whoever stops the job (our scancel is then no scheduler's doing); `code` and
    `ended` are the job's exit code and what ended it, once `exited` is set.
    """

    def __init__(
        self,
        job_id: str,
        job_dir: str,
        settings: SlurmSettings,
        log: Log,
        command: Command,
        scancel: Callable[[List[str]], None],
    ) -> None:
        self.job_id, self.job_dir, self.settings, self.log = job_id, job_dir, settings, log
        self.command, self._scancel = command, scancel
        self.state: Optional[QueueState] = None
        self.stopping = False
        self.code: Optional[int] = None
        self.ended: Optional[WorkerEnded] = None
        self.exited = threading.Event()
        self.relay: Optional[EventRelay] = None
        self.requeues = 0  # times SLURM put the job back in its queue after it ran (preempted, requeued)
        self._misses = 0
        self._last_line = ""
        self._seen_lock = threading.Lock()

    def path(self, name: str) -> str:
        """A file in the job's folder."""
        return os.path.join(self.job_dir, name)

    def tell(self, text: str) -> None:
        """A line for the agent's log and the run's (a warning: run.log shows those)."""
        self.log(text)
        if self.relay is not None:
            self.relay.emit("log", level="warning", msg=text)

    def said_resumed(self, line: str) -> None:
        """The worker of a requeued job resumed: run.log says so in one line (`preempted, requeued, resumed at
        step N`), beside the worker's own."""
        if not self.requeues or '"resumed at step' not in line:
            return
        try:
            said = requeue_line(str(json.loads(line).get("msg") or ""))
        except (ValueError, AttributeError):
            return
        if said:
            self.tell(said)

    # -- the monitor thread ---------------------------------------------------
    def run(self) -> None:
        """Follows the job until it is concluded, whatever happens: a monitor that died without concluding
        left its runner waiting forever (and the job, if it ran, holding its GPU)."""
        try:
            self._follow()
            return
        except SlurmTooOld as exc:  # squeue or scontrol refused a flag: no later poll can follow the job
            ended = WorkerEnded(exc.error_code, str(exc), exc.install_hint or "")
        except Exception as exc:  # noqa: BLE001 - anything unexpected still ends the job and the run
            ended = WorkerEnded(
                "monitor_failed",
                "the SLURM job monitor failed ({}: {}); SLURM job {} was cancelled".format(
                    type(exc).__name__, exc, self.job_id
                ),
                "start the run again; if it happens again, report it with the agent's log",
            )
        self.log(ended.message)
        self.stopping = True
        try:
            self._scancel([])
        except Exception:  # noqa: BLE001 - concluding matters more than this cancel's error
            pass
        self.ended, self.code = ended, EXIT_UNEXPECTED
        self.exited.set()

    def _follow(self) -> None:
        next_poll = 0.0
        while not self.exited.is_set():
            self.check_running()
            code = self._exit_code()
            if code is not None:
                self.log("SLURM job {}'s job.sh wrote exit_code {}".format(self.job_id, code))
                self._conclude(code)
                return
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.settings.poll_interval_s
                state = self.squeue()
                if state is None:
                    if self._missing():
                        return
                else:
                    self._misses = 0
                    self._seen(state)
            time.sleep(FILE_CHECK_S)

    def check_running(self) -> None:
        """The job writes `running` (its node) before it starts the worker: the start, seen within 0.1 s."""
        if self.state is None or self.state.state in QUEUED_STATES:
            node = read_end(self.path("running")).strip()
            if node:
                self._seen(QueueState("RUNNING", "None", node))

    def _seen(self, state: QueueState) -> None:
        with self._seen_lock:  # the monitor and the events follower
            before, queued = self.state, state.state in QUEUED_STATES
            line, self.state = describe_state(self.job_id, state), state
            if line == self._last_line:
                return
            self._last_line = line
            if queued and before is not None and before.state not in QUEUED_STATES:
                self.requeues += 1
                self.tell(
                    "SLURM job {} was preempted and requeued: its worker saved a checkpoint, and resumes "
                    "from it when the job runs again".format(self.job_id)
                )
            self.log(line)
            if self.relay is not None:
                self.relay.emit("status", state="pending" if queued else "running", step=line)

    def _missing(self) -> bool:
        """squeue did not list the job: True once it is known to have ended (and concluded)."""
        self._misses += 1
        code = self._exit_code()
        if code is not None:
            self._conclude(code)
            return True
        fields = self.scontrol()
        state = fields.get("JobState", "")
        if state in SLURM_ENDED_STATES:
            self.log(
                "squeue no longer lists SLURM job {}; scontrol says {} (Reason={})".format(
                    self.job_id, state, fields.get("Reason", "")
                )
            )
            self._conclude(self._exit_code(wait_s=2.0), fields)
            return True
        if state:
            self.log(
                "squeue did not list SLURM job {}; scontrol says {}: still following it".format(self.job_id, state)
            )
            return False
        if self._misses < MISSES_BEFORE_GONE:
            self.log(
                "squeue did not list SLURM job {} ({} of {} tries)".format(
                    self.job_id, self._misses, MISSES_BEFORE_GONE
                )
            )
            return False
        self._conclude(self._exit_code(wait_s=2.0), fields)
        return True

    def _conclude(self, code: Optional[int], fields: Optional[Dict[str, str]] = None) -> None:
        """The job has ended (or its worker has): decide the exit code and whether the scheduler ended it."""
        if code != 0 and not self.stopping:
            fields = fields if fields is not None else self._final_fields()
            reason = end_reason(
                self.job_id,
                fields,
                read_end(self.path("slurm.out")),
                self.settings,
                self.stopping,
                waiting_again=self._waiting_again(),
            )
            self.ended = WorkerEnded(*reason) if reason else self._no_worker(code)
        if self.ended is not None:
            code = (
                EXIT_OOM
                if self.ended.code == "slurm_out_of_memory"
                else (EXIT_BAD_SPEC if self.ended.code == "python_not_found" else EXIT_UNEXPECTED)
            )
        elif code is None and self.stopping:
            # job.sh went with the worker (our hard stop), or the job was cancelled before it ran.
            code = KILLED if self.state is not None and self.state.state != "PENDING" else EXIT_CANCELLED
        elif code is None:
            # run.log says it with what scontrol knew: nothing else tells how job.sh ended
            said = " ".join(end_fields(fields or {}))
            self.tell(
                "SLURM job {} left the queue without writing exit_code ({})".format(
                    self.job_id, "scontrol: " + said if said else "scontrol no longer knows the job"
                )
            )
            code = EXIT_UNEXPECTED
        self.code = code
        self.exited.set()

    def _waiting_again(self) -> bool:
        """Requeued, and not started since: job.sh writes `running` at each start and removes it when the
        worker was preempted."""
        return bool(self.requeues and self.state is not None and self.state.state in QUEUED_STATES)

    def _no_worker(self, code: Optional[int]) -> Optional[WorkerEnded]:
        """job.sh could not start job_python (exit 127 and not one event)."""
        events = self.path("events.jsonl")
        if code != 127 or (os.path.exists(events) and os.path.getsize(events) > 0):
            return None
        node = (self.state.node if self.state else "") or "the compute node"
        return WorkerEnded(
            "python_not_found",
            "{} was not found on {}".format(self.settings.job_python, node),
            "set the backend's job_python to an interpreter the compute nodes have (a path on shared "
            "storage), or make it available in prelude (module load, conda activate)",
        )

    def _final_fields(self) -> Dict[str, str]:
        """scontrol's view once SLURM has recorded the job's end (it may still be completing)."""
        deadline = time.monotonic() + END_STATE_WAIT_S
        fields = self.scontrol()
        while fields.get("JobState") not in SLURM_ENDED_STATES and fields and time.monotonic() < deadline:
            if re.search(r"DUE TO|oom-kill|memory limit", read_end(self.path("slurm.out"))):
                break  # slurmstepd has said why already
            time.sleep(0.25)
            fields = self.scontrol()
        return fields

    def _exit_code(self, wait_s: float = 0.0) -> Optional[int]:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                with open(self.path("exit_code")) as fh:
                    return int(fh.read().strip())
            except (OSError, ValueError):
                if time.monotonic() >= deadline:
                    return None
            time.sleep(0.1)  # shared storage may show another node's file a moment late

    # -- SLURM's questions ----------------------------------------------------
    def squeue(self) -> Optional[QueueState]:
        """The job's line in squeue; None when squeue does not list it (or could not say)."""
        out = self.command(["squeue", "-h", "-j", self.job_id, "-o", SQUEUE_FORMAT])
        return None if out is None else parse_squeue(out)

    def scontrol(self) -> Dict[str, str]:
        """scontrol's fields of the job; {} once SLURM no longer knows it."""
        out = self.command(["scontrol", "show", "job", "-o", self.job_id])
        return {} if out is None else parse_scontrol(out)
