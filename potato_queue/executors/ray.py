"""The ray backend: a lab's Ray cluster (or KubeRay's) runs each run as one Ray job, placed where a GPU is.

The executor submits the job through the Jobs API (executors/rayjobs/) and follows it by polling; everything
else is the agent protocol, as on every backend: the job's entrypoint (host/ray_entry.py) trades the run's
one-time code for its token, fetches the agent from the server by its sha256 and becomes it, and the agent
fetches the bundle, runs the worker and reports to the server. Ray's working_dir (100 MiB, collected 600 s
after it is unpinned) is not used. The nodes must reach the server at the backend's `server_url`.

A job Ray keeps PENDING (no node with the resources) fails the run after pending_timeout_s. Ray's Jobs API
cannot stop or delete a PENDING job (ray issue 58353: a stop waits until the job is placed), so a run that ends
while its job waits submits a second, tiny job to the head (rayjobs/text.py's removal_request), which kills the
waiting job's supervisor with the head's own Ray: Ray marks the job FAILED and never starts it. The run ends at
once; the removal is followed in the background and run.log says how it went. Should the job start before its
removal, its entry finds the run's code dead and exits 0 having run nothing. A head that restarted has lost its
jobs: the run fails saying so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NoReturn

from potato_queue.backends.models import RayBackend
from potato_queue.code_package import agent_zipapp
from potato_queue.errors import PotatoQueueError
from potato_queue.executors import untar
from potato_queue.executors.base import (
    AgentResult,
    CheckReport,
    Executor,
    Gone,
    LaunchSpec,
    ModelFilesMissing,
    RunHandle,
    Running,
    Status,
    Waiting,
)
from potato_queue.executors.rayjobs.check import ray_check_report
from potato_queue.executors.rayjobs.client import RayError, RayJobs
from potato_queue.executors.rayjobs.text import (
    NOT_WAITING,
    PENDING,
    REMOVED,
    RUNNING,
    STOP_MARGIN_S,
    STOPPED,
    TERMINAL,
    JobState,
    asked_words,
    job_request,
    pending_expired,
    removal_by_hand,
    removal_id,
    removal_request,
)

__all__ = ["RayExecutor", "RayHandle", "head_lost", "DEFAULT_GRACE_S"]

DEFAULT_GRACE_S = 20.0  # the agent's own when the job names none
LOG_TAIL_CHARS = 1500
KILL_WAIT_S = 3.0
REMOVAL_WAIT_S = 60.0  # a removal job starts on the head in about 2 s and ends in about 3 (measured, 2 cores)


def head_lost(backend: RayBackend, job_id: str) -> str:
    return f"The Ray head at {backend.head} restarted and lost job {job_id}: it keeps no job across a restart"


class RayHandle(RunHandle):
    """One run's Ray job, polled every poll_interval_s (poll() itself is called ten times a second); submitted
    again, as a job of its own, when its node dies (up to max_requeues)."""

    def __init__(self, jobs: RayJobs, submit: Callable[[int], str], grace_s: float, spec: LaunchSpec) -> None:
        self.jobs, self.submit, self.clock, self.log = jobs, submit, spec.clock, spec.log
        self.paths, self.send_model_max_bytes = spec.paths, spec.job.send_model_max_bytes
        self.killed = False
        self.backend = jobs.backend
        self.can_requeue = spec.reissue is not None
        self.attempt = 0
        self.job_id = submit(0)
        self.launched_s = self.clock.now_s()
        self.hard_stop_s = grace_s + STOP_MARGIN_S + self.backend.poll_interval_s
        self.status: Status = self._waiting("submitted")
        self.polled_s: float | None = None

    def _waiting(self, said: str) -> Waiting:
        return Waiting(
            f"Ray job {self.job_id} pending on {self.backend.head}: {said}",
            until_s=self.launched_s + self.backend.pending_timeout_s,
            expired=pending_expired(self.backend, self.job_id, said),
        )

    def _requeued(self, state: JobState) -> Waiting | None:
        """The job of a run whose node died, submitted again (its trainer resumes from its checkpoint)."""
        if not (state.node_lost() and self.can_requeue and self.attempt < self.backend.max_requeues):
            return None
        lost, self.attempt = self.job_id, self.attempt + 1
        self.job_id, self.launched_s = self.submit(self.attempt), self.clock.now_s()
        self.log(
            f"Ray job {lost}'s node died ({state.message.splitlines()[-1].strip()}): the run is submitted again as "
            f"{self.job_id} ({self.attempt} of max_requeues {self.backend.max_requeues})"
        )
        return self._waiting(f"requeued after job {lost}'s node died")

    def poll(self) -> Status:
        now_s = self.clock.now_s()
        if self.polled_s is not None and now_s - self.polled_s < self.backend.poll_interval_s:
            return self.status
        self.polled_s = now_s
        try:
            self.status = self._status_of(self.jobs.state(self.job_id))
        except (RayError, ValueError):
            pass  # a head that does not answer for a moment: the agent's heartbeats say whether the run lives
        return self.status

    def _status_of(self, state: JobState | None) -> Status:
        if state is None:
            fix = "retry the run (potato-queue training retry RUN CONFIG): it resumes from its checkpoint"
            return Gone("the Ray head lost the job", error=head_lost(self.backend, self.job_id), fix=fix)
        if state.status == PENDING:
            return self._waiting(state.message)
        if state.status == RUNNING:
            return Running()
        requeued = self._requeued(state)
        if requeued is not None:
            return requeued
        return Gone(f"Ray job {self.job_id} ended {state.status}: {state.message}", error=self._ended(state))

    def _ended(self, state: JobState) -> str:
        """The run's error when its job ended before its agent reported: what Ray said, and the job's log."""
        tail = self.jobs.logs(self.job_id).strip()[-LOG_TAIL_CHARS:]
        said = f"Ray job {self.job_id} on {self.backend.head} ended {state.status} before its agent reported"
        exit_code = f" (exit {state.exit_code})" if state.exit_code is not None else ""
        return f"{said}{exit_code}: {state.message}" + (f"; its log ends: {tail}" if tail else "")

    def kill(self) -> None:
        self.killed = True
        try:
            self.jobs.stop(self.job_id)
            if isinstance(self.status, Waiting):
                self._remove(self.job_id)
                return
            # Not the whole stop wait: the executor must stay alive (its lease) while Ray's SIGKILL, due within
            # the job's stop wait, ends an agent that does not stop on SIGTERM (a frozen one).
            self.jobs.wait_for(self.job_id, lambda s: s is None or s.status not in (PENDING, RUNNING), KILL_WAIT_S)
        except (RayError, ValueError):
            return  # a head that cannot be reached cannot be asked; its node's agent stops at its token's end

    def _remove(self, job_id: str) -> None:
        """Take a job still waiting to be placed out of Ray's queue (module docstring), followed in the
        background: the run ends now."""
        try:
            self.jobs.submit(removal_request(job_id))
        except RayError as exc:
            self.log(self._not_removed(job_id, f"the head refused its removal job: {exc.message}"))
            return
        threading.Thread(target=self._follow_removal, args=(job_id,), name=f"remove {job_id}", daemon=True).start()

    def _follow_removal(self, job_id: str) -> None:
        remover = removal_id(job_id)
        state = self.jobs.wait_for(remover, lambda s: s is not None and s.status in TERMINAL, REMOVAL_WAIT_S, 0.5)
        try:
            said = self.jobs.logs(remover)
        except RayError:
            said = ""
        if f"{REMOVED} {job_id}" in said:
            self.log(f"Ray job {job_id} was taken out of {self.backend.head}'s queue: it will never start")
        elif NOT_WAITING in said:
            self.log(f"Ray job {job_id} had left the queue before its removal: Ray's stop ends it")
        else:
            ended = (
                f"ended {state.status}"
                if state and state.status in TERMINAL
                else f"did not end within {REMOVAL_WAIT_S:g} s"
            )
            tail = said.strip()[-LOG_TAIL_CHARS:]
            self.log(self._not_removed(job_id, f"its removal job {remover} {ended}" + (f": {tail}" if tail else "")))

    def _not_removed(self, job_id: str, why: str) -> str:
        """run.log's line when a waiting job stays in Ray's queue, with the fix by hand."""
        return (
            f"Ray job {job_id} stays in {self.backend.head}'s queue ({why}); if Ray starts it, it exits having run "
            f"nothing (its code is spent). To remove it now, run on the head: {removal_by_hand(job_id)}"
        )

    def collect(self, result: AgentResult) -> str | None:
        """The model files the agent sent, into the run's artifacts/ by the rules of an ssh copy; with
        fetch_artifacts: false, or a run that failed, they stay on the node, where the agent said."""
        if result.exit_code != 0 and not self.killed:
            # In the background: the run's end does not wait for Ray to say how its job ended.
            threading.Thread(target=self._say_if_stopped_outside, name=f"how {self.job_id} ended", daemon=True).start()
        else:
            self.jobs.close()
        upload, limit = self.paths.model_upload, self.send_model_max_bytes
        try:
            if result.exit_code != 0 or limit is None:
                return result.artifact_uri
            node = result.artifact_uri or "its node"
            if not upload.is_file():
                why = f" ({result.message})" if result.message else ""
                self._missing(f"The model files did not reach the server{why}", node)
            try:
                note = untar.unpack_upload(upload, self.paths.artifacts, limit)
            except (untar.CopyRefused, untar.CopyCutShort, OSError) as exc:
                self._missing(f"The model files from {node} were refused: {exc}", node)
        finally:
            upload.unlink(missing_ok=True)
        kept = untar.manifest_of({"manifest": note.get("kept")}) or {}
        for name, size in sorted(kept.items()):
            self.log(f"{name[:300]!r} ({size / 1e6:.0f} MB) is over max_artifact_mb: it stays on {node}")
        self.log(f"model files: {len(untar.manifest_of(note) or {})} files in {self.paths.artifacts}")
        return node if kept else str(self.paths.artifacts)

    def _say_if_stopped_outside(self) -> None:
        """A job stopped on the cluster (Ray's dashboard, `ray job stop`), not by potato-queue: its agent took
        Ray's SIGTERM for a cancel; run.log says who stopped it."""
        try:
            state = self.jobs.wait_for(self.job_id, lambda s: s is None or s.status != RUNNING, KILL_WAIT_S, 0.1)
        finally:
            self.jobs.close()
        if state is not None and state.status == STOPPED:
            self.log(
                f"Ray job {self.job_id} was stopped on {self.backend.head}, not through potato-queue "
                "(Ray's dashboard, or `ray job stop`)"
            )

    def _missing(self, what: str, node: str) -> NoReturn:
        """The run's end when the model files are not whole here: the predictions count, the files stay there."""
        message = f"{what}; the predictions are stored, and the model files stay on {node}"
        self.log(message)
        raise ModelFilesMissing(message, artifact_uri=node)


class RayExecutor(Executor[RayBackend]):
    type_name = "ray"
    shows_launch = True

    def longest_wait_s(self) -> float:
        return self.backend.pending_timeout_s

    def check(self, model: str | None = None) -> CheckReport:
        try:
            jobs = RayJobs(self.backend, self.settings.environment)
        except PotatoQueueError as exc:
            return CheckReport.failed(str(exc.message), exc.fix)
        try:
            return ray_check_report(self.backend_name, self.backend, jobs)
        finally:
            jobs.close()

    def launch(self, spec: LaunchSpec) -> RunHandle:
        if spec.token is None:
            raise ValueError("a ray run needs its one-time code")
        jobs = RayJobs(self.backend, self.settings.environment)
        grace_s = spec.job.grace_seconds if spec.job.grace_seconds is not None else DEFAULT_GRACE_S
        server_url = self.backend.server_url or spec.server_url
        first_code = spec.token

        def submit(attempt: int) -> str:
            code = first_code if attempt == 0 or spec.reissue is None else spec.reissue()
            run = (spec.run_id, code)
            body = job_request(self.backend, server_url, run, agent_zipapp().sha256, grace_s, attempt)
            job_id = jobs.submit(body)
            spec.log(f"submitted Ray job {job_id} to {self.backend.head} ({asked_words(self.backend)})")
            spec.step(f"Ray job {job_id} submitted to {self.backend.head}")
            return job_id

        return RayHandle(jobs, submit, grace_s, spec)
