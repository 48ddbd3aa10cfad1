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

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from potato_queue.errors import PotatoQueueError

__all__ = [
    "RemoteBackend",
    "ALWAYS_OPTIONS",
    "SshTarget",
    "SshFailed",
    "RemoteFailed",
    "remote_shell",
    "missing_program",
    "run_script",
    "cancel_forward_argv",
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


class RemoteBackend(Protocol):
    """What the ssh transport reads of a backend reached by ssh (config.py's ssh and slurm models)."""

    @property
    def host(self) -> str: ...
    @property
    def user(self) -> str | None: ...
    @property
    def port(self) -> int | None: ...
    @property
    def identity_file(self) -> str | None: ...
    @property
    def python(self) -> str: ...
    @property
    def remote_dir(self) -> str: ...
    @property
    def env(self) -> dict[str, str]: ...
    @property
    def secret_env(self) -> list[str]: ...
    @property
    def max_artifact_mb(self) -> float: ...
    @property
    def fetch_artifacts(self) -> bool: ...
    @property
    def keep_remote(self) -> bool: ...
    @property
    def setup_timeout_s(self) -> float: ...


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
    def of(cls, backend: RemoteBackend, config_file: str | None = None, control_dir: str | None = None) -> SshTarget:
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
            flags += [
                "-o",
                "ControlMaster=auto",
                "-o",
                f"ControlPath={self.control_dir}/%C",
                "-o",
                f"ControlPersist={CONTROL_PERSIST_S}",
            ]
        return flags


class SshFailed(PotatoQueueError):
    """ssh itself failed (exit 255): the host refused us, could not be reached, or refused a forward."""


class RemoteFailed(PotatoQueueError):
    """The remote command ran and failed: its exit code and what it printed."""

    def __init__(self, message: str, exit_code: int, stdout: str, stderr: str) -> None:
        super().__init__(message)
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr


# A word every login shell reads as itself: bare, or in single quotes. sshd hands the command to the account's
# shell, which may be csh (no newline in quotes, `!` expanded in them) or fish (`\\` and `\'` are escapes in them).
_BARE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_QUOTABLE_WORD = re.compile(r"[^'!$`\\\n\r]*")


def remote_shell(argv: Sequence[str]) -> str:
    """One command line that sh, bash, dash, zsh, ksh, csh, tcsh and fish all run as these words; ValueError
    for a word no quoting carries through all of them (such text goes on stdin: run_script, stage.py)."""
    words = []
    for word in argv:
        if _BARE_WORD.fullmatch(word):
            words.append(word)
        elif _QUOTABLE_WORD.fullmatch(word):
            words.append(f"'{word}'")
        else:
            raise ValueError(f"{word!r} cannot pass through every login shell (a newline, a quote, !, $, ` or \\)")
    return " ".join(words)


_SHELL_SAYS = re.compile(r"^(?:E: )?(sh|dash|bash|zsh|ksh|mksh|tcsh|csh|fish)\b")


def missing_program(stderr: str, program: str) -> bool:
    """Whether a login shell said `program` does not exist (each says it its own way; tcsh exits 1, not 127)."""
    said = ("not found", "No such file", "no such file", "Unknown command", "Command not found")
    return any(program in line and any(words in line for words in said) for line in stderr.splitlines())


def shell_failure(host: str, stderr: str) -> str:
    """The fix for a command the account's login shell failed on before our program ran."""
    shells = [found.group(1) for line in stderr.splitlines() if (found := _SHELL_SAYS.match(line.strip()))]
    shell = f"({shells[0]}, from its message) " if shells else ""
    return (
        f"the account's login shell on {host} {shell}failed before potato-queue's command ran; its commands run "
        "the same in sh, bash, dash, zsh, ksh, csh, tcsh and fish, so look at that shell's start-up files "
        "(~/.bashrc, ~/.zshenv, ~/.cshrc, ~/.config/fish/config.fish) for a command that fails without a terminal, "
        f"and `getent passwd $USER` on {host} for the shell itself (not /sbin/nologin)"
    )


def ssh_argv(
    target: SshTarget, command: Sequence[str], forward: tuple[str, str] | None = None, no_command: bool = False
) -> list[str]:
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


def cancel_forward_argv(target: SshTarget, forward: tuple[str, str]) -> list[str]:
    """`ssh -O cancel -R ...`: a forward a run asked through a master the admin opened (a second-factor login)
    stays in that master's sshd until the master exits, unless cancelled."""
    remote_socket, local = forward
    return ["ssh", *target.options(), "-O", "cancel", "-R", f"{remote_socket}:{local}", "--", target.host]


# A login that needs more than the key (a one-time code) cannot be typed in by a queue: a master the admin opens by
# hand carries the runs for ControlPersist (docs/backends/ssh.md has the config).
SECOND_FACTOR_FIX = (
    "log in once by hand through a ControlMaster that stays open (`ssh -o ControlMaster=yes -o "
    "ControlPersist=8h -o ControlPath=~/.ssh/cm-%C -fN {host}` as the server's account, typing the "
    "code), with the same ControlPath for {host} in ~/.ssh/config: potato-queue's ssh then goes "
    "through that master"
)
# Every sshd setting that refuses a run's forward (AllowTcpForwarding no also refuses unix-socket forwards).
FORWARD_SETTINGS = "AllowTcpForwarding, AllowStreamLocalForwarding, DisableForwarding"
FORWARD_FIX = (
    "{host}'s sshd_config refuses forwarding (one of AllowTcpForwarding no, AllowStreamLocalForwarding no, "
    "DisableForwarding yes, or a Match block or authorized_keys restrict/no-port-forwarding for this account); "
    "runs carry the agent's protocol over the ssh session itself instead, or ask its admin to allow "
    "AllowStreamLocalForwarding for this account"
)

_CAUSES: tuple[tuple[str, str, str], ...] = (
    (
        "Permission denied",
        "Permission denied",
        "potato-queue logs in without a prompt (BatchMode): put this account's public key in {host}'s "
        "~/.ssh/authorized_keys, or load a key that has a passphrase into ssh-agent (ssh-add) for the "
        "server's account; `ssh {host} true` must then work without asking anything",
    ),
    (
        "Host key verification failed",
        "its host key is not known or has changed",
        "run `ssh {host} true` once as the server's account and check the key it shows, or add the key "
        "to ~/.ssh/known_hosts",
    ),
    (
        "Could not resolve hostname",
        "the host name does not resolve",
        "check `host` in the backend (an alias must be in ~/.ssh/config of the server's account)",
    ),
    ("Connection refused", "Connection refused", "check `host` and `port`: nothing accepts ssh connections there"),
    (
        "timed out",
        "the connection timed out",
        "check that {host} is up and reachable from this server (a VPN, a firewall)",
    ),
    (
        "No route to host",
        "No route to host",
        "check that {host} is up and reachable from this server (a VPN, a firewall)",
    ),
    ("forwarding failed", "the host refused to forward the run's socket", FORWARD_FIX),
)


# "Permission denied (methods)": the methods still wanted. Without publickey among them, the key was not the
# problem: the host wants a password or a code too.
_DENIED_METHODS = re.compile(r"Permission denied \(([a-z,-]+)\)")


def ssh_failure(host: str, stderr: str) -> SshFailed:
    """The error for an ssh that exited 255, from what it printed (ERR-1 and its neighbours)."""
    denied = _DENIED_METHODS.search(stderr)
    if denied and "publickey" not in denied.group(1).split(","):
        return SshFailed(
            f"ssh to {host} failed: the host asks for {denied.group(1)} besides the key (a second factor), "
            "which a queue cannot type",
            fix=SECOND_FACTOR_FIX.format(host=host),
        )
    for needle, what, fix in _CAUSES:
        if needle.lower() in stderr.lower():
            return SshFailed(f"ssh to {host} failed: {what}", fix=fix.format(host=host))
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "ssh exited with 255 and printed nothing"
    return SshFailed(f"ssh to {host} failed: {last}", fix=f"check that `ssh {host} true` works for this account")


def run_script(target: SshTarget, script: str, timeout_s: float = 60) -> str:
    """A POSIX sh script run on the target whatever the account's login shell: `sh -s` with the script on stdin."""
    return run_ssh(target, ["sh", "-s"], stdin=script.encode(), timeout_s=timeout_s)


def run_ssh(
    target: SshTarget,
    command: Sequence[str],
    stdin: bytes = b"",
    timeout_s: float = 60,
    forward: tuple[str, str] | None = None,
) -> str:
    """Run `command` on the target and return its stdout; SshFailed when ssh itself failed,
    RemoteFailed when the command did. `stdin` is where secrets go (never argv)."""
    argv = ssh_argv(target, command, forward=forward)
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SshFailed(
            f"ssh to {target.host} failed: no answer in {timeout_s:g} s",
            fix=f"check that `ssh {target.host} true` answers quickly",
        ) from None
    stderr = done.stderr.decode(errors="replace")
    if done.returncode == 255:
        raise ssh_failure(target.host, stderr)
    if done.returncode != 0:
        tail = stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        shown = " ".join(word if len(word) < 80 else word[:40] + "..." for word in command)
        raise RemoteFailed(
            f"{shown} failed on {target.host}: {tail[0]}", done.returncode, done.stdout.decode(errors="replace"), stderr
        )
    return done.stdout.decode(errors="replace")
