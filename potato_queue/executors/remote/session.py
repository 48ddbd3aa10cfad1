"""An agent started over ssh on a host we log in to, shared by the ssh and slurm backends (not an executor).

One ssh session per run. It reverse-forwards a unix socket in the host's /tmp
(0600, one path per launch) to the server and runs `python -c <host/boot.py>`,
which checks the interpreter, takes the code (sent only when
`remote_dir/code/<sha256>.pyz` is missing), and execs the agent. The agent
gets its assignment and the run token on stdin, never on a command line, and
talks HTTP through the socket. The session's end (ssh killed, the network
gone) is the agent's stdin EOF and SIGHUP: it stops its worker (on a login
node: it cancels its job). The handle's hard stop ends what the run left on
the host in one more ssh: its processes, what the backend adds (a job's
scancel), the socket file and the job folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from potato_queue import code_package
from potato_queue.agent.checkpoints import CHECKPOINTS_FOLDER
from potato_queue.errors import PotatoQueueError
from potato_queue.executors.base import (
    AgentResult,
    CheckReport,
    Gone,
    LaunchSpec,
    RunHandle,
    Running,
    Status,
    Waiting,
)
from potato_queue.executors.remote.copy import ModelCopy
from potato_queue.executors.remote.openssh import (
    SshFailed,
    SshTarget,
    remote_shell,
    run_ssh,
    ssh_argv,
    ssh_failure,
)
from potato_queue.host import boot as remote_boot
from potato_queue.host import check as remote_check
from potato_queue.host.gpus import GpuWait, ssh_wait_expired, ssh_wait_line
from potato_queue.store.keys import remote_socket_path

__all__ = ["SSH_CONFIG_ENV", "boot_command", "setup_expired", "forward_target", "target_of", "python_not_found",
           "host_facts", "failed_check", "start_agent", "RemoteAgentHandle", "tail"]

# An ssh config file of the server's own (ssh's -F): for a deployment that keeps its hosts apart
# from the account's ~/.ssh/config, and for the tests' sshd.
SSH_CONFIG_ENV = "POTATO_QUEUE_SSH_CONFIG"
BOOT_SOURCE = Path(remote_boot.__file__).read_text()
CHECK_SOURCE = Path(remote_check.__file__).read_text()
EXIT_NOT_FOUND = 127


def forward_target(server_url: str) -> str:
    """host:port of the server for the reverse forward; the agent speaks plain HTTP through the socket."""
    parts = urlsplit(server_url)
    if parts.scheme != "http" or parts.hostname is None:
        raise PotatoQueueError(f"a backend reached by ssh forwards the server's plain http address, not {server_url}",
                               fix="serve plain http on 127.0.0.1 behind the TLS proxy (deploy/nginx.conf) and give "
                                   "agents the proxy's address with --public-url: ssh forwards go to the bound address")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port or 80}"


def target_of(backend: Any) -> SshTarget:
    return SshTarget.of(backend, config_file=os.environ.get(SSH_CONFIG_ENV) or None)


def python_not_found(backend: Any, backend_name: str) -> tuple[str, str]:
    """ERR-2 and its fix."""
    host = backend.host
    return (f"{backend.python} was not found on {host}", f"set `python` of backend {backend_name} to an interpreter "
            f"on {host} (3.8 or newer; `ssh {host} which python3` shows one)")


def host_facts(backend: Any, backend_name: str, asked: dict[str, Any]) -> dict[str, Any]:
    """What host/check.py saw on the host (`training check`); PotatoQueueError with its fix when the host cannot
    be asked (ERR-1 and the other ssh failures, ERR-2)."""
    try:
        return json.loads(run_ssh(target_of(backend), [backend.python, "-c", CHECK_SOURCE],
                                  stdin=json.dumps(asked).encode() + b"\n", timeout_s=120))
    except SshFailed:
        raise
    except PotatoQueueError as exc:
        if "not found" in exc.message or "No such file" in exc.message:
            message, fix = python_not_found(backend, backend_name)
            raise PotatoQueueError(message, fix=fix) from exc
        raise


def failed_check(exc: PotatoQueueError) -> CheckReport:
    """The check's report when the host could not be asked."""
    return CheckReport(ok=False, lines=[exc.message] + ([f"fix: {exc.fix}"] if exc.fix else []),
                       data={"error": exc.message, "fix": exc.fix})


def tail(path: Path, size: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def setup_expired(host: str, backend_name: str, limit_s: float, phase: str) -> str:
    """Why a run whose setup on the host hung failed: the phase it hung in, and the setting to raise."""
    return (f"The setup on {host} did not finish within setup_timeout_s ({limit_s:g} s): it was still {phase}. "
            f"Fix: raise setup_timeout_s of backend {backend_name} (a first venv build with large packages can "
            "take many minutes), or see agent.log in the run's folder for where it hung")


def boot_command(python: str) -> str:
    """The remote command line: the login shell says its pid, then becomes the bootstrap. sshd made that shell
    a session leader, so the pid is the sid of everything the run will start, known before any slow step
    (an interpreter that hangs, a code copy to a stuck disk): the hard stop reaches them all."""
    return f"echo '{{\"event\": \"session\", \"session\": '$$'}}'; exec {remote_shell([python, '-c', BOOT_SOURCE])}"


class _Session:
    """The run's ssh process and the bootstrap's conversation on its stdin and stdout."""

    def __init__(self, proc: subprocess.Popen[bytes], spec: LaunchSpec, backend: Any, socket: str,
                 assignment: dict[str, Any]) -> None:
        self.proc, self.spec, self.backend, self.socket = proc, spec, backend, socket
        self.assignment = assignment  # what the agent gets besides the run, the server and its workdir
        # The step line until the agent runs (the supervise loop shows a Waiting's why).
        self.phase = f"connecting to {backend.host}"
        # The setup (connect, code copy, a venv build, the GPU pick) is run time, bounded by its own limit too.
        self.setup_until_s = spec.clock.now_s() + backend.setup_timeout_s
        self.ready = threading.Event()
        self.workdir: str | None = None
        self.remote_session: int | None = None
        self.refusal: str | None = None
        self.gpu_wait: GpuWait | None = None  # the setup waits for GPU memory (its expiry says so)

    def converse(self, header: dict[str, Any]) -> None:
        """Answers the bootstrap until the agent starts; then the rest of stdout goes to agent.log."""
        host, stdin, stdout = self.backend.host, self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        try:
            self._send(stdin, json.dumps(header).encode() + b"\n")
            with open(self.spec.paths.agent_log, "ab") as agent_log:
                for raw in stdout:
                    message = None if self.ready.is_set() else _message(raw)
                    if message is None:
                        agent_log.write(raw)
                        agent_log.flush()
                    else:
                        self._answer(message, host, stdin)
        except OSError:
            pass  # the session ended; poll() says how

    def _answer(self, message: dict[str, Any], host: str, stdin: IO[bytes]) -> None:
        event = message.get("event")
        if event == "session":
            self.remote_session = int(message["session"])  # from the first moment: the hard stop's target
        elif event == "python":
            self.spec.log(f"{host}: Python {message['version']} ({message['executable']})")
        elif event == "need_code":
            self.phase = f"copying Potato's code to {host}"
            package = code_package.agent_zipapp()
            self.spec.log(f"{self.phase}: {len(package.data) / 1000:.0f} KB, to "
                          f"{self.backend.remote_dir.rstrip('/')}/code/{package.sha256}.pyz")
            self._send(stdin, f"{len(package.data)}\n".encode() + package.data)
        elif event == "creating_env":
            self.phase = f"creating the environment on {host}"
            self.spec.log(f"{self.phase}: a venv with {', '.join(self.backend.packages)}")
        elif event == "gpu_wait":
            self.gpu_wait = GpuWait.from_json(message["wait"])
            self.phase = ssh_wait_line(self.gpu_wait, host)
        elif event == "gpu":
            self.gpu_wait, self.phase = None, f"starting the agent on {host}"
            self.spec.log(f"{host}: {message['line']}")
        elif event == "refused":
            self.refusal = str(message["message"])
        elif event == "ready":
            self.workdir = str(message["workdir"])
            self.remote_session = int(message["session"])
            assignment = {"run_id": self.spec.run_id, "server": f"unix://{self.socket}", "workdir": self.workdir,
                          "keep": bool(self.backend.keep_remote), **self.assignment}
            assert self.spec.token is not None
            self._send(stdin, json.dumps(assignment).encode() + b"\n" + self.spec.token.encode() + b"\n")
            self.spec.step(f"waiting for the agent on {host}")
            self.ready.set()

    @staticmethod
    def _send(stdin: IO[bytes], data: bytes) -> None:
        stdin.write(data)
        stdin.flush()


def _message(raw: bytes) -> dict[str, Any] | None:
    """A bootstrap message, or None for a line of output."""
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


class RemoteAgentHandle(RunHandle):
    """The run's session; `stop_job` is shell run first by the hard stop (a job's scancel), or ""."""

    def __init__(self, session: _Session, target: SshTarget, stop_job: str = "", hard_stop_s: float = 0.0) -> None:
        self.session, self.target, self.stop_job = session, target, stop_job
        self.hard_stop_s = hard_stop_s
        self.backend = session.backend
        self.cleaned = False

    def poll(self) -> Status:
        code = self.session.proc.poll()
        if code is None:
            # Until the agent runs, the heartbeat clock waits: a venv's pip install can take minutes.
            return Running() if self.session.ready.is_set() else Waiting(
                self.session.phase, self.session.setup_until_s, self._expired(), run_time=True)
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
        host = self.backend.host
        if self.session.ready.is_set():
            return Gone(f"the ssh session to {host} ended with exit code {code}")
        if self.session.refusal:
            return Gone(self.session.refusal, error=self.session.refusal)
        if code == 255:
            failure = ssh_failure(host, tail(self.session.spec.paths.agent_log))
            return Gone(failure.message, error=failure.message, fix=failure.fix)
        if code == EXIT_NOT_FOUND:
            message, fix = python_not_found(self.backend, self.session.spec.backend_name)
            return Gone(message, error=message, fix=fix)
        why = f"the setup on {host} ended with exit code {code}"
        return Gone(why, error=f"{why}: {tail(self.session.spec.paths.agent_log, 600).strip()}")

    def kill(self) -> None:
        self._end_session()
        self._clean_up(keep_job=False)

    def _end_session(self) -> None:
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

    def _job(self) -> str | None:
        workdir = self.session.workdir
        return None if workdir is None else f"{workdir}/{self.session.spec.run_id}"

    def _cleanup_command(self, keep_job: bool) -> str:
        """Ends what the run left on the host: its processes (a frozen agent does not see the session
        end), the backend's job, the socket file (sshd leaves it) and the job folder."""
        job = self._job()
        doomed = [self.session.socket] + ([job] if job and not keep_job and not self.backend.keep_remote else [])
        remove = remote_shell(["rm", "-rf", "--", *doomed])
        sid = self.session.remote_session
        kill = "" if sid is None else f"pkill -KILL -s {sid} 2>/dev/null; "
        return f"{self.stop_job}{kill}{self._empty_checkpoints()}{remove}"

    def _empty_checkpoints(self) -> str:
        """The run's checkpoint folder and theirs, when empty (an agent killed before it removed them); one
        with a checkpoint stays for a retry (agent/checkpoints.py)."""
        workdir = self.session.workdir
        if workdir is None:
            return ""
        root = f"{workdir}/{CHECKPOINTS_FOLDER}"
        folder = f"{root}/{self.session.spec.job.resume_of or self.session.spec.run_id}"
        return remote_shell(["rmdir", "--", folder, root]) + " 2>/dev/null; "  # rm's status stays the command's

    def _clean_up(self, keep_job: bool) -> None:
        if self.cleaned:
            return
        self.cleaned = True
        try:
            run_ssh(self.target, ["sh", "-c", self._cleanup_command(keep_job)], timeout_s=30)
        except PotatoQueueError as exc:
            self.session.spec.log(f"could not clean up on {self.backend.host}: {exc.message}")

    def collect(self, result: AgentResult) -> str | None:
        if result.exit_code != 0 or self.cleaned:
            self.kill()  # model files come back after success only (SSH-7); a stopped run's are gone
            return None
        self._end_session()
        job = self._job()
        if job is not None and self.backend.fetch_artifacts:
            self.cleaned = True  # the copy's own ssh cleans up once the stream is sent
            kept = ModelCopy(self.target, self.backend, self.session.spec, job,
                             self._cleanup_command(keep_job=True)).run()
            return f"{self.backend.host}:{job}/work" if kept else str(self.session.spec.paths.artifacts)
        self._clean_up(keep_job=True)  # fetch_artifacts: false, the model files stay there
        return None if job is None else f"{self.backend.host}:{job}/work"


def start_agent(spec: LaunchSpec, backend: Any, header: dict[str, Any], assignment: dict[str, Any],
                stop_job: str = "", hard_stop_s: float = 0.0) -> RemoteAgentHandle:
    """The run's ssh session, with the bootstrap's conversation going on in a thread of its own; `stop_job` and
    `hard_stop_s`: a batch job's (RemoteAgentHandle)."""
    if spec.token is None:
        raise ValueError("a run over ssh needs its run token")
    target = target_of(backend)
    socket = remote_socket_path(spec.run_id)
    argv = ssh_argv(target, [], forward=(socket, forward_target(spec.server_url))) + [boot_command(backend.python)]
    log_fd = os.open(spec.paths.agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fd,
                                start_new_session=True)
    finally:
        os.close(log_fd)
    session = _Session(proc, spec, backend, socket, assignment)
    header = {"remote_dir": backend.remote_dir, "code_sha256": code_package.agent_zipapp().sha256,
              "env": backend.env, "secret_env": backend.secret_env, "host": backend.host, "socket": socket, **header}
    threading.Thread(target=session.converse, args=(header,), name=f"ssh-{spec.run_id}", daemon=True).start()
    return RemoteAgentHandle(session, target, stop_job, hard_stop_s)
