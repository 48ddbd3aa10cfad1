"""The sbatch launcher: the worker as a SLURM batch job, followed through files on shared storage (SLURM-1..7).

Standard library only, Python 3.8+ (it runs on login nodes). The runner sees
a WorkerHandle like any other: start() writes job.sh and submits it with
`sbatch --parsable`; a monitor thread runs squeue once per poll_interval_s
(relaying each queue-state change as the run's step) and watches for the
exit_code file job.sh writes; followers relay events.jsonl and stderr.log as
they grow. A job missing from one squeue answer is unknown, not finished:
scontrol, exit_code and slurm.out decide. Cancel is `scancel --full
--signal=TERM`, the hard stop a plain `scancel`. srun and sacct are never used.
"""

import json
import os
import re
import subprocess
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from potato_queue.agent.launchers.base import LaunchError, WorkerEnded, WorkerHandle, WorkerLauncher
from potato_queue.agent.launchers.follower import Follower, read_end
from potato_queue.agent.launchers.slurm_flags import SlurmTooOld, refuse_unknown_flag
from potato_queue.agent.relay import MAX_LINE, EventRelay, stdout_event
from potato_queue.wire.exit_codes import EXIT_BAD_SPEC, EXIT_CANCELLED, EXIT_OOM, EXIT_UNEXPECTED
from potato_queue.wire.files import write_atomic
from potato_queue.wire.isolated import allowed_env, python_argv, shared_code_root
from potato_queue.wire.sbatch import (
    CANCEL_MARKER,
    NO_SBATCH_FIX,
    QUEUED_STATES,
    SLURM_ENDED_STATES,
    SQUEUE_FORMAT,
    QueueState,
    SlurmSettings,
    describe_state,
    end_fields,
    end_reason,
    job_name,
    job_script,
    no_sbatch,
    parse_job_id,
    parse_scontrol,
    parse_squeue,
    requeue_line,
    sbatch_argv,
)

__all__ = ["SlurmLauncher", "SlurmJob"]

KILLED = 128 + 9  # what a worker killed by SIGKILL exits with, shell-style
FILE_CHECK_S = 0.1  # how often exit_code is looked for: the end of a job is seen this fast
COMMAND_TIMEOUT_S = 60
# squeue answers in a row that do not list the job, with scontrol unable to say, before it counts as gone.
MISSES_BEFORE_GONE = 3
# After a worker failed, how long SLURM may take to record why the job ended (its KillWait and more).
END_STATE_WAIT_S = 20.0
Log = Callable[[str], None]


class SlurmJob(WorkerHandle):
    """One submitted job. Its exit code is the worker's (exit_code), or the scheduler's end of it."""

    stop_target = "the SLURM job"

    def __init__(self, job_id: str, job_dir: str, flags: List[str], launcher: "SlurmLauncher") -> None:
        self.job_id, self.job_dir, self.flags, self.launcher = job_id, job_dir, flags, launcher
        self.settings, self.log = launcher.settings, launcher.log
        self.state = None  # type: Optional[QueueState]
        self.stopping = False
        self._code = None  # type: Optional[int]
        self._ended = None  # type: Optional[WorkerEnded]
        self._exited = threading.Event()
        self._relay = None  # type: Optional[EventRelay]
        self._followers = []  # type: List[Follower]
        self._misses = 0
        self._last_line = ""
        self._seen_lock = threading.Lock()
        self.requeues = 0  # times SLURM put the job back in its queue after it ran (preempted, requeued)

    # -- what the runner calls ------------------------------------------------
    def started_status(self) -> Tuple[str, str]:
        return "pending", "Submitted SLURM job {}: {}".format(self.job_id, " ".join(self.flags) or "no flags")

    def relay_output(self, relay: EventRelay) -> None:
        self._relay = relay

        def event(raw: bytes) -> None:
            # The job's RUNNING line goes first: sent after the worker's own steps, it would hide them.
            self._check_running()
            line = stdout_event(raw)
            relay.put(line)
            if self.requeues and line and '"resumed at step' in line:
                self._said_resumed(line)

        def stderr(raw: bytes) -> None:
            text = raw.decode("utf-8", "replace").rstrip()
            if text.strip():
                relay.emit("log", level="stderr", msg=text[:MAX_LINE])

        self._followers = [
            Follower(self._path("events.jsonl"), event, re.compile(rb"\n")),
            Follower(self._path("stderr.log"), stderr, re.compile(rb"[\r\n]")),
        ]
        threading.Thread(target=self._monitor, name="squeue", daemon=True).start()

    def wait_relayed(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for follower in self._followers:
            follower.finished.set()
            follower.thread.join(max(0.0, deadline - time.monotonic()))
        return not any(follower.thread.is_alive() for follower in self._followers)

    def poll(self) -> Optional[int]:
        return self._code

    def wait(self, timeout_s: float) -> Optional[int]:
        self._exited.wait(timeout_s)
        return self._code

    def _said_resumed(self, line: str) -> None:
        """The worker of a requeued job resumed: run.log says so in one line (`preempted, requeued, resumed at
        step N`), beside the worker's own."""
        try:
            said = requeue_line(str(json.loads(line).get("msg") or ""))
        except (ValueError, AttributeError):
            return
        if said:
            self._tell(said)

    def _tell(self, text: str) -> None:
        """A line for the agent's log and the run's (a warning: run.log shows those)."""
        self.log(text)
        if self._relay is not None:
            self._relay.emit("log", level="warning", msg=text)

    def _mark_cancel(self) -> None:
        """Before our scancel: the worker of a requeueable job takes a SIGTERM without this file for a
        preemption (a checkpoint first), and with it for the cancel it is."""
        if self.settings.requeue:
            write_atomic(self._path(CANCEL_MARKER), b"", mode=0o600, durable=False)

    def terminate(self) -> None:
        self._mark_cancel()
        self.stopping = True
        if self.state is None or self.state.state == "PENDING":
            self._scancel([])  # a pending job gets its signal only once it runs: nothing to wait for
        else:
            self._scancel(["--full", "--signal=TERM"])

    def kill(self) -> None:
        """The plain scancel: SLURM ends the job (SIGCONT and SIGTERM to all of it, SIGKILL after its KillWait)
        and frees its allocation. SLURM has no SIGKILL-at-once for a batch job: scancel --signal=KILL is this
        same cancel."""
        self._mark_cancel()
        self.stopping = True
        if self._code is None:
            self._scancel([])

    def rss_mb(self) -> Optional[float]:
        return None  # the scheduler enforces the job's memory (mem)

    def describe(self) -> str:
        return "SLURM job {}".format(self.job_id)

    def cleanup(self) -> None:
        """A job still queued or running after its worker's end (a stuck shell, a lost exit) is cancelled."""
        try:
            state = self._squeue()
        except SlurmTooOld:  # squeue cannot say: a cancel of a job that has ended changes nothing
            state = None
            self._scancel([])
        if state is not None and state.state in ("PENDING", "RUNNING", "SUSPENDED", "REQUEUED"):
            self._scancel([])

    def ended(self) -> Optional[WorkerEnded]:
        return self._ended

    # -- the monitor thread ---------------------------------------------------
    def _path(self, name: str) -> str:
        return os.path.join(self.job_dir, name)

    def _monitor(self) -> None:
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
        self._ended, self._code = ended, EXIT_UNEXPECTED
        self._exited.set()

    def _follow(self) -> None:
        next_poll = 0.0
        while not self._exited.is_set():
            self._check_running()
            code = self._exit_code()
            if code is not None:
                self.log("SLURM job {}'s job.sh wrote exit_code {}".format(self.job_id, code))
                self._conclude(code)
                return
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.settings.poll_interval_s
                state = self._squeue()
                if state is None:
                    if self._missing():
                        return
                else:
                    self._misses = 0
                    self._seen(state)
            time.sleep(FILE_CHECK_S)

    def _check_running(self) -> None:
        """The job writes `running` (its node) before it starts the worker: the start, seen within 0.1 s."""
        if self.state is None or self.state.state in QUEUED_STATES:
            node = read_end(self._path("running")).strip()
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
                self._tell(
                    "SLURM job {} was preempted and requeued: its worker saved a checkpoint, and resumes "
                    "from it when the job runs again".format(self.job_id)
                )
            self.log(line)
            if self._relay is not None:
                self._relay.emit("status", state="pending" if queued else "running", step=line)

    def _missing(self) -> bool:
        """squeue did not list the job: True once it is known to have ended (and concluded)."""
        self._misses += 1
        code = self._exit_code()
        if code is not None:
            self._conclude(code)
            return True
        fields = self._scontrol()
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
                read_end(self._path("slurm.out")),
                self.settings,
                self.stopping,
                waiting_again=self._waiting_again(),
            )
            self._ended = WorkerEnded(*reason) if reason else self._no_worker(code)
        if self._ended is not None:
            code = (
                EXIT_OOM
                if self._ended.code == "slurm_out_of_memory"
                else (EXIT_BAD_SPEC if self._ended.code == "python_not_found" else EXIT_UNEXPECTED)
            )
        elif code is None and self.stopping:
            # job.sh went with the worker (our hard stop), or the job was cancelled before it ran.
            code = KILLED if self.state is not None and self.state.state != "PENDING" else EXIT_CANCELLED
        elif code is None:
            # run.log says it with what scontrol knew: nothing else tells how job.sh ended
            said = " ".join(end_fields(fields or {}))
            self._tell(
                "SLURM job {} left the queue without writing exit_code ({})".format(
                    self.job_id, "scontrol: " + said if said else "scontrol no longer knows the job"
                )
            )
            code = EXIT_UNEXPECTED
        self._code = code
        self._exited.set()

    def _waiting_again(self) -> bool:
        """Requeued, and not started since: job.sh writes `running` at each start and removes it when the
        worker was preempted."""
        return bool(self.requeues and self.state is not None and self.state.state in QUEUED_STATES)

    def _no_worker(self, code: Optional[int]) -> Optional[WorkerEnded]:
        """job.sh could not start job_python (exit 127 and not one event)."""
        events = self._path("events.jsonl")
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
        fields = self._scontrol()
        while fields.get("JobState") not in SLURM_ENDED_STATES and fields and time.monotonic() < deadline:
            if re.search(r"DUE TO|oom-kill|memory limit", read_end(self._path("slurm.out"))):
                break  # slurmstepd has said why already
            time.sleep(0.25)
            fields = self._scontrol()
        return fields

    def _exit_code(self, wait_s: float = 0.0) -> Optional[int]:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                with open(self._path("exit_code")) as fh:
                    return int(fh.read().strip())
            except (OSError, ValueError):
                if time.monotonic() >= deadline:
                    return None
            time.sleep(0.1)  # shared storage may show another node's file a moment late

    # -- SLURM's commands -----------------------------------------------------
    def _squeue(self) -> Optional[QueueState]:
        out = self.launcher.command(["squeue", "-h", "-j", self.job_id, "-o", SQUEUE_FORMAT])
        return None if out is None else parse_squeue(out)

    def _scontrol(self) -> Dict[str, str]:
        out = self.launcher.command(["scontrol", "show", "job", "-o", self.job_id])
        return {} if out is None else parse_scontrol(out)

    def _scancel(self, options: List[str]) -> None:
        argv = ["scancel"] + options + [self.job_id]
        self.log(" ".join(argv))
        try:
            self.launcher.command(argv)
        except SlurmTooOld as exc:
            self._tell(str(exc))
            if options:  # the plain scancel still ends the job, only without its checkpoint first
                self._scancel([])


class SlurmLauncher(WorkerLauncher):
    """Submits each run's worker with sbatch from this (login) node."""

    def __init__(self, settings: SlurmSettings, log: Log, host: Optional[str] = None) -> None:
        self.settings, self.log = settings, log
        self.host = host or os.uname()[1]
        self.env = allowed_env(os.environ, settings.env, settings.secret_env)

    def command(self, argv: List[str]) -> Optional[str]:
        """A SLURM command's stdout; None when it failed (its stderr is logged) or is not there."""
        try:
            done = subprocess.run(
                argv, env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self.log("{} could not run: {}".format(argv[0], exc))
            return None
        if done.returncode != 0:
            refuse_unknown_flag(argv[0], done.stderr)  # every later call would fail the same way
            if "Invalid job id" not in done.stderr:
                self.log("{} failed ({}): {}".format(" ".join(argv), done.returncode, done.stderr.strip()[:500]))
            return None
        return done.stdout

    def start(self, spec_path: str, workdir: str) -> SlurmJob:
        job_dir = os.path.dirname(os.path.abspath(spec_path))
        run_id = os.path.basename(job_dir)
        worker = python_argv(
            self.settings.job_python,
            "potato_queue.worker",
            ["--spec", spec_path],
            code_root=shared_code_root(os.path.dirname(job_dir)),
        )
        write_atomic(
            os.path.join(job_dir, "job.sh"),
            job_script(self.settings, run_id, job_dir, worker),
            mode=0o600,
            durable=False,
        )
        argv = sbatch_argv(self.settings, run_id, job_dir)
        try:
            done = subprocess.run(
                argv, env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
            )
        except FileNotFoundError as exc:
            raise LaunchError("no_sbatch", no_sbatch(self.host), NO_SBATCH_FIX) from exc
        except (OSError, subprocess.SubprocessError) as exc:
            raise LaunchError("sbatch_failed", "sbatch could not run: {}".format(exc)) from exc
        if done.returncode != 0:
            refuse_unknown_flag("sbatch", done.stderr)
            raise LaunchError(
                "sbatch_refused",
                "sbatch refused the job: {}".format(done.stderr.strip() or done.stdout.strip()),
                "check the backend's sbatch settings ({}) against the cluster's partitions (sinfo) and limits".format(
                    " ".join(argv[2:-4]) or "none set"
                ),
            )
        try:
            job_id = parse_job_id(done.stdout)
        except ValueError as exc:
            self.command(["scancel", "--name", job_name(run_id), "--user", str(os.getuid())])  # if it was queued
            refuse_unknown_flag("sbatch", done.stderr)
            raise LaunchError("sbatch_failed", str(exc)) from exc
        flags = argv[2:-4]
        self.log("Submitted SLURM job {}: {}".format(job_id, " ".join(argv)))
        return SlurmJob(job_id, job_dir, flags, self)
