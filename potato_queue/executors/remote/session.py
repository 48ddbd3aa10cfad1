"""An agent started over ssh on a host we log in to, shared by the ssh and slurm backends (not an executor).

One ssh session per run. It reverse-forwards a unix socket in the host's /tmp
(0600, one path per launch) to the server and runs host/boot.py through
stage.py's first stage (one line every login shell runs the same), which
checks the interpreter, takes the code (sent only when
`remote_dir/code/<sha256>.pyz` is missing), and execs the agent. The agent
gets its assignment and the run token on stdin, never on a command line, and
talks HTTP through the socket. Where sshd refuses the forward, the session is
opened again without it and the bootstrap carries the agent's connections over
the session's stdin and stdout (transport "session": host/channel.py,
carried.py). The session's end (ssh killed, the network gone) is the agent's
stdin EOF: it stops its worker (on a login node: it cancels its job). The
handle's hard stop ends what the run left on the host in one more ssh: its
processes, what the backend adds (a job's scancel), the socket file and the
job folder; the job folder goes only once its model files are here.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

from potato_queue.agent.checkpoints import CHECKPOINTS_FOLDER
from potato_queue.code_package import host_source
from potato_queue.errors import PotatoQueueError
from potato_queue.executors.base import (
    AgentResult,
    CheckReport,
    Gone,
    LaunchSpec,
    ModelFilesMissing,
    RunHandle,
    Running,
    Status,
    Waiting,
)
from potato_queue.executors.remote.bootstrap import FORWARD, OVER_SESSION, BootSession, forward_target
from potato_queue.executors.remote.copy import ModelCopy
from potato_queue.executors.remote.openssh import (
    FORWARD_FIX,
    FORWARD_SETTINGS,
    RemoteBackend,
    RemoteFailed,
    SshFailed,
    SshTarget,
    cancel_forward_argv,
    missing_program,
    run_script,
    run_ssh,
    shell_failure,
    ssh_failure,
)
from potato_queue.executors.remote.stage import banner_note, new_marker, split_banner, stage_argv, stage_input
from potato_queue.host import check as remote_check
from potato_queue.host.boot import BootHeader
from potato_queue.host.gpus import ssh_wait_expired
from potato_queue.settings import COPY_STALL_S, Settings
from potato_queue.store.keys import remote_socket_path

__all__ = [
    "setup_expired",
    "forward_target",
    "session_lines",
    "target_of",
    "python_not_found",
    "host_facts",
    "failed_check",
    "start_agent",
    "RemoteAgentHandle",
    "tail",
]

EXIT_NOT_FOUND = 127
# The check asks for a forward as a run does, to learn whether sshd allows it; nothing connects through it.
CHECK_FORWARD_TO = "127.0.0.1:9"


def target_of(backend: RemoteBackend, settings: Settings) -> SshTarget:
    """Where ssh goes for `backend`, with the server's own ssh config file when it has one (settings)."""
    return SshTarget.of(backend, config_file=settings.ssh_config_file)


def python_not_found(backend: RemoteBackend, backend_name: str) -> tuple[str, str]:
    """ERR-2 and its fix."""
    host = backend.host
    return (
        f"{backend.python} was not found on {host}",
        f"set `python` of backend {backend_name} to an interpreter "
        f"on {host} (3.8 or newer; `ssh {host} which python3` shows one)",
    )


def host_facts(backend: RemoteBackend, backend_name: str, asked: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """What host/check.py saw on the host (`training check`), asked over the kind of session a run opens (the
    forward of a socket included), with `transport` (how a run's agent would reach the server) and `banner` (what
    the login printed before our line, said: stage.py). PotatoQueueError with its fix when the host cannot be
    asked (ERR-1 and the other ssh failures, ERR-2, a login shell that fails)."""
    target, socket = target_of(backend, settings), remote_socket_path("check")
    try:
        facts = _ask_check(
            backend, backend_name, target, {**asked, "socket": socket}, forward=(socket, CHECK_FORWARD_TO)
        )
        return {**facts, "transport": FORWARD}
    except SshFailed as exc:
        if exc.fix != FORWARD_FIX.format(host=backend.host):
            raise
    facts = _ask_check(backend, backend_name, target, asked, forward=None)
    return {**facts, "transport": OVER_SESSION}


def _ask_check(
    backend: RemoteBackend, backend_name: str, target: SshTarget, asked: dict[str, Any], forward: tuple[str, str] | None
) -> dict[str, Any]:
    marker, host = new_marker(), backend.host
    try:
        stdout = run_ssh(
            target,
            stage_argv(backend.python, marker),
            forward=forward,
            stdin=stage_input(host_source(remote_check)) + json.dumps(asked).encode() + b"\n",
            timeout_s=120,
        )
    except RemoteFailed as exc:
        if missing_program(exc.stderr, backend.python):
            message, fix = python_not_found(backend, backend_name)
            raise PotatoQueueError(message, fix=fix) from exc
        if marker not in exc.stdout:  # the login shell failed before the interpreter ran
            raise PotatoQueueError(exc.message, fix=shell_failure(host, exc.stderr)) from exc
        raise
    split = split_banner(stdout, marker)
    if split is None:
        raise PotatoQueueError(
            f"{backend.python} on {host} printed no answer: {stdout.strip()[-300:]!r}", fix=shell_failure(host, stdout)
        )
    banner, answer = split
    return {**json.loads(answer), "banner": banner_note(host, banner)}


def session_lines(host: str, facts: dict[str, Any]) -> list[str]:
    """The check's lines on the session itself: how a run's agent reaches the server, what the login prints."""
    if facts["transport"] == FORWARD:
        lines = [f"transport: a reverse forward of the run's socket ({host}'s sshd allows it)"]
    else:
        lines = [
            f"transport: over the ssh session itself ({host}'s sshd refuses forwarding: one of {FORWARD_SETTINGS}); "
            "runs work, their HTTP goes through the session's stdin and stdout"
        ]
    return lines + ([facts["banner"]] if facts.get("banner") else [])


def failed_check(exc: PotatoQueueError) -> CheckReport:
    """The check's report when the host could not be asked."""
    return CheckReport.failed(exc.message, exc.fix)


def tail(path: Path, size: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def setup_expired(host: str, backend_name: str, limit_s: float, phase: str) -> str:
    """Why a run whose setup on the host hung failed: the phase it hung in, and the setting to raise."""
    return (
        f"The setup on {host} did not finish within setup_timeout_s ({limit_s:g} s): it was still {phase}. "
        f"Fix: raise setup_timeout_s of backend {backend_name} (a first venv build with large packages can "
        "take many minutes), or see agent.log in the run's folder for where it hung"
    )


class RemoteAgentHandle(RunHandle):
    """The run's session; `stop_job` is shell run first by the hard stop (a job's scancel), or ""."""

    def __init__(
        self,
        session: BootSession,
        target: SshTarget,
        stop_job: str = "",
        hard_stop_s: float = 0.0,
        copy_stall_s: float = COPY_STALL_S,
    ) -> None:
        self.session, self.target, self.stop_job = session, target, stop_job
        self.hard_stop_s, self.copy_stall_s = hard_stop_s, copy_stall_s
        self.backend = session.backend
        self.cleaned = False

    def poll(self) -> Status:
        code = self.session.proc.poll()
        ready = self.session.ready.is_set()
        # Before the agent runs, an ended session may be opened again (a refused forward): the conversation says.
        if code is None or (not ready and self.session.thread.is_alive()):
            # Until the agent runs, the heartbeat clock waits: a venv's pip install can take minutes.
            return (
                Running()
                if ready
                else Waiting(self.session.phase, self.session.setup_until_s, self._expired(), run_time=True)
            )
        return self._gone(code)

    def _expired(self) -> str:
        """What the run fails with when its setup outlasts setup_timeout_s: a wait for GPU memory says so."""
        host, name, limit_s = self.backend.host, self.session.spec.backend_name, self.backend.setup_timeout_s
        wait = self.session.gpu_wait
        if wait is not None:
            return ssh_wait_expired(wait, host, name, limit_s)
        return setup_expired(host, name, limit_s, self.session.phase)

    def _gone(self, code: int) -> Gone:
        """What the session's end means; before the agent ran, nobody else can tell the run why."""
        host, log = self.backend.host, self.session.spec.paths.agent_log
        if self.session.ready.is_set():
            return Gone(f"the ssh session to {host} ended with exit code {code}")
        if self.session.refusal:
            return Gone(self.session.refusal, error=self.session.refusal)
        if code == 255:
            failure = ssh_failure(host, tail(log))
            return Gone(failure.message, error=failure.message, fix=failure.fix)
        if code == EXIT_NOT_FOUND or missing_program(tail(log), self.backend.python):
            message, fix = python_not_found(self.backend, self.session.spec.backend_name)
            return Gone(message, error=message, fix=fix)
        why = f"the setup on {host} ended with exit code {code}"
        if self.session.remote_session is None:  # the interpreter never said a word: the login shell failed
            fix = shell_failure(host, tail(log, 600))
            return Gone(why, error=f"{why}: {tail(log, 600).strip()}", fix=fix)
        return Gone(why, error=f"{why}: {tail(log, 600).strip()}")

    def kill(self) -> None:
        self._end_session()
        self._clean_up(keep_job=False)

    def _end_session(self) -> None:
        self.session.closing.set()
        proc = self.session.proc
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()  # the agent's stdin EOF: it stops its worker
            except OSError:
                pass
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._cancel_forward()

    def _cancel_forward(self) -> None:
        """Through a master the admin opened (a second-factor login), the run's forward would stay in that
        master's sshd until the master exits; without a master this fails at once, here, and says nothing."""
        forward = self.session.forward()
        if forward is not None:
            subprocess.run(cancel_forward_argv(self.target, forward), capture_output=True, timeout=30, check=False)

    def _job(self) -> str | None:
        workdir = self.session.workdir
        return None if workdir is None else f"{workdir}/{self.session.spec.run_id}"

    def _cleanup_script(self, keep_job: bool) -> str:
        """Ends what the run left on the host: its processes (a frozen agent does not see the session
        end; an interpreter that hung before it spoke is found by the stage's marker in its argv), the
        backend's job, the socket file (sshd leaves it) and the job folder (a POSIX sh script: run_script)."""
        job = self._job()
        doomed = [self.session.socket] + ([job] if job and not keep_job and not self.backend.keep_remote else [])
        sid = self.session.remote_session
        kill = f"pkill -KILL -s {sid}" if sid is not None else f"pkill -KILL -f -- {self.session.marker}"
        return "\n".join(
            [
                self.stop_job,
                f"{kill} 2>/dev/null",
                self._empty_checkpoints(),
                shlex.join(["rm", "-rf", "--", *doomed]),
                "",
            ]
        )

    def _empty_checkpoints(self) -> str:
        """The run's checkpoint folder and theirs, when empty (an agent killed before it removed them); one
        with a checkpoint stays for a retry (agent/checkpoints.py)."""
        workdir = self.session.workdir
        if workdir is None:
            return ""
        root = f"{workdir}/{CHECKPOINTS_FOLDER}"
        folder = f"{root}/{self.session.spec.job.resume_of or self.session.spec.run_id}"
        return shlex.join(["rmdir", "--", folder, root]) + " 2>/dev/null"

    def _clean_up(self, keep_job: bool) -> None:
        if self.cleaned:
            return
        self.cleaned = True
        try:
            run_script(self.target, self._cleanup_script(keep_job), timeout_s=30)
        except PotatoQueueError as exc:
            self.session.spec.log(f"could not clean up on {self.backend.host}: {exc.message}")

    def collect(self, result: AgentResult) -> str | None:
        if result.exit_code != 0 or self.cleaned:
            self.kill()  # model files come back after success only (SSH-7); a stopped run's are gone
            return None
        self._end_session()
        job = self._job()
        if job is None or not self.backend.fetch_artifacts:
            self._clean_up(keep_job=True)  # fetch_artifacts: false, the model files stay there
            return None if job is None else f"{self.backend.host}:{job}/work"
        copy = ModelCopy(self.target, self.backend, self.session.spec, job, self.copy_stall_s)
        try:
            kept = copy.run()
        except ModelFilesMissing:
            self._clean_up(keep_job=True)  # the job folder stays: its model files are the only ones now
            raise
        # The job folder goes only now, with every file it sent here whole, unless a file stayed there.
        self._clean_up(keep_job=kept)
        return f"{self.backend.host}:{job}/work" if kept else str(self.session.spec.paths.artifacts)


def start_agent(
    spec: LaunchSpec,
    backend: RemoteBackend,
    settings: Settings,
    header: BootHeader,
    assignment: dict[str, Any],
    stop_job: str = "",
    hard_stop_s: float = 0.0,
) -> RemoteAgentHandle:
    """The run's ssh session, with the bootstrap's conversation going on in a thread of its own; `stop_job`
    (POSIX sh) and `hard_stop_s`: a batch job's (RemoteAgentHandle)."""
    if spec.token is None:
        raise ValueError("a run over ssh needs its run token")
    target = target_of(backend, settings)
    return RemoteAgentHandle(
        BootSession(spec, backend, target, header, assignment),
        target,
        stop_job,
        hard_stop_s,
        settings.copy_stall_s,
    )
