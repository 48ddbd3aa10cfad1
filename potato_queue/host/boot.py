"""The first thing an ssh run runs on the GPU host, through executors/remote/stage.py's first stage.

Standard library only, Python 3.8+, and self-contained: nothing of ours is on
the host yet. It speaks with the executor over the ssh session's stdin and
stdout, one JSON object a line, and reads stdin unbuffered, so that what
follows its last message (the assignment and the run token) is left for the
agent it becomes:

  executor -> {"remote_dir", "code_sha256", "packages", "env", "num_threads", "gpus", "min_free_gpu_mb", "host",
               "socket", "slurm", "transport"}  (socket: the forward's file, removed when the setup ends
                                                without an agent; slurm: true on a login node: no GPU
                                                choice, the agent submits its worker with sbatch;
                                                transport "session": sshd refuses forwards, so this
                                                process listens on the socket itself and carries the
                                                agent's connections over stdin/stdout: host/channel.py)
  boot     -> {"event": "session", "session"}   the sid of everything the run starts, before any slow
                                                step (a session of its own unless the shell exec'd it)
  boot     -> {"event": "python", "version", "executable"}
  boot     -> {"event": "need_code"}            executor -> "<bytes>\\n" and the agent.pyz bytes
  boot     -> {"event": "creating_env"}         (only when `packages` changed or is new)
  boot     -> {"event": "gpu_wait", "wait"}       (while no GPU has min_free_gpu_mb free: host/gpus.py's
                                                GpuWait, again every GPU_REPORT_S while it changes)
  boot     -> {"event": "gpu", "line"}
  boot     -> {"event": "ready", "workdir", "session"}  then it execs the agent, whose stdin the executor
                                                writes (transport "session": it starts the agent, hands
                                                it the two lines that follow, then relays frames)
  boot     -> {"event": "refused", "message"}   and exits 3 (a Python too old, no GPU that fits)

The host's layout, all under remote_dir (mode 0700): code/<sha256>.pyz (the
agent zipapp, kept while the code is the same), venvs/<hash of packages>/
(with a `ready` file once pip has finished), jobs/<run_id>/ (the agent's).
"""

import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import time
from typing import Any, Dict, List, NamedTuple, Optional

EXIT_REFUSED = 3
# The header's transport: the agent reaches the server through the session's forward, or (sshd refuses
# forwards) through this process over the session itself.
FORWARD, SESSION = "forward", "session"


class BootHeader(NamedTuple):
    """The executor's first line (the module docstring): one type for the side that writes it and this one."""

    remote_dir: str
    code_sha256: str
    host: str
    env: Dict[str, str]
    secret_env: List[str]
    packages: List[str]
    num_threads: Optional[int]
    gpus: str  # auto, none, or the GPU indices allowed ("0,1")
    min_free_gpu_mb: float
    slurm: bool = False
    socket: str = ""
    transport: str = FORWARD

    def to_line(self) -> bytes:
        return (json.dumps(self._asdict()) + "\n").encode()

    @classmethod
    def from_line(cls, line: str) -> "BootHeader":
        data = json.loads(line)
        return cls(**{name: data[name] for name in cls._fields if name in data})


def send(event: str, **fields: object) -> None:
    os.write(1, (json.dumps(dict(fields, event=event)) + "\n").encode())


def read_line() -> str:
    """One line of stdin, a byte at a time: a buffered read would take the agent's lines too."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            raise SystemExit("potato-queue: the executor closed the session")
        line += byte
    return line.decode()


def read_exact(size: int) -> bytes:
    chunks, left = [], size  # type: List[bytes], int
    while left:
        chunk = os.read(0, min(left, 1 << 20))
        if not chunk:
            raise SystemExit("potato-queue: the session ended while the code was being copied")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def folder(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def ensure_code(root: str, sha256: str) -> str:
    """code/<sha256>.pyz, received from the executor only when it is not there yet."""
    path = os.path.join(folder(os.path.join(root, "code")), sha256 + ".pyz")
    if os.path.exists(path):
        return path
    send("need_code")
    data = read_exact(int(read_line()))
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit("potato-queue: the code arrived damaged (sha256 differs)")
    partial = "{}.{}.partial".format(path, os.getpid())
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
        fh.write(data)
    os.replace(partial, path)  # whole or absent: two runs copying at once both end with the same file
    return path


def ensure_env(root: str, packages: List[str]) -> str:
    """The interpreter for the run: a venv with `packages` (built once per list), or this one."""
    if not packages:
        return sys.executable
    name = hashlib.sha256(json.dumps(sorted(packages)).encode()).hexdigest()[:16]
    venv = os.path.join(folder(os.path.join(root, "venvs")), name)
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(os.path.join(venv, "ready")):
        return python
    send("creating_env")
    shutil.rmtree(venv, ignore_errors=True)  # a build that was cut off half-way
    subprocess.check_call([sys.executable, "-m", "venv", "--system-site-packages", venv], stdout=2)
    subprocess.check_call(
        [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"] + list(packages), stdout=2
    )
    open(os.path.join(venv, "ready"), "w").close()
    return python


def main() -> int:
    os.umask(0o077)
    try:
        os.setsid()  # a session of our own: the executor's hard stop is `pkill -KILL -s` of it
    except OSError:
        pass  # already a session leader (the login shell exec'd us)
    # The header first: the executor sent it with the program, so it is here even when the executor died
    # since; what follows may fail (its session gone) and must still remove the socket the header names.
    header = BootHeader.from_line(read_line())
    try:
        send("session", session=os.getsid(0))  # before any slow step: the hard stop can reach all we start
        return boot(header)
    finally:  # not reached once the agent runs (execve): it removes the socket itself (--forwarded-socket)
        remove_socket(header.socket)


def remove_socket(path: str) -> None:
    """The session's forwarded socket: sshd leaves the file, and an executor that died cannot remove it. Only a
    socket of this account's. host/check.py has the same function: each of the two is sent to a host as a
    script that must stand alone (this one runs before our code is there), so neither can import it."""
    try:
        info = os.lstat(path)
        if stat.S_ISSOCK(info.st_mode) and info.st_uid == os.getuid():
            os.unlink(path)
    except OSError:
        pass


def choose_waiting(header: BootHeader, python: str) -> Any:
    """The GPU choice (host/gpus.py's Choice); while no GPU has min_free_gpu_mb free, it waits, asking
    nvidia-smi again every GPU_POLL_S and saying what it sees (the step line). The executor bounds the
    wait (setup_timeout_s: it ends the session); a refusal waiting cannot fix is raised at once."""
    from potato_queue.host.check import gpu_facts, nvidia_smi
    from potato_queue.host.gpus import GPU_POLL_S, GPU_REPORT_S, GpuBusy, choose
    from potato_queue.host.nvidia_smi import NVIDIA_SMI_QUERY, parse_gpus

    csv, archs = ("", None) if header.gpus == "none" else gpu_facts(python, NVIDIA_SMI_QUERY)
    said: Optional[Dict[str, Any]] = None
    said_s = 0.0
    while True:
        try:
            return choose(header.gpus, parse_gpus(csv), header.min_free_gpu_mb, archs, header.host)
        except GpuBusy as busy:
            wait = busy.wait.to_json()
            if said is None or (wait != said and time.monotonic() - said_s >= GPU_REPORT_S):
                send("gpu_wait", wait=wait)
                said, said_s = wait, time.monotonic()
        time.sleep(GPU_POLL_S)
        csv = nvidia_smi(NVIDIA_SMI_QUERY)  # torch's arch list does not change meanwhile


def boot(header: BootHeader) -> int:
    """The setup, then the agent (this process becomes it); the exit code when it cannot start."""
    os.environ.update(header.env)  # the backend's PATH finds nvidia-smi and pip too
    if sys.version_info < (3, 8):
        send(
            "refused",
            message="{} is Python {}; potato-queue needs 3.8 or newer".format(
                sys.executable, platform.python_version()
            ),
        )
        return EXIT_REFUSED
    send("python", version=platform.python_version(), executable=sys.executable)
    root = folder(os.path.expanduser(header.remote_dir))
    code = ensure_code(root, header.code_sha256)
    python = ensure_env(root, header.packages)
    sys.path.insert(0, code)
    # Imported only now: until ensure_code, nothing of ours is on this host (the module docstring).
    from potato_queue.host.gpus import GpuRefused
    from potato_queue.wire.isolated import THREAD_ENV_VARS, allowed_env, python_argv

    env = allowed_env(os.environ, header.env, header.secret_env)
    slurm = header.slurm
    if not slurm:  # a login node's GPUs are not the job's: SLURM's gres gives those
        try:
            choice = choose_waiting(header, python)
        except GpuRefused as refused:
            send("refused", message=str(refused))
            return EXIT_REFUSED
        send("gpu", line=choice.line)
        # nvidia-smi numbers GPUs in PCI bus order, CUDA fastest first unless told: the GPU chosen by its index
        # must be the one the worker gets.
        env.update(CUDA_VISIBLE_DEVICES=choice.visible_devices, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        if header.num_threads:
            env.update({name: str(header.num_threads) for name in THREAD_ENV_VARS})
    jobs = folder(os.path.join(root, "jobs"))
    options = ["--slurm"] if slurm else ["--python", python]
    if header.transport == SESSION:
        return relay_agent(
            header.socket,
            jobs,
            python_argv(python, "potato_queue.agent", ["run", "--assignment-on-stdin"] + options, code_root=code),
            env,
        )
    send("ready", workdir=jobs, session=os.getsid(0))
    if header.socket:  # the agent removes it when it ends, whatever ends it
        options += ["--forwarded-socket", header.socket]
    argv = python_argv(python, "potato_queue.agent", ["run", "--assignment-on-stdin"] + options, code_root=code)
    os.execve(python, argv, env)
    return 0  # not reached


def relay_agent(path: str, jobs: str, argv: List[str], env: Dict[str, str]) -> int:
    """sshd refuses forwards: this process listens on the run's socket and carries the agent's connections
    over the session (host/channel.py); the agent's exit code is the session's."""
    from potato_queue.host.channel import HostRelay

    relay = HostRelay(path)
    try:
        send("ready", workdir=jobs, session=os.getsid(0))
        handed = (read_line() + read_line()).encode()  # the assignment and the run token, for the agent alone
        agent = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert agent.stdin is not None
        agent.stdin.write(handed)
        agent.stdin.flush()
        return relay.serve(agent)
    finally:
        relay.close()


if __name__ == "__main__":
    sys.exit(main())
