"""The sbatch launcher: the worker as a SLURM batch job, followed through files on shared storage (SLURM-1..7).

Standard library only, Python 3.8+ (it runs on login nodes). The runner sees
a WorkerHandle like any other: start() writes job.sh and submits it with
`sbatch --parsable`; a monitor thread (slurm_monitor.py's JobMonitor) follows
the job to its end through squeue, scontrol and the files job.sh writes;
followers relay events.jsonl and stderr.log as they grow. Cancel is `scancel
--full --signal=TERM`, the hard stop a plain `scancel`. srun and sacct are
never used.
"""

import os
import re
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from potato_queue.agent.gpu_meter import read_usage
from potato_queue.agent.launchers.base import LaunchError, WorkerEnded, WorkerHandle, WorkerLauncher
from potato_queue.agent.launchers.follower import Follower
from potato_queue.agent.launchers.slurm_flags import SlurmTooOld, refuse_unknown_flag
from potato_queue.agent.launchers.slurm_monitor import JobMonitor
from potato_queue.agent.relay import MAX_LINE, EventRelay, stdout_event
from potato_queue.wire.files import write_atomic
from potato_queue.wire.isolated import allowed_env, python_argv, shared_code_root
from potato_queue.wire.sbatch import (
    CANCEL_MARKER,
    GPU_METER_READY_FILE,
    GPU_USAGE_FILE,
    NO_SBATCH_FIX,
    SlurmSettings,
    job_name,
    job_script,
    no_sbatch,
    parse_job_id,
    sbatch_argv,
)

__all__ = ["SlurmLauncher", "SlurmJob"]

COMMAND_TIMEOUT_S = 60
Log = Callable[[str], None]


class SlurmJob(WorkerHandle):
    """One submitted job. Its exit code is the worker's (exit_code), or the scheduler's end of it."""

    stop_target = "the SLURM job"

    def __init__(self, job_id: str, job_dir: str, flags: List[str], launcher: "SlurmLauncher") -> None:
        self.job_id, self.job_dir, self.flags, self.launcher = job_id, job_dir, flags, launcher
        self.settings, self.log = launcher.settings, launcher.log
        self.monitor = JobMonitor(job_id, job_dir, launcher.settings, launcher.log, launcher.command, self._scancel)
        self._followers = []  # type: List[Follower]

    # -- what the runner calls ------------------------------------------------
    def gpu_usage(self) -> Optional[Dict[str, Any]]:
        """What job.sh's GPU meter wrote on the compute node (nothing where the node has no nvidia-smi)."""
        return read_usage(os.path.join(self.job_dir, GPU_USAGE_FILE))

    def started_status(self) -> Tuple[str, str]:
        return "pending", "Submitted SLURM job {}: {}".format(self.job_id, " ".join(self.flags) or "no flags")

    def relay_output(self, relay: EventRelay) -> None:
        monitor = self.monitor
        monitor.relay = relay

        def event(raw: bytes) -> None:
            # The job's RUNNING line goes first: sent after the worker's own steps, it would hide them.
            monitor.check_running()
            line = stdout_event(raw)
            relay.put(line)
            if line:
                monitor.said_resumed(line)

        def stderr(raw: bytes) -> None:
            text = raw.decode("utf-8", "replace").rstrip()
            if text.strip():
                relay.emit("log", level="stderr", msg=text[:MAX_LINE])

        self._followers = [
            Follower(monitor.path("events.jsonl"), event, re.compile(rb"\n")),
            Follower(monitor.path("stderr.log"), stderr, re.compile(rb"[\r\n]")),
        ]
        threading.Thread(target=monitor.run, name="squeue", daemon=True).start()

    def wait_relayed(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for follower in self._followers:
            follower.finished.set()
            follower.thread.join(max(0.0, deadline - time.monotonic()))
        return not any(follower.thread.is_alive() for follower in self._followers)

    def poll(self) -> Optional[int]:
        return self.monitor.code

    def wait(self, timeout_s: float) -> Optional[int]:
        self.monitor.exited.wait(timeout_s)
        return self.monitor.code

    def _mark_cancel(self) -> None:
        """Before our scancel: the worker of a requeueable job takes a SIGTERM without this file for a
        preemption (a checkpoint first), and with it for the cancel it is."""
        if self.settings.requeue:
            write_atomic(self.monitor.path(CANCEL_MARKER), b"", mode=0o600, durable=False)

    def terminate(self) -> None:
        self._mark_cancel()
        self.monitor.stopping = True
        state = self.monitor.state
        if state is None or state.state == "PENDING":
            self._scancel([])  # a pending job gets its signal only once it runs: nothing to wait for
        else:
            self._scancel(["--full", "--signal=TERM"])

    def kill(self) -> None:
        """The plain scancel: SLURM ends the job (SIGCONT and SIGTERM to all of it, SIGKILL after its KillWait)
        and frees its allocation. SLURM has no SIGKILL-at-once for a batch job: scancel --signal=KILL is this
        same cancel."""
        self._mark_cancel()
        self.monitor.stopping = True
        if self.monitor.code is None:
            self._scancel([])

    def rss_mb(self) -> Optional[float]:
        return None  # the scheduler enforces the job's memory (mem)

    def describe(self) -> str:
        return "SLURM job {}".format(self.job_id)

    def cleanup(self) -> None:
        """A job still queued or running after its worker's end (a stuck shell, a lost exit) is cancelled."""
        try:
            state = self.monitor.squeue()
        except SlurmTooOld:  # squeue cannot say: a cancel of a job that has ended changes nothing
            state = None
            self._scancel([])
        if state is not None and state.state in ("PENDING", "RUNNING", "SUSPENDED", "REQUEUED"):
            self._scancel([])

    def ended(self) -> Optional[WorkerEnded]:
        return self.monitor.ended

    def _scancel(self, options: List[str]) -> None:
        argv = ["scancel"] + options + [self.job_id]
        self.log(" ".join(argv))
        try:
            self.launcher.command(argv)
        except SlurmTooOld as exc:
            self.monitor.tell(str(exc))
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
        code_root = shared_code_root(os.path.dirname(job_dir))
        worker = python_argv(
            self.settings.job_python, "potato_queue.worker", ["--spec", spec_path], code_root=code_root
        )
        meter = python_argv(
            self.settings.job_python,
            "potato_queue.agent.gpu_meter",
            [
                "--out",
                os.path.join(job_dir, GPU_USAGE_FILE),
                "--spec",
                spec_path,
                "--ready",
                os.path.join(job_dir, GPU_METER_READY_FILE),
            ],
            code_root=code_root,
        )
        write_atomic(
            os.path.join(job_dir, "job.sh"),
            job_script(self.settings, run_id, job_dir, worker, meter),
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
