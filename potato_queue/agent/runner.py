"""One run on the training machine: bundle in, worker run, events out, result back.

Standard library only, Python 3.8+. The run's folder, `DIR/<run_id>/` (its
paths, the bundle unpacked, spec.json), is run_files.py's. The runner speaks the
protocol and applies cancel, grace and limits; a WorkerLauncher (launchers/base.py)
starts the worker, and the runner touches it only through its WorkerHandle.
"""

import os
import shutil
import socket
import sys
import tarfile
import threading
import time
from typing import Callable, Optional, Tuple

from potato_queue.agent.checkpoints import checkpoint_dir_for, checkpoint_root, prune_stale, resume_note
from potato_queue.agent.client import BundleDownloadError, RunClient
from potato_queue.agent.gpu_watch import IDLE_FIX, USAGE_REPORT_S, GpuWatch, run_gpus, stop_leftovers
from potato_queue.agent.launchers.base import LaunchError, WorkerHandle, WorkerLauncher
from potato_queue.agent.model_files import send_model_files
from potato_queue.agent.progress import Progress
from potato_queue.agent.relay import EventRelay, control_loop, heartbeat_loop
from potato_queue.agent.run_files import RunFiles, extract_bundle, write_spec
from potato_queue.agent.transport import ApiError, Unreachable
from potato_queue.host.gpus import Choice
from potato_queue.wire.exit_codes import EXIT_BAD_SPEC, EXIT_CANCELLED, EXIT_OOM, EXIT_UNEXPECTED
from potato_queue.wire.job import Job, JobError
from potato_queue.wire.text import one_line

__all__ = ["Runner", "log_line", "DEFAULT_GRACE_S"]

DEFAULT_GRACE_S = 20.0
MEMORY_CHECK_S = 0.25
# How often the runner looks at cancel and the memory limit: a cancel waits at most this long for its
# SIGTERM (P1), and a tick costs a few microseconds.
TICK_S = 0.02
LOST_SERVER_TIMEOUT_S = 5.0
# After SIGKILL (a SLURM job: scancel, then its KillWait), how long the worker may take to be seen ending.
KILL_WAIT_S = 120.0


def log_line(message: str) -> None:
    """The agent's own log: stderr, one timestamped line (the executor keeps it as agent.log)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        sys.stderr.write("{} agent: {}\n".format(stamp, one_line(message)))
        sys.stderr.flush()
    except (OSError, ValueError):
        # Whoever read our stderr is gone (a dropped ssh session: EPIPE): the line is lost, but the clean-up
        # that is logging it (a scancel, the worker's stop) must still run.
        pass


class _Watch:
    """What the supervise loop has done to the worker so far."""

    def __init__(self, grace_s: float, max_ram_mb: Optional[float]) -> None:
        self.grace_s = grace_s
        self.max_ram_mb = max_ram_mb
        self.term_at = None  # type: Optional[float]
        self.killed = False
        self.killed_at = None  # type: Optional[float]
        self.oom_mb = None  # type: Optional[float]
        self.next_memory_check = 0.0
        self.idle_stop = None  # type: Optional[str]  # why the idle guard stopped the run
        self.next_gpu_check = 0.0
        self.next_usage_report = 0.0


class Runner:
    """Runs one job for the server behind `client`, its worker started by `launcher`.

    run() returns the exit code to report.
    """

    def __init__(
        self,
        client: RunClient,
        base_dir: str,
        launcher: WorkerLauncher,
        keep: bool = False,
        unreachable_s: float = 300.0,
        log: Callable[[str], None] = log_line,
        checkpoints: Optional[str] = None,
        gpu: Optional[Choice] = None,
    ) -> None:
        self.client = client
        self.launcher = launcher
        self.files = RunFiles(base_dir, client.run_id)
        # Outside the job folder, so that a retry finds a failed run's checkpoints (agent/checkpoints.py).
        self.checkpoint_root = checkpoints or checkpoint_root(base_dir)
        self.checkpoint_dir = None  # type: Optional[str]
        self.gpu = gpu  # the GPU an agent with --min-free-gpu-mb gives this run (host/gpus.py agent_pick)
        self.keep = keep
        self.unreachable_s = unreachable_s
        self.log = log
        self.cancel = threading.Event()
        self.stop_reason = None  # type: Optional[str]
        self.lost_server = False
        self.orphaned = False
        self.stopped_for = None  # type: Optional[str]  # the reason the worker was stopped, when it was
        self._stop_threads = threading.Event()
        self.relay = EventRelay(client, self._server_cancel, log)

    def request_stop(self, reason: str) -> None:
        """Stop the worker (SIGTERM, then SIGKILL after grace); the first reason is the one reported."""
        # No logging here: this runs in signal handlers too, where a write to stderr may re-enter one.
        if not self.cancel.is_set():
            self.stop_reason = reason
            self.cancel.set()

    def starter_gone(self, reason: str) -> None:
        """Whoever started this agent is gone (its stdin closed): stop the worker, and make the last calls
        (events, predictions, result) quick, as after AGT-7: an agent left with neither its session nor
        its server must exit by itself, in seconds."""
        self.orphaned = True
        self._hurry_last_calls()
        self.request_stop(reason)

    def _hurry_last_calls(self) -> None:
        """The last calls (events, result) still try, but each for seconds, not a full timeout."""
        self.client.transport.timeout_s = min(self.client.transport.timeout_s, LOST_SERVER_TIMEOUT_S)

    def run(self) -> int:
        """The whole run; the exit code is the worker's, 5 for the memory limit, 2 for a bad bundle."""
        try:
            job = Job.from_dict(self.client.job())
        except (Unreachable, ApiError, JobError) as exc:
            self.log("cannot fetch the job: {}".format(exc))
            return EXIT_UNEXPECTED
        self.log("job: trainer {}, bundle {} bytes".format(job.trainer, job.bundle.bytes))
        self._start_threads(job)
        try:
            self._prepare(job)
        except (BundleDownloadError, ApiError, tarfile.TarError, OSError) as exc:
            return self._finish(EXIT_BAD_SPEC, "bad_bundle", str(exc))
        if self.cancel.is_set():
            return self._finish(EXIT_CANCELLED, None, "{}: the worker was not started".format(self.stop_reason))
        try:
            worker = self.launcher.start(self.files.spec, self.files.work)
        except LaunchError as exc:
            return self._finish(EXIT_BAD_SPEC, exc.error_code, str(exc), hint=exc.install_hint)
        self.log("worker started: {}".format(worker.describe()))
        state, step = worker.started_status()
        self.relay.emit("status", state=state, step=step)
        worker.relay_output(self.relay)
        gpus = self._watch_gpus(job, worker)
        try:
            code, error_code, message, hint = self._supervise(worker, job, gpus)
        except BaseException:
            worker.kill()  # never leave a worker behind an agent that failed
            raise
        if not worker.wait_relayed(10.0):
            self.log("the worker's last output could not all be relayed")
        self._after_worker(job, worker, gpus)
        return self._finish(code, error_code, message, job, hint=hint)

    def _watch_gpus(self, job: Job, worker: WorkerHandle) -> GpuWatch:
        """The run's GPUs sampled from now on (GPU-hours, energy, the idle guard); none for a worker that runs
        elsewhere, or on the CPU."""
        if worker.local_group() is None:  # the meter beside it measures (a SLURM job's, on its node)
            why = "{} reported no GPU use from its node (no nvidia-smi there)".format(worker.describe())
            return GpuWatch([], why, job.gpu_watch, remote=worker.gpu_usage).start()
        indexes, why = run_gpus(job.limits.device, self.gpu.visible_devices if self.gpu else None)
        if indexes:
            self.log(
                "GPU use: sampling GPU {} every {:g} s".format(", ".join(map(str, indexes)), job.gpu_watch.sample_s)
            )
        return GpuWatch(indexes, why, job.gpu_watch).start()

    def _after_worker(self, job: Job, worker: WorkerHandle, gpus: GpuWatch) -> None:
        """The run's GPU use, sent; then the leak guard: what of the run still holds GPU memory is killed."""
        self.relay.emit("usage", **gpus.stop())
        if job.gpu_watch.leak_guard and worker.local_group() is not None:
            for line in stop_leftovers(job.run_id, worker.local_group(), self.log):
                self.relay.emit("log", level="warning", msg=line)

    def _start_threads(self, job: Job) -> None:
        interval = job.heartbeat_interval_s or 10.0
        self.relay.start()
        beat = (self.client, interval, self._stop_threads, self._server_cancel, self.log)
        control = (self.client, self._stop_threads, self._server_cancel, self.log)
        threading.Thread(target=heartbeat_loop, args=beat, name="heartbeat", daemon=True).start()
        threading.Thread(target=control_loop, args=control, name="control", daemon=True).start()

    def _server_cancel(self) -> None:
        """The server said cancel (in an events reply or on /control)."""
        self.request_stop("cancel requested")

    def _prepare(self, job: Job) -> None:
        """Download, verify and unpack the bundle; write spec.json; make the workdir."""
        os.makedirs(self.files.work, exist_ok=True)
        bundle = job.bundle
        self.relay.emit("status", state="starting", step="downloading the bundle")
        started = time.monotonic()
        size = bundle.bytes
        progress = Progress("bundle", size, self.log)
        try:
            self.client.download_bundle(self.files.bundle_tar, size, bundle.sha256, progress=progress.update)
        finally:
            progress.finish()
        self.log("bundle: {} bytes in {:.2f} s, sha256 verified".format(bundle.bytes, time.monotonic() - started))
        self.relay.emit("status", state="starting", step="unpacking the bundle")
        extract_bundle(self.files.bundle_tar, self.files.bundle_dir)
        self.checkpoint_dir = checkpoint_dir_for(self.checkpoint_root, job)
        prune_stale(self.checkpoint_root, keep=self.checkpoint_dir)
        note = resume_note(job, self.checkpoint_dir)
        if note is not None:
            self.log(note)
            self.relay.emit("status", state="starting", step=note)  # run.log keeps the step lines
        if self.gpu is not None:
            self.log(self.gpu.line)
            self.relay.emit("status", state="starting", step=self.gpu.line)
        write_spec(self.files, job, self.checkpoint_dir, self.gpu.visible_devices if self.gpu else None)

    # -- while the worker runs -------------------------------------------------
    def _supervise(
        self, worker: WorkerHandle, job: Job, gpus: GpuWatch
    ) -> Tuple[int, Optional[str], Optional[str], Optional[str]]:
        """Wait for the worker, applying cancel, grace, the memory limit and AGT-7: (exit code, error code,
        message, its fix)."""
        grace = job.grace_seconds
        max_ram = job.limits.max_ram_mb
        watch = _Watch(DEFAULT_GRACE_S if grace is None else float(grace), float(max_ram) if max_ram else None)
        code = worker.poll()
        while code is None:
            now = time.monotonic()
            self._tick(worker, watch, now)
            self._gpu_tick(gpus, watch, now)
            if watch.killed_at is not None and now - watch.killed_at > KILL_WAIT_S:
                # Every wait after a stop has a bound: a worker (or a scheduler) that never says it ended
                # must not keep this agent, and the run's slot, forever.
                self.log(
                    "{} did not end {:g} s after it was killed; the agent gives up on it".format(
                        worker.describe(), KILL_WAIT_S
                    )
                )
                code = EXIT_UNEXPECTED
                break
            code = worker.wait(TICK_S)
        worker.cleanup()
        self.stopped_for = self.stop_reason if watch.term_at is not None else None
        self.log("worker exited: code {}".format(code))
        ended = worker.ended()
        if watch.oom_mb is not None:
            text = "out of memory: the run used {:.0f} MB, above max_ram_mb {:g}".format(
                watch.oom_mb, watch.max_ram_mb or 0.0
            )
            return EXIT_OOM, "out_of_memory", text, None
        if watch.idle_stop is not None:
            return EXIT_UNEXPECTED, "gpu_idle", watch.idle_stop, IDLE_FIX
        if ended is not None and watch.term_at is None:
            return code, ended.code, ended.message, ended.hint
        if watch.killed:
            text = "{}; the worker ignored SIGTERM and was killed after {:g} s".format(self.stop_reason, watch.grace_s)
            return code, None, text, None
        return code, None, self.stop_reason if watch.term_at is not None else None, None

    def _tick(self, worker: WorkerHandle, watch: _Watch, now: float) -> None:
        if self.client.silence_s() > self.unreachable_s and not self.lost_server:
            self.lost_server = True  # AGT-7: the run is cancelled on this side
            self.request_stop("no answer from the server for {:g} s".format(self.unreachable_s))
            self._hurry_last_calls()
        if self.cancel.is_set() and watch.term_at is None:
            watch.term_at = now
            self.log("{}: SIGTERM to {}; SIGKILL in {:g} s".format(self.stop_reason, worker.stop_target, watch.grace_s))
            worker.terminate()
        elif watch.term_at is not None and not watch.killed and now - watch.term_at >= watch.grace_s:
            watch.killed, watch.killed_at = True, now
            self.log("the worker is still running {:g} s after SIGTERM: SIGKILL".format(watch.grace_s))
            worker.kill()
        if watch.max_ram_mb and watch.oom_mb is None and now >= watch.next_memory_check:
            watch.next_memory_check = now + MEMORY_CHECK_S
            used = worker.rss_mb()  # None: this launcher cannot measure it, so no check
            if used is not None and used > watch.max_ram_mb:
                watch.oom_mb, watch.killed_at = used, now
                self.log(
                    "the worker's processes use {:.0f} MB, above max_ram_mb {:g}: SIGKILL".format(
                        used, watch.max_ram_mb
                    )
                )
                worker.kill()

    def _gpu_tick(self, gpus: GpuWatch, watch: _Watch, now: float) -> None:
        """Once a second: the idle guard (its warning on the step line, its stop); every minute, the usage."""
        if now < watch.next_gpu_check or not gpus.measures:
            return
        # A meter elsewhere (a SLURM job's) writes its figures once a sample: no point reading them oftener.
        watch.next_gpu_check = now + (1.0 if gpus.remote is None else max(1.0, gpus.settings.sample_s))
        if now >= watch.next_usage_report:
            watch.next_usage_report = now + USAGE_REPORT_S
            usage = gpus.usage()
            if usage["gpus"]:  # a job still pending has no figures yet: nothing to say
                self.relay.emit("usage", **usage)
        warning, stop = gpus.idle_check()
        if warning is not None:
            self.log(warning)
            self.relay.emit("status", state="running", step=warning)
        if stop is not None and not self.cancel.is_set():
            watch.idle_stop = stop
            self.log(stop)
            self.request_stop("the idle guard")

    # -- after the worker --------------------------------------------------------
    def _finish(
        self,
        code: int,
        error_code: Optional[str],
        message: Optional[str],
        job: Optional[Job] = None,
        hint: Optional[str] = None,
    ) -> int:
        """Report the error (if any), send predictions and the remaining events, post the result."""
        if error_code:
            self.log(message or error_code)
            self.relay.emit("error", code=error_code, message=message, install_hint=hint or _HINTS.get(error_code))
        if job is not None:
            message = self._send_predictions(job, message)
        if job is not None and code == 0 and job.send_model_max_bytes is not None:
            self.relay.emit("status", state="finishing", step="sending the model files")
            problem = send_model_files(self.files, job.send_model_max_bytes, self.client, self.log, self._patience_s())
            message = message if problem is None else self._not_sent("model_not_sent", problem, None, message)
        self.relay.emit("status", state="finishing", step="worker exited with code {}".format(code))
        if not self.relay.close(self._patience_s() or 300.0):
            self.log("some events could not be sent")
        uri = "{}:{}".format(socket.gethostname(), self.files.work)
        try:
            reply = self.client.post_result(code, uri, message, give_up_s=self._patience_s())
            state = reply.get("state")
            # Until the executor has collected the run, the server still calls it running.
            after = "the server finishes the run now" if state == "running" else "the run is {}".format(state)
            self.log("result sent: exit code {}; {}".format(code, after))
        except (Unreachable, ApiError) as exc:
            self.log("the result could not be sent: {}".format(exc))
        self._stop_threads.set()
        self._clean_up()
        return code

    def _patience_s(self) -> Optional[float]:
        """How long the last calls may wait: not another full AGT-7 window once the server was lost."""
        return min(30.0, self.unreachable_s) if self.lost_server or self.orphaned else None

    def _send_predictions(self, job: Job, message: Optional[str]) -> Optional[str]:
        """Upload work/predictions.jsonl when the worker wrote one; a problem is added to the message."""
        path = self.files.predictions
        if not os.path.isfile(path):
            return message
        size, limit = os.path.getsize(path), job.max_predictions_bytes
        if limit and size > int(limit):
            # Refused here, not sent: the server would answer 413 only after the first bytes.
            problem = "predictions.jsonl is {} bytes, above max_predictions_mb ({} bytes); it was not sent".format(
                size, limit
            )
            too_large = True
        else:
            self.relay.emit("status", state="finishing", step="sending predictions")
            try:
                reply = self.client.upload_predictions(path, give_up_s=self._patience_s())
                self.log("predictions sent: {} bytes".format(reply.get("bytes")))
                return message
            except ApiError as exc:
                problem = "predictions.jsonl was refused: {}".format(exc.detail)
                too_large = exc.status == 413
            except Unreachable as exc:
                problem = "predictions.jsonl could not be sent: {}".format(exc)
                too_large = False
        # Only a refusal for its size has the size's fix; otherwise the server's message says it all.
        return self._not_sent("predictions_not_sent", problem, _HINTS["predictions"] if too_large else None, message)

    def _not_sent(self, code: str, problem: str, hint: Optional[str], message: Optional[str]) -> str:
        """What could not be sent: logged, an error event, and added to the result's message."""
        self.log(problem)
        self.relay.emit("error", code=code, message=problem, install_hint=hint)
        return problem if message is None else "{}; {}".format(message, problem)

    def _clean_up(self) -> None:
        self.launcher.close()  # a worker prepared ahead for a run that ended before it was needed
        if self.checkpoint_dir is not None:
            # Only what is empty: a run that saved nothing (or succeeded: the worker removed its checkpoints)
            # leaves nothing behind; a checkpoint to resume from stays.
            for folder in (self.checkpoint_dir, self.checkpoint_root):
                try:
                    os.rmdir(folder)
                except OSError:
                    pass
        if self.keep:
            return
        shutil.rmtree(self.files.bundle_dir, ignore_errors=True)
        if os.path.exists(self.files.bundle_tar):
            os.unlink(self.files.bundle_tar)


_HINTS = {
    "out_of_memory": "raise model_training.max_ram_mb, or train a smaller model or batch size",
    "bad_bundle": "start the run again; if it happens again, check the server's disk and the network",
    "predictions": "raise model_training.max_predictions_mb, or predict fewer items",
}
