"""agent/drain.py in process (issue 51): the pid file's line, who holds a flock as /proc/locks says, the
agent's lock on DIR/agent.pid, and `--drain`'s refusals of a file no agent (or another one) holds. Nothing
here signals anything: every case is one that must not."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from potato_queue.agent.drain import PidFile, drain_main, flock_holders, parse_pid_line

pytestmark = pytest.mark.unit

# /proc/locks as Linux writes it: a flock held on inode 1311 by pid 4242, a POSIX lock on the same inode by
# pid 77, a waiter for the flock (pid 99, `->`), an OFD lock (pid -1) and another file's flock.
LOCKS = """\
1: FLOCK  ADVISORY  WRITE 4242 fd:01:1311 0 EOF
1: -> FLOCK  ADVISORY  WRITE 99 fd:01:1311 0 EOF
2: POSIX  ADVISORY  WRITE 77 fd:01:1311 0 EOF
3: OFDLCK ADVISORY  READ  -1 00:19:1311 0 EOF
4: FLOCK  ADVISORY  READ  555 08:02:2024 0 EOF
5: FLOCK  ADVISORY  WRITE 0 fd:01:1311 0 EOF
garbage line
6: FLOCK  ADVISORY  WRITE x fd:01:1311 0 EOF
"""


def test_the_holder_of_a_flock_is_its_flock_line_on_that_inode() -> None:
    assert flock_holders(LOCKS, 1311) == [4242]  # not the waiter, the POSIX or OFD lock, nor pid 0
    assert flock_holders(LOCKS, 2024) == [555]
    assert flock_holders(LOCKS, 1) == []
    assert flock_holders("", 1311) == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4242 lab\n", (4242, "lab")),
        ("4242 lab", (4242, "lab")),
        ("4242\n", (4242, "")),
        ("", None),
        ("lab 4242\n", None),
        ("0 lab\n", None),  # os.kill(0, ...) signals our own process group
        ("-1 lab\n", None),  # os.kill(-1, ...) signals every process of the account
        ("+5 lab\n", None),
    ],
)
def test_a_pid_line(text: str, expected: tuple[int, str] | None) -> None:
    assert parse_pid_line(text) == expected


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/locks is Linux's")
def test_proc_locks_shows_the_agents_lock_as_its_pid_on_the_files_inode(tmp_path: Path) -> None:
    held = PidFile(str(tmp_path), print)
    assert held.hold("lab")
    try:
        assert held.fd is not None
        locks = Path("/proc/locks").read_text()
        assert flock_holders(locks, os.fstat(held.fd).st_ino) == [os.getpid()]
    finally:
        held.release()


def test_a_second_holder_serves_on_without_the_file_and_says_how_to_drain_it(tmp_path: Path) -> None:
    first = PidFile(str(tmp_path), print)
    lines: list[str] = []
    pid_file = tmp_path / "agent.pid"
    assert first.hold("lab")
    try:
        second = PidFile(str(tmp_path), lines.append)  # another open of the file: flock sees another holder
        assert not second.hold("lab") and second.fd is None
        me = os.getpid()
        assert lines == [
            f"another agent serves from {tmp_path} ({pid_file} is locked): --drain --workdir {tmp_path} reaches "
            f"that one (pid {me}); this one drains with kill -USR1 {me}"
        ]
        second.release()  # holds nothing: the file stays the first's
        assert pid_file.read_text() == f"{me} lab\n"
    finally:
        first.release()
    assert not pid_file.exists()


def test_the_agent_replaces_a_stale_line_and_removes_only_the_file_it_locked(tmp_path: Path) -> None:
    pid_file = tmp_path / "agent.pid"
    pid_file.write_text("99999999 someone-else-and-a-long-line\n")
    held = PidFile(str(tmp_path), print)
    assert held.hold("lab")
    assert pid_file.read_text() == f"{os.getpid()} lab\n"
    pid_file.unlink()
    pid_file.write_text("1234 next\n")  # another agent's file since: not ours to remove
    held.release()
    assert pid_file.read_text() == "1234 next\n"


def test_a_linked_pid_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (tmp_path / "agent.pid").symlink_to(target)
    lines: list[str] = []
    assert not PidFile(str(tmp_path), lines.append).hold("lab")
    assert target.read_text() == "keep\n" and "cannot be held" in lines[0] and "kill -USR1" in lines[0]


def drain(workdir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = drain_main(["--drain", "--workdir", str(workdir)], "potato-queue training agent", "~/unused")
    return code, capsys.readouterr().out.strip()


def test_drain_refuses_a_pid_file_no_agent_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pid_file = tmp_path / "agent.pid"
    pid_file.write_text(f"{os.getppid()} lab\n")  # a live process of this account, not an agent
    assert drain(tmp_path, capsys) == (
        1,
        f"{pid_file} names pid {os.getppid()}, but no agent holds it: the file is stale or forged (its agent is "
        f"gone, or never wrote it); nothing signalled; fix: remove {pid_file}, and give --workdir the folder a "
        "running agent was started with",
    )


def test_drain_refuses_what_is_not_a_pid_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pid_file = tmp_path / "agent.pid"
    pid_file.write_text("-1 lab\n")
    assert drain(tmp_path, capsys) == (
        1,
        f"{pid_file} does not hold an agent's `<pid> <backend>`: nothing signalled; fix: give --workdir the "
        "folder the agent was started with",
    )
    pid_file.unlink()
    assert drain(tmp_path, capsys) == (
        1,
        f"no agent serves from {tmp_path} (no agent.pid there); fix: give --workdir the folder the agent was "
        "started with",
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/locks is Linux's")
def test_drain_refuses_a_held_file_that_names_another_pid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    held = PidFile(str(tmp_path), print)
    assert held.hold("lab")
    try:
        assert held.fd is not None
        os.pwrite(held.fd, f"{os.getppid()} lab\n".encode(), 0)  # rewritten by someone after the agent wrote it
        me, pid_file = os.getpid(), tmp_path / "agent.pid"
        assert drain(tmp_path, capsys) == (
            1,
            f"{pid_file} names pid {os.getppid()}, but pid {me} holds it: the file was rewritten; nothing "
            f"signalled; fix: kill -USR1 {me} drains the agent that holds it",
        )
    finally:
        held.release()
