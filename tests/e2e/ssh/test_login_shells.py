"""Hosts as users have them, for the ssh backend: every login shell, chatty logins, sshd that refuses
forwarding, a second factor after the key.

All real: one sshd on 127.0.0.1 (tests/sshd.py) with one account per login shell (Debian's sh, dash, bash,
zsh, ksh, tcsh, csh, fish), accounts whose sshd settings refuse every forward (`Match User` blocks), and
one that wants a password after its key (sshpass types it into a master opened by hand, standing for the
person who types a one-time code). One server and executor for the module reach them all, one backend
per account. No GPU is asked for (`gpus: none`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.lifecycle_helpers import TERMINAL, Services, run_paths, started, wait_running
from tests.sshd import Sshd, account

SHELLS = {
    "sh": "/bin/sh",
    "dash": "/usr/bin/dash",
    "bash": "/bin/bash",
    "zsh": "/usr/bin/zsh",
    "ksh": "/usr/bin/ksh",
    "tcsh": "/usr/bin/tcsh",
    "csh": "/usr/bin/csh",
    "fish": "/usr/bin/fish",
}
# A banner before the interactive guard of ~/.bashrc (as a careless conda or module init prints), and in
# ~/.cshrc, which has no guard at all.
BANNER = "Welcome to gpu01"
CHATTY = {
    "bash": (".bashrc", f'echo "{BANNER}"\ncase $- in *i*) ;; *) return;; esac\n'),
    "tcsh": (".cshrc", f'echo "{BANNER}"\n'),
}
NO_FORWARDS = {
    "pqnofwd-tcp": "AllowTcpForwarding no",
    "pqnofwd-unix": "AllowStreamLocalForwarding no",
    "pqnofwd-all": "DisableForwarding yes",
}
SECOND_FACTOR_USER, CODE = "pq2fa", "code-424242"


def shell_user(shell: str) -> str:
    return account(f"pqsh-{shell}")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    blocks = {account(user): [setting] for user, setting in NO_FORWARDS.items()}
    blocks[account(SECOND_FACTOR_USER)] = ["PasswordAuthentication yes", "AuthenticationMethods publickey,password"]
    sshd = Sshd(tmp_path_factory.mktemp("hosts"), match_blocks=blocks)
    try:
        for shell, path in SHELLS.items():
            user = sshd.add_user(f"pqsh-{shell}", shell=path)
            sshd.authorize(user, sshd.key)
            if shell in CHATTY:
                name, text = CHATTY[shell]
                rc = Path(f"/home/{user}") / name
                rc.write_text(text)
                subprocess.run(["chown", f"{user}:", str(rc)], check=True)
        for user in [*NO_FORWARDS, SECOND_FACTOR_USER]:
            sshd.authorize(
                sshd.add_user(user, shell="/bin/bash", password=CODE if user == SECOND_FACTOR_USER else None), sshd.key
            )
        yield sshd
    finally:
        sshd.close()


def alias(user: str) -> str:
    return f"{user}-host"


@pytest.fixture(scope="module")
def svc(hosts: Sshd, tmp_path_factory: pytest.TempPathFactory, redis_server_url: str) -> Iterator[Services]:
    tmp = tmp_path_factory.mktemp("shells")
    users = [shell_user(shell) for shell in SHELLS] + [account(user) for user in [*NO_FORWARDS, SECOND_FACTOR_USER]]
    # A short folder: ssh's master socket is ControlPath plus 17 characters, within a unix socket's 108.
    control = Path(tempfile.mkdtemp(prefix="pq-cm-"))
    config = hosts.aliases(
        "ssh_config.shells",
        {
            alias(user): {
                "User": user,
                **({"ControlPath": f"{control}/%C"} if user == account(SECOND_FACTOR_USER) else {}),
            }
            for user in users
        },
    )
    backends = {
        user: {"type": "ssh", "host": alias(user), "python": "/usr/bin/python3", "gpus": "none"} for user in users
    }
    try:
        with started(tmp, redis_server_url, executors=0, backends=backends) as services:
            services.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(config)})
            services.ssh_config = config  # type: ignore[attr-defined]
            yield services
    finally:
        shutil.rmtree(control, ignore_errors=True)


def check(svc: Services, backend: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "training",
        "check",
        backend,
        svc.config,
        *extra,
        env={"POTATO_QUEUE_SSH_CONFIG": str(svc.ssh_config)},
        timeout_s=120,
    )  # type: ignore[attr-defined]


def processes_of(user: str, timeout_s: float = 15) -> list[str]:
    """The account's processes still there once they had timeout_s to end."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = subprocess.run(["pgrep", "-a", "-u", user], capture_output=True, text=True).stdout.splitlines()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def assert_nothing_left(user: str, run_id: str) -> None:
    assert processes_of(user) == []
    assert list(Path("/tmp").glob(f"potato-queue-{run_id}-*.sock")) == []
    jobs = Path(f"/home/{user}/.cache/potato-training/jobs")
    assert not jobs.exists() or list(jobs.iterdir()) == [], list(jobs.iterdir())


def run_with_model_back(svc: Services, backend: str) -> tuple[str, dict[str, Any]]:
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=backend)
    run = svc.wait_for(run_id, TERMINAL, 120)
    assert run["state"] == "succeeded", (run, run_paths(svc, run_id).run_log.read_text())
    artifacts = run_paths(svc, run_id).artifacts
    assert run["artifact_uri"] == str(artifacts) and any(artifacts.iterdir()), "the model files came back"
    return run_id, run


@pytest.mark.parametrize("shell", list(SHELLS))
def test_every_login_shell_checks_runs_brings_the_model_back_and_cancels(svc: Services, shell: str) -> None:
    user = shell_user(shell)
    done = check(svc, user)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"transport: a reverse forward of the run's socket ({alias(user)}'s sshd allows it)" in done.stdout
    run_id, _ = run_with_model_back(svc, user)
    log = run_paths(svc, run_id).run_log.read_text()
    banner_line = f'{alias(user)}\'s shell start-up prints "{BANNER}" for non-interactive commands'
    if shell in CHATTY:  # said, with the fix, in both; and the run still succeeded
        assert banner_line in done.stdout and banner_line in log, (done.stdout, log)
        assert "Fix: print only in interactive shells" in log
    else:
        assert "shell start-up prints" not in done.stdout + log
    assert_nothing_left(user, run_id)
    held = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=user, params={"hold_s": 60})
    wait_running(svc, held)
    svc.api("POST", f"/runs/{held}/cancel")
    assert svc.wait_for(held, TERMINAL, 60)["state"] == "cancelled"
    assert_nothing_left(user, held)


@pytest.mark.parametrize("user", list(NO_FORWARDS))
def test_an_sshd_that_refuses_forwarding_still_runs_over_the_session_and_check_says_so(
    svc: Services, user: str
) -> None:
    user = account(user)
    done = check(svc, user)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"transport: over the ssh session itself ({alias(user)}'s sshd refuses forwarding: one of AllowTcpForwarding, "
        "AllowStreamLocalForwarding, DisableForwarding); runs work" in done.stdout
    ), done.stdout
    assert json.loads(check(svc, user, "--json").stdout)["transport"] == "session"
    run_id, run = run_with_model_back(svc, user)
    log = run_paths(svc, run_id).run_log.read_text()
    assert f"{alias(user)}'s sshd refuses forwarding" in log and "goes over the ssh session itself" in log
    assert run["held_out"]["sentiment"]["test"]["accuracy"] is not None, "the agent's HTTP crossed the session"
    assert_nothing_left(user, run_id)


def test_a_second_factor_login_fails_with_the_master_fix_and_runs_through_a_master_opened_by_hand(
    svc: Services, tmp_path: Path
) -> None:
    user, config = account(SECOND_FACTOR_USER), str(svc.ssh_config)  # type: ignore[attr-defined]
    refused = check(svc, user)
    assert refused.returncode == 1
    assert (
        f"ssh to {alias(user)} failed: the host asks for password besides the key (a second factor)" in refused.stdout
    )
    assert "ControlMaster" in refused.stdout and "ControlPersist" in refused.stdout, refused.stdout
    # The person, in a terminal of their own: opens a master and types the code (sshpass), as docs/backends/ssh.md
    # shows; it stays open while they work.
    person = subprocess.Popen(
        ["sshpass", "-p", CODE, "ssh", "-F", config, "-o", "ControlMaster=yes", "-N", alias(user)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while subprocess.run(["ssh", "-F", config, "-O", "check", alias(user)], capture_output=True).returncode != 0:
        assert person.poll() is None and time.monotonic() < deadline, person.stderr.read() if person.stderr else ""
        time.sleep(0.1)
    try:
        through = check(svc, user)
        assert through.returncode == 0, through.stdout
        run_id, _ = run_with_model_back(svc, user)
        # The run's forward went through the master's sshd; it ends with the run, not with the master.
        listening = subprocess.run(["ss", "-xlp"], capture_output=True, text=True).stdout
        assert f"potato-queue-{run_id}-" not in listening, listening
        assert_nothing_left_but_the_master(user, run_id)
    finally:
        subprocess.run(["ssh", "-F", config, "-O", "exit", alias(user)], capture_output=True, timeout=30)
        person.wait(timeout=30)


def assert_nothing_left_but_the_master(user: str, run_id: str) -> None:
    left = [line for line in processes_of(user, timeout_s=5) if "sshd" not in line]
    assert left == []
    assert list(Path("/tmp").glob(f"potato-queue-{run_id}-*.sock")) == []
