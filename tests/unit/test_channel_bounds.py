"""What a host that writes hostile frames can make the executor's end of the carried channel hold (issue 51).

The host is the test: it writes frames into a pipe standing for the ssh session's stdout and reads what comes
back from one standing for its stdin. The server is a real TCP listener on loopback that accepts and holds
every connection, as a server does whose client has not finished. Threads and sockets are counted in process
(threading.enumerate(), the sockets among /proc/self/fd) before the server starts: the threads are back to
that once the session is over, while the server still holds its ends; the sockets once the server stops.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from potato_queue.executors.remote.carried import AGENT_LOG_MAX_BYTES, MAX_OPEN_CONNECTIONS, carry
from potato_queue.host.channel import CLOSE, HEADER, LOG, OPEN, read_frame

pytestmark = pytest.mark.unit

JOIN_S = 30.0


def open_sockets() -> int:
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}").startswith("socket:")
        except OSError:
            pass  # the listing's own fd, closed by now
    return count


class Server:
    """Accepts every connection and keeps it open until stop(), which returns how many it accepted."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.last: tuple[str, int] | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="test-server", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            sock, peer = self.listener.accept()
            if peer == self.last:
                sock.close()
                return
            self.accepted.append(sock)

    def stop(self) -> int:
        """Connects once more itself: the accept queue is first in, first out, so when the server reaches this
        one it has accepted every connection made before it."""
        with socket.socket() as last:
            last.bind(("127.0.0.1", 0))
            self.last = last.getsockname()  # known before the server can accept it
            last.connect(self.listener.getsockname())
            self.thread.join(JOIN_S)
        assert not self.thread.is_alive(), "the server accepts its own last connection"
        self.listener.close()
        for sock in self.accepted:
            sock.close()
        return len(self.accepted)


def frames(*parts: tuple[int, int, bytes]) -> bytes:
    return b"".join(HEADER.pack(conn_id, kind, len(payload)) + payload for conn_id, kind, payload in parts)


def run_session(server_url: str, agent_log: Path, written: bytes) -> list[tuple[int, int, bytes]]:
    """carry() over pipes until the host's frames end; the frames it sent the host."""
    to_executor_r, to_executor_w = os.pipe()  # the session's stdout
    to_host_r, to_host_w = os.pipe()  # the session's stdin
    back: list[tuple[int, int, bytes]] = []

    def host_writes() -> None:
        with os.fdopen(to_executor_w, "wb") as out:
            out.write(written)

    def host_reads() -> None:
        with os.fdopen(to_host_r, "rb") as stdin:
            back.extend(iter(lambda: read_frame(stdin.read), None))

    threads = [threading.Thread(target=host_writes), threading.Thread(target=host_reads)]
    with open(agent_log, "ab") as log, os.fdopen(to_executor_r, "rb") as stdout:
        stdin = os.fdopen(to_host_w, "wb")
        for thread in threads:
            thread.start()
        executor = threading.Thread(target=carry, args=(stdout, stdin, server_url, log), daemon=True)
        executor.start()
        executor.join(JOIN_S)
        assert not executor.is_alive(), "the executor's end returns at the session's end"
        stdin.close()
    for thread in threads:
        thread.join(JOIN_S)
    return back


class Baseline:
    """The threads and sockets before the server starts, to be back to once the session is over."""

    def __init__(self) -> None:
        self.threads, self.sockets = set(threading.enumerate()), open_sockets()

    def threads_gone(self, *kept: threading.Thread) -> None:
        """Joined with a timeout, not waited for with sleeps; `kept`: the server's, still holding its end."""
        until_s = time.monotonic() + JOIN_S
        for thread in set(threading.enumerate()) - self.threads - set(kept):
            thread.join(max(0.0, until_s - time.monotonic()))
        left = [thread.name for thread in threading.enumerate() if thread not in self.threads]
        assert left == [thread.name for thread in kept], f"threads left after the session: {left[:10]} ({len(left)})"

    def sockets_gone(self) -> None:
        assert open_sockets() == self.sockets, "every socket the session opened is closed"


@pytest.fixture
def baseline() -> Baseline:
    return Baseline()


def test_connections_past_the_cap_are_refused_and_all_go_at_the_sessions_end(
    tmp_path: Path, baseline: Baseline
) -> None:
    server = Server()
    opens = 1500
    back = run_session(server.url, tmp_path / "agent.log", frames(*((i, OPEN, b"") for i in range(1, opens + 1))))
    baseline.threads_gone(server.thread)  # while the server holds its ends open: the pumps end all the same
    assert server.stop() == MAX_OPEN_CONNECTIONS
    refused = {conn_id for conn_id, kind, _ in back if kind == CLOSE}
    assert refused >= set(range(MAX_OPEN_CONNECTIONS + 1, opens + 1)), "each refused connection is closed at once"
    log = (tmp_path / "agent.log").read_text()
    assert log.count(f"more than {MAX_OPEN_CONNECTIONS} connections at once") == 1, log
    assert f"connection {MAX_OPEN_CONNECTIONS + 1} and any other past that are closed at once" in log
    baseline.sockets_gone()


def test_a_connection_opened_twice_ends_the_session_as_damaged(tmp_path: Path, baseline: Baseline) -> None:
    server = Server()
    run_session(server.url, tmp_path / "agent.log", frames(*((7, OPEN, b"") for _ in range(300))))
    baseline.threads_gone(server.thread)
    assert server.stop() == 1
    log = (tmp_path / "agent.log").read_text()
    assert "the ssh session's stream is damaged (connection 7 was opened again while it was open)" in log
    baseline.sockets_gone()


def test_agent_log_is_cut_at_its_cap_and_what_is_dropped_is_counted(tmp_path: Path, baseline: Baseline) -> None:
    server = Server()
    agent_log = tmp_path / "agent.log"
    agent_log.write_bytes(b"the bootstrap's lines come first\n")  # counted against the cap too
    line = b"x" * ((64 << 10) - 1) + b"\n"
    sent = 3 * AGENT_LOG_MAX_BYTES // len(line)
    run_session(server.url, agent_log, frames(*((0, LOG, line) for _ in range(sent))))
    baseline.threads_gone(server.thread)
    assert server.stop() == 0
    data = agent_log.read_bytes()
    assert len(data) <= AGENT_LOG_MAX_BYTES + 300, "the cap and two lines that say so"
    kept, notes = data.split(b"potato-queue: ", 1)
    assert len(kept) <= AGENT_LOG_MAX_BYTES
    assert kept.endswith(line)
    written = (len(kept) - len(b"the bootstrap's lines come first\n")) // len(line)
    assert notes.decode() == (
        f"agent.log cut at {len(kept)} bytes (its cap is {AGENT_LOG_MAX_BYTES}): the agent's later output is "
        "dropped, and counted at the session's end\n"
        f"potato-queue: {sent - written} lines ({(sent - written) * len(line)} bytes) of the agent's output were "
        "dropped past agent.log's cap\n"
    )
    baseline.sockets_gone()
