"""A real OpenSSH server on 127.0.0.1 for the ssh backend's tests.

Its own host key, port, authorized keys and pid file, all in a folder the test
made; an ssh config file with an alias (`gpu-test`) for the client side. An
ordinary account made with useradd, with the login shell the test asks for, is
removed again if the harness made it. `match_blocks` make the hosts users
really have, for one account each: sshd settings that refuse forwarding, a
password after the key (a second factor). Nothing is left running: close()
stops sshd and waits for it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from potato_queue.wire.isolated import THREAD_ENV_VARS

SSHD = "/usr/sbin/sshd"
ALIAS = "gpu-test"


def account(name: str) -> str:
    """The machine's account for `name` in this pytest worker: two workers making, using and removing one
    account at once would pull it from under each other (gw1's pqssh is pqssh-gw1)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{name}-{worker}" if worker else name


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_sshd() -> None:
    """Fails (never skips) where the suite cannot run a real sshd: these tests are part of the suite."""
    if not Path(SSHD).exists() or shutil.which("ssh") is None:
        pytest.fail("the ssh backend's tests need OpenSSH: apt-get install openssh-server openssh-client")
    if os.geteuid() != 0:
        pytest.fail("the ssh backend's tests run sshd and log in as other accounts: run them as root")


def thread_pools_line() -> list[str]:
    """The thread pools' sizes this process was given (the suite sets one thread each: tests/conftest.py), for
    the sessions this sshd starts too, as a host's admin would set them (sshd_config's SetEnv)."""
    given = [f"{name}={os.environ[name]}" for name in THREAD_ENV_VARS if os.environ.get(name)]
    return [f"SetEnv {' '.join(given)}"] if given else []


class Sshd:
    def __init__(self, root: Path, match_blocks: dict[str, list[str]] | None = None) -> None:
        """`match_blocks`: sshd_config lines for one account each (`Match User NAME`)."""
        require_sshd()
        self.root = root
        self.match_blocks = match_blocks or {}
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.made_users: list[str] = []
        self.known_hosts = root / "known_hosts"
        self.config = root / "ssh_config"
        self.key = self.new_key("client")
        self.new_key("host_key")
        # sshd reads a user's keys file as that user: the folder must be reachable by every account,
        # which pytest's own tmp (0700) is not.
        self.keys = Path(tempfile.mkdtemp(prefix="pq-sshd-keys-"))
        try:
            self.keys.chmod(0o755)
            self.authorize("root", self.key)
            self.write_config("root")
            self.process = self._start()
        except BaseException:
            shutil.rmtree(self.keys, ignore_errors=True)
            raise

    def new_key(self, name: str, passphrase: str = "") -> Path:
        key = self.root / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(key)], check=True)
        return key

    def _start(self) -> subprocess.Popen[bytes]:
        conf = self.root / "sshd_config"
        conf.write_text(
            "\n".join(
                [
                    "ListenAddress 127.0.0.1",
                    f"Port {self.port}",
                    f"HostKey {self.root / 'host_key'}",
                    f"PidFile {self.root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.keys}/%u",
                    "StrictModes no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    "StreamLocalBindUnlink yes",
                    "AllowStreamLocalForwarding yes",
                    "LogLevel ERROR",
                    "Subsystem sftp internal-sftp",  # scp speaks sftp now
                    *thread_pools_line(),
                    *[line for user, lines in self.match_blocks.items() for line in [f"Match User {user}", *lines]],
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(conf.resolve())], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return process
            if process.poll() is not None:
                raise RuntimeError(f"sshd exited: {process.stderr.read().decode() if process.stderr else ''}")
            time.sleep(0.02)
        process.kill()
        raise RuntimeError("sshd did not listen within 10 s")

    def authorize(self, user: str, key: Path) -> None:
        """`key` may log in as `user` (the keys file is owned by the user, 0600: sshd reads it as them)."""
        path = self.keys / user
        with path.open("a") as fh:
            fh.write(Path(f"{key}.pub").read_text())
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
        path.chmod(0o600)

    def add_user(self, name: str, shell: str = "/bin/sh", password: str | None = None) -> str:
        """An ordinary account with `shell` as its login shell (made with useradd, unlocked for key logins
        under UsePAM no; `password` for a login that asks for one after the key). Its name is
        account(name): the machine's accounts are shared by the suite's workers."""
        name = account(name)
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", shell, name], check=True)
            self.made_users.append(name)
        subprocess.run(["usermod", "-s", shell, "-p", "*", name], check=True)
        if password is not None:
            subprocess.run(["chpasswd"], input=f"{name}:{password}".encode(), check=True)
        return name

    def aliases(self, name: str, hosts: dict[str, dict[str, str]]) -> Path:
        """A client config file `name` with one alias per entry of `hosts` (alias: {"User": ..., more ssh
        options}), all this sshd: one server of the tests' reaches several accounts, each its own host."""
        config = self.root / name
        blocks = []
        for alias, options in hosts.items():
            blocks += [
                f"Host {alias}",
                "  HostName 127.0.0.1",
                f"  Port {self.port}",
                f"  IdentityFile {self.key}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {self.known_hosts}",
                "  StrictHostKeyChecking accept-new",
                *[f"  {key} {value}" for key, value in options.items()],
            ]
        config.write_text("\n".join(blocks + [""]))
        return config

    def write_config(self, user: str, key: Path | None = None) -> Path:
        """The client's config: `gpu-test` is this sshd, as `user` with `key` (the client key by default)."""
        self.config.write_text(
            "\n".join(
                [
                    f"Host {ALIAS}",
                    "  HostName 127.0.0.1",
                    f"  Port {self.port}",
                    f"  User {user}",
                    f"  IdentityFile {key or self.key}",
                    "  IdentitiesOnly yes",
                    f"  UserKnownHostsFile {self.known_hosts}",
                    "  StrictHostKeyChecking accept-new",
                    "",
                ]
            )
        )
        return self.config

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.keys, ignore_errors=True)
        for name in self.made_users:
            subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
