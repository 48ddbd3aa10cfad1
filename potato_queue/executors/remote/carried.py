"""The server's end of the agent's protocol carried over the ssh session (host/channel.py has the host's end).

For a host whose sshd refuses every forward: each connection the agent opens on
the host arrives as an OPEN frame on the session's stdout, and becomes a TCP
connection to the server's own address here; the agent's stdout arrives as LOG
frames and goes to agent.log. Frames back go on the session's stdin.

The host is not trusted to be well-behaved: what it can make this process hold
is bounded. At most MAX_OPEN_CONNECTIONS connections (a socket and a thread
each) are open at once, agent.log grows to AGENT_LOG_MAX_BYTES, and every
socket and thread is gone when the session ends.
"""

from __future__ import annotations

import socket
from typing import IO
from urllib.parse import urlsplit

from potato_queue.host.channel import CLOSE, DATA, LOG, OPEN, DamagedStream, Mux, read_frame

__all__ = ["carry", "AgentLog", "CONNECT_TIMEOUT_S", "MAX_OPEN_CONNECTIONS", "AGENT_LOG_MAX_BYTES"]

CONNECT_TIMEOUT_S = 10.0
# The agent holds one keep-alive connection per thread that talks to the server (the main loop, heartbeat,
# control, events, a hash or an upload): a handful. Each costs a socket to the server and a thread here, so
# more at once is a host gone wrong; one refused is closed at once, which the agent's client retries.
MAX_OPEN_CONNECTIONS = 16
# agent.log is read whole by people and its tail by the run's error; the agent's own lines are one a step,
# so a run that fills 8 MiB is printing in a loop, and the server's disk is not the host's to fill.
AGENT_LOG_MAX_BYTES = 8 << 20
NOTE_PREFIX = b"potato-queue: "  # the executor's own lines in agent.log, apart from the agent's


def server_address(server_url: str) -> tuple[str, int]:
    parts = urlsplit(server_url)
    return parts.hostname or "127.0.0.1", parts.port or 80


class AgentLog:
    """agent.log as the LOG frames fill it: whole frames up to `max_bytes` (the file's size, what came before
    included), then one line saying where it was cut; what is dropped after is counted and said at the end.
    The executor's notes bypass the cap: each is written once a session."""

    def __init__(self, out: IO[bytes], max_bytes: int = AGENT_LOG_MAX_BYTES) -> None:
        self.out, self.max_bytes = out, max_bytes
        try:
            self.size_bytes = out.tell()  # opened for append: the file's end
        except OSError:
            self.size_bytes = 0  # not a file (a pipe): only what this session writes counts
        self.dropped_frames = self.dropped_bytes = 0

    def write(self, payload: bytes) -> None:
        if self.dropped_frames or self.size_bytes + len(payload) > self.max_bytes:
            if not self.dropped_frames:
                self.note(
                    f"agent.log cut at {self.size_bytes} bytes (its cap is {self.max_bytes}): the agent's "
                    "later output is dropped, and counted at the session's end"
                )
            self.dropped_frames += 1
            self.dropped_bytes += len(payload)
            return
        self.out.write(payload)
        self.out.flush()
        self.size_bytes += len(payload)

    def note(self, line: str) -> None:
        self.out.write(NOTE_PREFIX + line.encode() + b"\n")
        self.out.flush()

    def close(self) -> None:
        """The count of what was dropped, at the session's end."""
        if self.dropped_frames:
            self.note(
                f"{self.dropped_frames} lines ({self.dropped_bytes} bytes) of the agent's output were dropped "
                "past agent.log's cap"
            )


class Carrier:
    """One session's connections to the server, by the host's connection ids, and its agent.log."""

    def __init__(self, stdin: IO[bytes], server_url: str, agent_log: IO[bytes]) -> None:
        self.mux = Mux(stdin)
        self.log = AgentLog(agent_log)
        self.address = server_address(server_url)
        self.refused = 0

    def frame(self, conn_id: int, kind: int, payload: bytes) -> None:
        if kind == OPEN:
            self.open(conn_id)
        elif kind == LOG:
            self.log.write(payload)
        elif kind in (DATA, CLOSE):
            self.mux.dispatch(conn_id, kind, payload)

    def open(self, conn_id: int) -> None:
        if conn_id in self.mux.conns:
            # A second socket under one id would leave the first one's socket and thread out of the table,
            # never closed: the host's ids are new each time, so this stream is not the host's any more.
            raise DamagedStream(f"connection {conn_id} was opened again while it was open")
        if len(self.mux.conns) >= MAX_OPEN_CONNECTIONS:
            if not self.refused:
                self.log.note(
                    f"the host opened more than {MAX_OPEN_CONNECTIONS} connections at once over the ssh "
                    f"session: connection {conn_id} and any other past that are closed at once (the agent "
                    "retries)"
                )
            self.refused += 1
            self.mux.send(conn_id, CLOSE)
            return
        _connect(self.mux, conn_id, self.address)

    def close(self) -> None:
        self.mux.close_all()
        self.log.close()


def carry(stdout: IO[bytes], stdin: IO[bytes], server_url: str, agent_log: IO[bytes]) -> None:
    """Until the session's stdout ends: the agent's connections to the server, its stdout to `agent_log`.
    A damaged stream ends it too, said in agent.log (the session's end then fails the run, as a cut forward
    would). Either way every connection's socket and thread is gone when this returns."""
    carrier = Carrier(stdin, server_url, agent_log)
    try:
        while (frame := read_frame(stdout.read)) is not None:
            carrier.frame(*frame)
    except DamagedStream as exc:
        carrier.log.note(f"the ssh session's stream is damaged ({exc}): its connections to the server are closed")
    except (OSError, ValueError):
        pass  # the session was cut (inside a frame, or while we wrote to it)
    finally:
        carrier.close()


def _connect(mux: Mux, conn_id: int, address: tuple[str, int]) -> None:
    try:
        sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
    except OSError:
        mux.send(conn_id, CLOSE)  # the agent sees its connection end, as with a server that is down
        return
    sock.settimeout(None)
    # A request arrives in frames as the agent wrote it: without this, Nagle holds the second small write until
    # the server's delayed ACK (40 ms a request), as ssh's own forwards avoid by setting it too.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mux.add(conn_id, sock)
