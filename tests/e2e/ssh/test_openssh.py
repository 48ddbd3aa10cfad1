"""ssh command lines (pure, fast) and the same lines against a real sshd on 127.0.0.1 (tests/sshd.py)."""

from __future__ import annotations

import http.server
import os
import secrets
import subprocess
import threading
import time
from pathlib import Path

import pytest

from potato_queue.errors import PotatoQueueError
from potato_queue.executors.remote.openssh import (
    SshFailed,
    SshTarget,
    control_argv,
    missing_program,
    remote_shell,
    run_ssh,
    ssh_argv,
    ssh_failure,
)
from potato_queue.executors.remote.stage import banner_note, new_marker, split_banner, stage_argv, stage_input
from tests.sshd import ALIAS, Sshd


# -- pure: the command lines ------------------------------------------------------------------
def options_of(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == "-o"]


def test_every_ssh_runs_in_batch_mode_and_exits_when_a_forward_fails() -> None:
    argv = ssh_argv(SshTarget("gpu.example.org"), ["true"])
    assert argv[0] == "ssh" and argv[-2:] == ["gpu.example.org", "true"] and argv[-3] == "--"
    assert {"BatchMode=yes", "ExitOnForwardFailure=yes"} <= set(options_of(argv))
    assert not [o for o in options_of(argv) if o.startswith("Control")], "no multiplexing unless asked"


def test_user_port_and_identity_become_l_p_and_i() -> None:
    argv = ssh_argv(
        SshTarget("gpu", user="ana", port=2222, identity_file="~/.ssh/lab", config_file="/etc/pq/ssh"), ["true"]
    )
    head = argv[: argv.index("-o")]
    assert head == ["ssh", "-F", "/etc/pq/ssh", "-l", "ana", "-p", "2222", "-i", "~/.ssh/lab"]


LOGIN_SHELLS = ["sh", "dash", "bash", "zsh", "ksh", "mksh", "tcsh", "csh", "fish"]


@pytest.mark.parametrize("shell", LOGIN_SHELLS)
def test_the_remote_command_is_the_same_words_in_every_login_shell(shell: str) -> None:
    """sshd runs the command as `<login shell> -c <command>`; each real shell here must give back our words."""
    words = [
        "python3",
        "-c",
        'import a; print("x y") or (lambda: {1: [2]})()',
        "potato-queue-0123456789abcdef",
        "/home/ana/gpu run/python",
        "a;b|c&d>e<f*g?h~i#j",
        "--",
    ]
    argv = ssh_argv(SshTarget("gpu"), words)
    assert argv[-1] == remote_shell(words)
    printed = subprocess.run([shell, "-c", f"printf '%s\\n' {argv[-1]}"], capture_output=True, text=True, check=True)
    assert printed.stdout.splitlines() == words


@pytest.mark.parametrize("word", ["it's", "a\nb", "echo !!", "$HOME", "`id`", "a\\b"])
def test_a_word_no_quoting_carries_through_every_shell_is_refused_not_mangled(word: str) -> None:
    with pytest.raises(ValueError, match="cannot pass through every login shell"):
        remote_shell(["echo", word])


@pytest.mark.parametrize("shell", LOGIN_SHELLS)
def test_the_first_stage_runs_the_program_from_stdin_after_its_marker_in_every_shell(shell: str) -> None:
    marker = new_marker()
    program = 'import os, sys\nprint("pid", os.getpid() > 0, sys.stdin.readline().strip())\n'
    command = remote_shell(stage_argv("/usr/bin/python3", marker))
    done = subprocess.run(
        [shell, "-c", f"echo Welcome to gpu01; {command}"],
        input=stage_input(program) + b"the rest of stdin\n",
        capture_output=True,
        check=True,
    )
    assert split_banner(done.stdout.decode(), marker) == ("Welcome to gpu01\n", "pid True the rest of stdin\n")


def test_a_banner_is_said_once_with_how_to_silence_it() -> None:
    note = banner_note("gpu01", "\nWelcome to gpu01\nmodule: loaded cuda/12\n")
    assert note is not None and note.startswith(
        'gpu01\'s shell start-up prints "Welcome to gpu01" (and 1 more line(s)) for non-interactive commands'
    )
    assert "~/.bashrc" in note and "~/.cshrc" in note and "status is-interactive" in note
    assert banner_note("gpu01", "\n  \n") is None
    assert "\x1b" not in (banner_note("gpu01", "\x1b[31mred\n") or ""), "a host's text forges no terminal codes"


def test_a_missing_interpreter_is_recognised_in_every_shells_words() -> None:
    said = {
        "sh": "sh: 1: /opt/py: not found",
        "bash": "bash: line 1: /opt/py: No such file or directory",
        "zsh": "zsh:1: no such file or directory: /opt/py",
        "tcsh": "/opt/py: Command not found.",
        "fish": "fish: Unknown command: /opt/py",
        "mksh": "E: mksh: /opt/py: inaccessible or not found",
    }
    assert all(missing_program(text, "/opt/py") for text in said.values())
    assert not missing_program("Traceback ...\nModuleNotFoundError: No module named 'x' not found", "/opt/py")


def test_a_reverse_forward_of_a_unix_socket_and_multiplexing() -> None:
    target = SshTarget("gpu", control_dir="/root/.cache/potato-queue/ssh")
    argv = ssh_argv(target, ["cat"], forward=("/tmp/pq-run.sock", "127.0.0.1:8000"))
    assert argv[argv.index("-R") + 1] == "/tmp/pq-run.sock:127.0.0.1:8000"
    assert "ControlPath=/root/.cache/potato-queue/ssh/%C" in options_of(argv)
    assert control_argv(target, "exit")[-4:] == ["-O", "exit", "--", "gpu"]
    assert "-N" in ssh_argv(target, [], no_command=True)


def test_ssh_failures_say_what_and_the_fix() -> None:
    denied = ssh_failure("gpu", "ana@gpu: Permission denied (publickey).\r\n")
    assert denied.message == "ssh to gpu failed: Permission denied"  # ERR-1
    assert "ssh-agent" in (denied.fix or "") and "authorized_keys" in (denied.fix or "")
    assert ssh_failure("gpu", "Host key verification failed.").message == (
        "ssh to gpu failed: its host key is not known or has changed"
    )
    assert ssh_failure("gpu", "ssh: Could not resolve hostname gpu: Name or service not known").message == (
        "ssh to gpu failed: the host name does not resolve"
    )
    assert ssh_failure("gpu", "Error: remote port forwarding failed for listen path /tmp/x").message == (
        "ssh to gpu failed: the host refused to forward the run's socket"
    )
    forwards = ssh_failure("gpu", "Error: remote port forwarding failed for listen path /tmp/x")
    assert all(
        setting in (forwards.fix or "")
        for setting in ("AllowTcpForwarding no", "AllowStreamLocalForwarding no", "DisableForwarding yes")
    ), forwards.fix
    second = ssh_failure("gpu", "ana@gpu: Permission denied (keyboard-interactive).\r\n")
    assert second.message == (
        "ssh to gpu failed: the host asks for keyboard-interactive besides the key (a second "
        "factor), which a queue cannot type"
    )
    assert "ControlMaster=yes" in (second.fix or "") and "ControlPersist" in (second.fix or "")
    assert ssh_failure("gpu", "ana@gpu: Permission denied (publickey,password).").message == (
        "ssh to gpu failed: Permission denied"
    ), "the key itself was refused: ERR-1"
    assert ssh_failure("gpu", "kex_exchange_identification: read: Connection reset by peer\n").message == (
        "ssh to gpu failed: kex_exchange_identification: read: Connection reset by peer"
    )


# -- against a real sshd ----------------------------------------------------------------------
def test_a_host_alias_from_an_ssh_config_works(sshd: Sshd) -> None:
    sshd.write_config("root")
    assert run_ssh(SshTarget(ALIAS, config_file=str(sshd.config)), ["echo", "it works"]) == "it works\n"


def test_an_ordinary_account_logs_in_with_its_key(sshd: Sshd) -> None:
    user = sshd.add_user("pqssh")
    sshd.authorize(user, sshd.key)
    target = SshTarget(ALIAS, user=user, config_file=str(sshd.config))
    assert run_ssh(target, ["id", "-un"]) == f"{user}\n"


def test_an_account_with_no_key_fails_at_once_with_err_1(sshd: Sshd) -> None:
    user = sshd.add_user("pqnokey")  # exists, but no key of ours is authorized for it
    target = SshTarget(ALIAS, user=user, config_file=str(sshd.config))
    with pytest.raises(SshFailed) as failed:
        run_ssh(target, ["true"], timeout_s=20)  # BatchMode: refused, not a prompt waiting 20 s
    assert failed.value.message == f"ssh to {ALIAS} failed: Permission denied"


def test_a_key_with_a_passphrase_works_through_ssh_agent(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = sshd.new_key("locked", passphrase="open sesame")
    sshd.authorize("root", key)
    sshd.write_config("root", key)
    target = SshTarget(ALIAS, config_file=str(sshd.config))
    try:
        with pytest.raises(SshFailed, match="Permission denied"):
            run_ssh(target, ["true"], timeout_s=20)  # the key is locked and nothing may ask for it
        agent_socket = tmp_path / "agent.sock"
        agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(agent_socket)], stdout=subprocess.DEVNULL)
        try:
            askpass = tmp_path / "askpass"
            askpass.write_text("#!/bin/sh\necho 'open sesame'\n")
            askpass.chmod(0o700)
            while not agent_socket.exists():
                time.sleep(0.01)
            env = {
                **os.environ,
                "SSH_AUTH_SOCK": str(agent_socket),
                "SSH_ASKPASS": str(askpass),
                "SSH_ASKPASS_REQUIRE": "force",
            }
            subprocess.run(["ssh-add", str(key)], env=env, check=True, capture_output=True)
            monkeypatch.setenv("SSH_AUTH_SOCK", str(agent_socket))
            assert run_ssh(target, ["echo", "unlocked"]) == "unlocked\n"
        finally:
            agent.terminate()
            agent.wait()
    finally:
        sshd.write_config("root")


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: object) -> None:
        pass


def test_the_reverse_forwarded_socket_is_0600_and_only_for_the_login_account(sshd: Sshd) -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    sshd.write_config("root")
    target = SshTarget(ALIAS, config_file=str(sshd.config))
    remote_socket = f"/tmp/pq-test-{secrets.token_hex(6)}.sock"
    session = subprocess.Popen(
        ssh_argv(target, ["sleep", "60"], forward=(remote_socket, f"127.0.0.1:{httpd.server_port}")),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(remote_socket) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert oct(os.stat(remote_socket).st_mode & 0o777) == "0o600"
        fetch = ["curl", "-sS", "--max-time", "5", "--unix-socket", remote_socket, "http://run/"]
        assert run_ssh(target, fetch) == "hello"
        other = sshd.add_user("pqother")
        sshd.authorize(other, sshd.key)
        assert run_ssh(SshTarget(ALIAS, user=other, config_file=str(sshd.config)), ["id", "-un"]) == f"{other}\n"
        with pytest.raises(PotatoQueueError) as refused:  # logged in, but the socket is not theirs
            run_ssh(SshTarget(ALIAS, user=other, config_file=str(sshd.config)), fetch)
        assert not isinstance(refused.value, SshFailed) and "Couldn't connect" in refused.value.message
    finally:
        session.terminate()
        session.wait()
        httpd.shutdown()
        if os.path.exists(remote_socket):
            os.unlink(remote_socket)
