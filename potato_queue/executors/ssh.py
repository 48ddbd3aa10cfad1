"""The ssh backend: a GPU server reached by ssh, with nothing installed there by hand (SSH-1..12).

One ssh session per run. It reverse-forwards a unix socket in the host's /tmp
(0600, one path per launch) to the server and runs `python -c <remote_boot>`,
which checks the interpreter, takes the code (sent only when
`remote_dir/code/<sha256>.pyz` is missing), builds the venv once per
`packages` list, picks the GPU, and execs the agent. The agent gets its
assignment and the run token on stdin, never on a command line, and talks
HTTP through the socket. The session's end (ssh killed, the network gone) is
the agent's stdin EOF and SIGHUP: it stops its worker, and the worker stops
itself when its parent goes.
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
from potato_queue.agent import remote_boot, remote_check
from potato_queue.agent.gpus import NVIDIA_SMI_QUERY, GpuRefused, choose, describe, has_kernels, parse_gpus
from potato_queue.config import SshBackend
from potato_queue.errors import PotatoQueueError
from potato_queue.executors.base import (
    AgentResult,
    CheckReport,
    Executor,
    Gone,
    LaunchSpec,
    RunHandle,
    Running,
    Status,
    Waiting,
)
from potato_queue.executors.openssh import SshFailed, SshTarget, remote_shell, run_ssh, ssh_argv, ssh_failure
from potato_queue.executors.remote_copy import ModelCopy
from potato_queue.keys import remote_socket_path

__all__ = ["SshExecutor", "SshHandle", "SSH_CONFIG_ENV", "forward_target"]

# An ssh config file of the server's own (ssh's -F): for a deployment that keeps its hosts apart
# from the account's ~/.ssh/config, and for the tests' sshd.
SSH_CONFIG_ENV = "POTATO_QUEUE_SSH_CONFIG"
BOOT_SOURCE = Path(remote_boot.__file__).read_text()
CHECK_SOURCE = Path(remote_check.__file__).read_text()
EXIT_NOT_FOUND = 127
# What `training check` looks for in the host's interpreter (the trainers' import names).
TRAINING_PACKAGES = ["torch", "transformers", "peft", "sklearn"]


def forward_target(server_url: str) -> str:
    """host:port of the server for the reverse forward; the agent speaks plain HTTP through the socket."""
    parts = urlsplit(server_url)
    if parts.scheme != "http" or parts.hostname is None:
        raise PotatoQueueError(f"the ssh backend forwards the server's plain http address, not {server_url}",
                               fix="serve plain http on an address the executor reaches (TLS stays at the proxy)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port or 80}"


def target_of(backend: SshBackend) -> SshTarget:
    return SshTarget.of(backend, config_file=os.environ.get(SSH_CONFIG_ENV) or None)


class _Session:
    """The run's ssh process and the bootstrap's conversation on its stdin and stdout."""

    def __init__(self, proc: subprocess.Popen[bytes], spec: LaunchSpec, backend: SshBackend, socket: str) -> None:
        self.proc, self.spec, self.backend, self.socket = proc, spec, backend, socket
        # The step line until the agent runs (the supervise loop shows a Waiting's why).
        self.phase = f"connecting to {backend.host}"
        self.ready = threading.Event()
        self.workdir: str | None = None
        self.remote_session: int | None = None
        self.refusal: str | None = None

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
        if event == "python":
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
        elif event == "gpu":
            self.spec.log(f"{host}: {message['line']}")
        elif event == "refused":
            self.refusal = str(message["message"])
        elif event == "ready":
            self.workdir = str(message["workdir"])
            self.remote_session = int(message["session"])
            assignment = {"run_id": self.spec.run_id, "server": f"unix://{self.socket}", "workdir": self.workdir}
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


def python_not_found(backend: SshBackend, backend_name: str) -> tuple[str, str]:
    """ERR-2 and its fix."""
    host = backend.host
    return (f"{backend.python} was not found on {host}", f"set `python` of backend {backend_name} to an interpreter "
            f"on {host} (3.8 or newer; `ssh {host} which python3` shows one)")


class SshHandle(RunHandle):
    def __init__(self, session: _Session, target: SshTarget) -> None:
        self.session, self.target = session, target
        self.backend = session.backend
        self.cleaned = False

    def poll(self) -> Status:
        code = self.session.proc.poll()
        if code is None:
            # Until the agent runs, the heartbeat clock waits: a venv's pip install can take minutes.
            return Running() if self.session.ready.is_set() else Waiting(self.session.phase)
        return self._gone(code)

    def _gone(self, code: int) -> Gone:
        """What the session's end means; before the agent ran, nobody else can tell the run why."""
        host = self.backend.host
        if self.session.ready.is_set():
            return Gone(f"the ssh session to {host} ended with exit code {code}")
        if self.session.refusal:
            return Gone(self.session.refusal, error=self.session.refusal)
        if code == 255:
            failure = ssh_failure(host, _tail(self.session.spec.paths.agent_log))
            return Gone(failure.message, error=failure.message, fix=failure.fix)
        if code == EXIT_NOT_FOUND:
            message, fix = python_not_found(self.backend, self.session.spec.backend_name)
            return Gone(message, error=message, fix=fix)
        why = f"the setup on {host} ended with exit code {code}"
        return Gone(why, error=f"{why}: {_tail(self.session.spec.paths.agent_log, 600).strip()}")

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
        end), the socket file (sshd leaves it) and the job folder."""
        job = self._job()
        doomed = [self.session.socket] + ([job] if job and not keep_job and not self.backend.keep_remote else [])
        remove = remote_shell(["rm", "-rf", "--", *doomed])
        sid = self.session.remote_session
        return remove if sid is None else f"pkill -KILL -s {sid} 2>/dev/null; {remove}"

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


def check_report(backend: SshBackend, facts: dict[str, Any]) -> CheckReport:
    """The check's report from what remote_check saw, deciding the GPU as a run would."""
    host = backend.host
    gpus, archs = parse_gpus(facts.get("nvidia_smi") or ""), facts.get("arch_list")
    lines = [f"{host}: Python {facts['python']} ({facts['executable']})"]
    lines += [f"  {describe(gpu, archs)}" for gpu in gpus] or [f"  no GPU (no nvidia-smi on {host}'s PATH)"]
    ok, gpu_line = True, ""
    try:
        gpu_line = choose(backend.gpus, gpus, backend.min_free_gpu_mb, archs, host).line
        lines.append(f"a run now: {gpu_line}")
    except GpuRefused as refused:
        ok, gpu_line = False, str(refused)
        lines.append(f"a run now would not start: {refused}")
    missing = sorted(name for name, present in facts["packages"].items() if not present)
    if missing:
        venv = f"; the backend's packages go into a venv at the first run: {', '.join(backend.packages)}" \
            if backend.packages else ""
        lines.append(f"training packages missing from {facts['executable']}: {', '.join(missing)}{venv}")
    data = {"host": host, "python": facts["python"], "executable": facts["executable"],
            "gpus": [gpu._asdict() | {"usable": has_kernels(gpu, archs)} for gpu in gpus], "gpu": gpu_line,
            "missing_packages": missing}
    return CheckReport(ok=ok, lines=lines, data=data)


def _tail(path: Path, size: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


class SshExecutor(Executor):
    type_name = "ssh"
    backend: SshBackend

    def check(self) -> CheckReport:
        """SSH-6: the host's Python, each GPU, the GPU a run would get, training packages it lacks."""
        try:
            asked = {"env": self.backend.env, "query": NVIDIA_SMI_QUERY, "packages": TRAINING_PACKAGES}
            facts = json.loads(run_ssh(target_of(self.backend), [self.backend.python, "-c", CHECK_SOURCE],
                                       stdin=json.dumps(asked).encode() + b"\n", timeout_s=120))
        except PotatoQueueError as exc:
            message, fix = exc.message, exc.fix
            if not isinstance(exc, SshFailed) and ("not found" in message or "No such file" in message):
                message, fix = python_not_found(self.backend, self.backend_name)
            return CheckReport(ok=False, lines=[message] + ([f"fix: {fix}"] if fix else []),
                               data={"error": message, "fix": fix})
        return check_report(self.backend, facts)

    def launch(self, spec: LaunchSpec) -> RunHandle:
        if spec.token is None:
            raise ValueError("an ssh run needs its run token")
        target = target_of(self.backend)
        socket = remote_socket_path(spec.run_id)
        argv = ssh_argv(target, [self.backend.python, "-c", BOOT_SOURCE], forward=(socket, forward_target(
            spec.server_url)))
        log_fd = os.open(spec.paths.agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fd,
                                    start_new_session=True)
        finally:
            os.close(log_fd)
        session = _Session(proc, spec, self.backend, socket)
        header = {"remote_dir": self.backend.remote_dir, "code_sha256": code_package.agent_zipapp().sha256,
                  "packages": self.backend.packages, "env": self.backend.env, "num_threads": self.backend.num_threads,
                  "gpus": self.backend.gpus, "min_free_gpu_mb": self.backend.min_free_gpu_mb,
                  "host": self.backend.host}
        threading.Thread(target=session.converse, args=(header,), name=f"ssh-{spec.run_id}", daemon=True).start()
        return SshHandle(session, target)
