"""One run's ssh session to the host and the bootstrap's conversation on it (host/boot.py's other end).

The session first asks for the reverse forward of the run's socket. Where sshd
refuses it (ExitOnForwardFailure makes ssh exit 255 saying so), the session is
opened once more without it and the agent's protocol goes over the session
itself (transport "session": host/channel.py there, carried.py here), said in
run.log. What the login prints before the stage's marker is skipped and said.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from typing import IO, Any
from urllib.parse import urlsplit

from potato_queue import code_package
from potato_queue.code_package import host_source
from potato_queue.errors import PotatoQueueError
from potato_queue.executors.base import LaunchSpec
from potato_queue.executors.remote.carried import AgentLog, carry
from potato_queue.executors.remote.openssh import FORWARD_SETTINGS, RemoteBackend, SshTarget, ssh_argv
from potato_queue.executors.remote.stage import (
    NoMarker,
    banner_note,
    new_marker,
    read_past_marker,
    stage_argv,
    stage_input,
)
from potato_queue.host import boot as remote_boot
from potato_queue.host.boot import BootHeader
from potato_queue.host.gpus import GpuWait, ssh_wait_line
from potato_queue.store.keys import remote_socket_path

__all__ = ["BootSession", "FORWARD", "OVER_SESSION", "forward_target", "boot_header"]

FORWARD, OVER_SESSION = remote_boot.FORWARD, remote_boot.SESSION
FORWARD_REFUSED = "forwarding failed"  # ssh's words for a refused -R, with ExitOnForwardFailure


def forward_target(server_url: str) -> str:
    """host:port of the server for the reverse forward; the agent speaks plain HTTP through the socket."""
    parts = urlsplit(server_url)
    if parts.scheme != "http" or parts.hostname is None:
        raise PotatoQueueError(
            f"a backend reached by ssh forwards the server's plain http address, not {server_url}",
            fix="serve plain http on 127.0.0.1 behind the TLS proxy (deploy/nginx.conf) and give "
            "agents the proxy's address with --public-url: ssh forwards go to the bound address",
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port or 80}"


def boot_header(
    backend: RemoteBackend,
    *,
    packages: list[str],
    num_threads: int | None,
    gpus: str,
    min_free_gpu_mb: float,
    slurm: bool = False,
) -> BootHeader:
    """The header a run's session starts with; the socket and the transport are the session's own."""
    return BootHeader(
        remote_dir=backend.remote_dir,
        code_sha256=code_package.agent_zipapp().sha256,
        host=backend.host,
        env=dict(backend.env),
        secret_env=list(backend.secret_env),
        packages=packages,
        num_threads=num_threads,
        gpus=gpus,
        min_free_gpu_mb=min_free_gpu_mb,
        slurm=slurm,
    )


class BootSession:
    """The run's ssh process (`proc`, replaced once if the forward is refused) and the conversation on it."""

    def __init__(
        self,
        spec: LaunchSpec,
        backend: RemoteBackend,
        target: SshTarget,
        header: BootHeader,
        assignment: dict[str, Any],
    ) -> None:
        self.spec, self.backend, self.target, self.header = spec, backend, target, header
        self.assignment = assignment  # what the agent gets besides the run, the server and its workdir
        # The step line until the agent runs (the supervise loop shows a Waiting's why).
        self.phase = f"connecting to {backend.host}"
        # The setup (connect, code copy, a venv build, the GPU pick) is run time, bounded by its own limit too.
        self.setup_until_s = spec.clock.now_s() + backend.setup_timeout_s
        self.ready = threading.Event()
        self.closing = threading.Event()  # the hard stop began: no second session
        self.workdir: str | None = None
        self.remote_session: int | None = None
        self.refusal: str | None = None
        self.gpu_wait: GpuWait | None = None  # the setup waits for GPU memory (its expiry says so)
        self.transport = FORWARD
        self.proc = self._open()
        self.thread = threading.Thread(target=self.converse, name=f"ssh-{spec.run_id}", daemon=True)
        self.thread.start()

    def forward(self) -> tuple[str, str] | None:
        return (self.socket, forward_target(self.spec.server_url)) if self.transport == FORWARD else None

    def _open(self) -> subprocess.Popen[bytes]:
        """A new session: a fresh socket path and marker each time (the first session's bootstrap removes its own)."""
        self.socket, self.marker = remote_socket_path(self.spec.run_id), new_marker()
        argv = ssh_argv(self.target, stage_argv(self.backend.python, self.marker), forward=self.forward())
        log_fd = os.open(self.spec.paths.agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            return subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fd, start_new_session=True
            )
        finally:
            os.close(log_fd)

    def converse(self) -> None:
        """The conversation; once more over the session itself when sshd refused the forward."""
        if not self._converse_once() or self.closing.is_set():
            return
        host = self.backend.host
        self.spec.log(
            f"{host}'s sshd refuses forwarding ({FORWARD_SETTINGS}): the agent's protocol goes over the "
            "ssh session itself"
        )
        self.transport = OVER_SESSION
        self.proc = self._open()
        self._converse_once()

    def _converse_once(self) -> bool:
        """Answers the bootstrap until the agent starts, then copies its output to agent.log (or carries its
        connections); True when the session ended because sshd refused the forward."""
        stdin, stdout, log_path = self.proc.stdin, self.proc.stdout, self.spec.paths.agent_log
        assert stdin is not None and stdout is not None
        log_start = log_path.stat().st_size if log_path.exists() else 0
        try:
            header = self.header._replace(socket=self.socket, transport=self.transport)
            self._send(stdin, stage_input(host_source(remote_boot)) + header.to_line())
            note = banner_note(
                self.backend.host, read_past_marker(stdout.fileno(), self.marker).decode(errors="replace")
            )
            if note:
                self.spec.log(note)
            with open(log_path, "ab") as agent_log:
                self._talk(stdin, stdout, agent_log)
        except (OSError, NoMarker):
            pass  # the session ended; poll() says how
        if self.ready.is_set() or self.transport != FORWARD:
            return False
        code = self.proc.wait()
        with open(log_path, "rb") as fh:
            fh.seek(log_start)
            return code == 255 and FORWARD_REFUSED in fh.read(64 << 10).decode(errors="replace")

    def _talk(self, stdin: IO[bytes], stdout: IO[bytes], agent_log: IO[bytes]) -> None:
        log = AgentLog(agent_log)  # with a forward, the agent's output is these lines: capped as LOG frames are
        try:
            for raw in stdout:
                message = None if self.ready.is_set() else _message(raw)
                if message is None:
                    log.write(raw)
                    continue
                self._answer(message, self.backend.host, stdin)
                if self.ready.is_set() and self.transport == OVER_SESSION:
                    carry(stdout, stdin, self.spec.server_url, agent_log)
                    return
        finally:
            log.close()

    def _answer(self, message: dict[str, Any], host: str, stdin: IO[bytes]) -> None:
        event = message.get("event")
        if event == "session":
            self.remote_session = int(message["session"])  # from the first moment: the hard stop's target
        elif event == "python":
            self.spec.log(f"{host}: Python {message['version']} ({message['executable']})")
        elif event == "need_code":
            self.phase = f"copying Potato's code to {host}"
            package = code_package.agent_zipapp()
            self.spec.log(
                f"{self.phase}: {len(package.data) / 1000:.0f} KB, to "
                f"{self.backend.remote_dir.rstrip('/')}/code/{package.sha256}.pyz"
            )
            self._send(stdin, f"{len(package.data)}\n".encode() + package.data)
        elif event == "creating_env":
            self.phase = f"creating the environment on {host}"
            self.spec.log(f"{self.phase}: a venv with {', '.join(self.header.packages)}")
        elif event == "gpu_wait":
            self.gpu_wait = GpuWait.from_json(message["wait"])
            self.phase = ssh_wait_line(self.gpu_wait, host)
        elif event == "gpu":
            self.gpu_wait, self.phase = None, f"starting the agent on {host}"
            self.spec.log(f"{host}: {message['line']}")
        elif event == "refused":
            self.refusal = str(message["message"])
        elif event == "ready":
            self._hand_over(message, host, stdin)

    def _hand_over(self, message: dict[str, Any], host: str, stdin: IO[bytes]) -> None:
        self.workdir = str(message["workdir"])
        self.remote_session = int(message["session"])
        assignment = {
            "run_id": self.spec.run_id,
            "server": f"unix://{self.socket}",
            "workdir": self.workdir,
            "keep": bool(self.backend.keep_remote),
            **self.assignment,
        }
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
