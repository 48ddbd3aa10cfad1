"""OpenSSH command lines, built by pure functions, and the one place they run (shared by ssh and slurm).

The contract with the admin is "if `ssh host true` works for this account, runs
work" (docs/decisions.md, "OpenSSH, not paramiko"): aliases, ProxyJump, ssh-agent and certificates
come from their ~/.ssh/config; potato-queue only adds what must always hold.
BatchMode=yes turns a password prompt into an error at once (SSH-2), and
ExitOnForwardFailure=yes turns a refused reverse forward into an exit instead
of a session with no tunnel. A multiplexed master (ControlMaster) keeps the
second connection of a run to one round trip; its socket lives in a folder of
ours, 0700, never in /tmp.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from potato_queue.errors import PotatoQueueError

__all__ = [
    "ALWAYS_OPTIONS",
    "SshTarget",
    "SshFailed",
    "remote_shell",
    "ssh_argv",
    "control_argv",
    "ssh_failure",
    "run_ssh",
]

# Options every ssh potato-queue starts carries, whatever ~/.ssh/config says.
ALWAYS_OPTIONS: tuple[str, ...] = (
    "BatchMode=yes",
    "ExitOnForwardFailure=yes",
    # A dead network is noticed in about a minute even while the session is busy.
    "ServerAliveInterval=15",
    "ServerAliveCountMax=4",
    "ConnectTimeout=20",
    # AES-GCM first where both ends have it: with AES-NI it moves ~1.6x what the default
    # chacha20-poly1305 does per core (the model files and the bundle cross the session; P5).
    "Ciphers=^aes128-gcm@openssh.com,aes256-gcm@openssh.com",
)
CONTROL_PERSIST_S = 60


@dataclass(frozen=True)
class SshTarget:
    """Where ssh goes: `host` is anything ssh accepts (an alias from ~/.ssh/config works).

    `config_file` is ssh's -F (an admin's own file, or a test's); `control_dir` is the folder for the
    multiplexing master's socket (None: no multiplexing).
    """

    host: str
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    config_file: str | None = None
    control_dir: str | None = None

    @classmethod
    def of(cls, backend: Any, config_file: str | None = None, control_dir: str | None = None) -> SshTarget:
        """The target of an ssh or slurm backend's config model."""
        return cls(backend.host, backend.user, backend.port, backend.identity_file, config_file, control_dir)

    def options(self) -> list[str]:
        """The flags that pick the account, port, key and config, then ALWAYS_OPTIONS."""
        flags: list[str] = []
        if self.config_file:
            flags += ["-F", self.config_file]
        if self.user:
            flags += ["-l", self.user]
        if self.port:
            flags += ["-p", str(self.port)]
        if self.identity_file:
            flags += ["-i", self.identity_file]
        for option in ALWAYS_OPTIONS:
            flags += ["-o", option]
        if self.control_dir:
            # %C: a hash of host, port and user, so the path stays short (a unix socket's is <108 bytes).
            flags += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C",
                      "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
        return flags


class SshFailed(PotatoQueueError):
    """ssh itself failed (exit 255): the host refused us, could not be reached, or refused a forward."""


def remote_shell(argv: Sequence[str]) -> str:
    """One command line for the remote login shell, each word quoted (sshd hands it to `sh -c`)."""
    return " ".join(shlex.quote(word) for word in argv)


def ssh_argv(target: SshTarget, command: Sequence[str], forward: tuple[str, str] | None = None,
             no_command: bool = False) -> list[str]:
    """`ssh` running `command` on the target; `forward` is (remote unix socket, local host:port or socket)
    for a reverse forward (-R). The command is quoted for the remote shell; a token never goes in it."""
    argv = ["ssh", *target.options()]
    if forward is not None:
        remote_socket, local = forward
        argv += ["-R", f"{remote_socket}:{local}"]
    if no_command:
        argv.append("-N")
    argv += ["--", target.host]
    if command:
        argv.append(remote_shell(command))
    return argv


def control_argv(target: SshTarget, operation: str) -> list[str]:
    """`ssh -O check|exit` for the target's multiplexing master."""
    return ["ssh", *target.options(), "-O", operation, "--", target.host]


_CAUSES: tuple[tuple[str, str, str], ...] = (
    ("Permission denied", "Permission denied",
     "potato-queue logs in without a prompt (BatchMode): put this account's public key in {host}'s "
     "~/.ssh/authorized_keys, or load a key that has a passphrase into ssh-agent (ssh-add) for the "
     "server's account; `ssh {host} true` must then work without asking anything"),
    ("Host key verification failed", "its host key is not known or has changed",
     "run `ssh {host} true` once as the server's account and check the key it shows, or add the key "
     "to ~/.ssh/known_hosts"),
    ("Could not resolve hostname", "the host name does not resolve",
     "check `host` in the backend (an alias must be in ~/.ssh/config of the server's account)"),
    ("Connection refused", "Connection refused",
     "check `host` and `port`: nothing accepts ssh connections there"),
    ("timed out", "the connection timed out",
     "check that {host} is up and reachable from this server (a VPN, a firewall)"),
    ("No route to host", "No route to host",
     "check that {host} is up and reachable from this server (a VPN, a firewall)"),
    ("forwarding failed", "the host refused to forward the run's socket",
     "allow it in {host}'s sshd_config (AllowStreamLocalForwarding yes) or ask its admin"),
)


def ssh_failure(host: str, stderr: str) -> SshFailed:
    """The error for an ssh that exited 255, from what it printed (ERR-1 and its neighbours)."""
    for needle, what, fix in _CAUSES:
        if needle.lower() in stderr.lower():
            return SshFailed(f"ssh to {host} failed: {what}", fix=fix.format(host=host))
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "ssh exited with 255 and printed nothing"
    return SshFailed(f"ssh to {host} failed: {last}", fix=f"check that `ssh {host} true` works for this account")


def run_ssh(target: SshTarget, command: Sequence[str], stdin: bytes = b"", timeout_s: float = 60) -> str:
    """Run `command` on the target and return its stdout; SshFailed when ssh itself failed,
    PotatoQueueError when the command did. `stdin` is where secrets go (never argv)."""
    argv = ssh_argv(target, command)
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SshFailed(f"ssh to {target.host} failed: no answer in {timeout_s:g} s",
                        fix=f"check that `ssh {target.host} true` answers quickly") from None
    stderr = done.stderr.decode(errors="replace")
    if done.returncode == 255:
        raise ssh_failure(target.host, stderr)
    if done.returncode != 0:
        tail = stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise PotatoQueueError(f"{remote_shell(command)} failed on {target.host}: {tail[0]}")
    return done.stdout.decode(errors="replace")
