"""The server's end of the agent's protocol carried over the ssh session (host/channel.py has the host's end).

For a host whose sshd refuses every forward: each connection the agent opens on
the host arrives as an OPEN frame on the session's stdout, and becomes a TCP
connection to the server's own address here; the agent's stdout arrives as LOG
frames and goes to agent.log. Frames back go on the session's stdin.
"""

from __future__ import annotations

import socket
from typing import IO
from urllib.parse import urlsplit

from potato_queue.host.channel import CLOSE, DATA, LOG, OPEN, Mux, read_frame

__all__ = ["carry", "CONNECT_TIMEOUT_S"]

CONNECT_TIMEOUT_S = 10.0


def server_address(server_url: str) -> tuple[str, int]:
    parts = urlsplit(server_url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def carry(stdout: IO[bytes], stdin: IO[bytes], server_url: str, agent_log: IO[bytes]) -> None:
    """Until the session's stdout ends: the agent's connections to the server, its stdout to `agent_log`.
    A damaged stream ends it too (the session's end then fails the run, as a cut forward would)."""
    mux = Mux(stdin)
    address = server_address(server_url)
    try:
        while (frame := read_frame(stdout.read)) is not None:
            conn_id, kind, payload = frame
            if kind == OPEN:
                _connect(mux, conn_id, address)
            elif kind == LOG:
                agent_log.write(payload)
                agent_log.flush()
            elif kind in (DATA, CLOSE):
                mux.dispatch(conn_id, kind, payload)
    except (OSError, ValueError):
        pass
    finally:
        mux.close_all()


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
