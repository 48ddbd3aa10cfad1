"""The agent's HTTP carried over the ssh session itself, for a host whose sshd refuses every forward.

Standard library only, Python 3.8+ (it runs on the host, from the agent's code).
With `AllowTcpForwarding no`, `AllowStreamLocalForwarding no` or
`DisableForwarding yes`, no reverse forward can bring the agent's socket to the
server. The session's own stdin and stdout still carry bytes, so the bootstrap
listens on the run's socket itself (0600, a fresh path) and multiplexes each
connection the agent opens into frames on its stdout; the executor opens a TCP
connection to the server for each and sends the answers back as frames on the
session's stdin (executors/remote/carried.py). The agent cannot tell the
difference: it talks HTTP to `unix://<socket>` either way.

A frame is HEADER (connection id, kind, payload length) and the payload:
OPEN (the host: a new connection), DATA, CLOSE (the sender sends no more on
that connection: the receiver shuts its side for writing), LOG (the agent's
stdout, for agent.log; connection 0). A frame the reader cannot trust (too big,
an unknown kind, a connection opened twice) is DamagedStream: the session ends.
"""

import os
import socket
import struct
import subprocess
import threading
from typing import IO, Callable, Dict, Optional, Set, Tuple

HEADER = struct.Struct(">IBI")
OPEN, DATA, CLOSE, LOG = 1, 2, 3, 4
CHUNK_BYTES = 256 << 10
MAX_PAYLOAD_BYTES = 1 << 20  # a frame is never bigger: a damaged stream is caught, not buffered


class DamagedStream(ValueError):
    """The frames cannot be trusted any more: the reader ends the session rather than guess at the rest."""


class Mux:
    """Both ends' half: connections by id, each pumped into DATA frames by a thread of its own; frames out
    through one lock."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.write_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.conns: Dict[int, socket.socket] = {}
        self.half_done: Dict[int, Set[str]] = {}
        self.closed = False  # the session is over: nobody reads our frames, and no connection is added

    def send(self, conn_id: int, kind: int, payload: bytes = b"") -> None:
        with self.write_lock:
            if self.closed:
                return  # a pump's CLOSE after the session's end: its stream may be gone or never read again
            self.out.write(HEADER.pack(conn_id, kind, len(payload)) + payload)
            self.out.flush()

    def add(self, conn_id: int, sock: socket.socket) -> None:
        with self.state_lock:
            closed = self.closed
            if not closed:
                self.conns[conn_id], self.half_done[conn_id] = sock, set()
        if closed:  # accepted as the session ended: close_all has run and would never close it
            sock.close()
            return
        threading.Thread(target=self.pump, args=(conn_id, sock), name="channel-{}".format(conn_id), daemon=True).start()

    def pump(self, conn_id: int, sock: socket.socket) -> None:
        """What the socket says goes out as DATA, its end as CLOSE."""
        try:
            while True:
                data = sock.recv(CHUNK_BYTES)
                if not data:
                    break
                self.send(conn_id, DATA, data)
        except (OSError, ValueError):
            pass  # the socket, or the session (its stream closed: ValueError), is gone
        try:
            self.send(conn_id, CLOSE)
        except (OSError, ValueError):
            pass  # the session is gone
        self._half(conn_id, "read")

    def dispatch(self, conn_id: int, kind: int, payload: bytes) -> None:
        """A frame from the other end, for one of our connections."""
        sock = self.conns.get(conn_id)
        if sock is None:
            return  # closed here already: the rest of its data has nowhere to go
        try:
            if kind == DATA:
                sock.sendall(payload)
                return
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            end_socket(sock)  # the peer is gone: its pump wakes and says CLOSE
        self._half(conn_id, "write")

    def _half(self, conn_id: int, side: str) -> None:
        with self.state_lock:
            done = self.half_done.get(conn_id)
            if done is None:
                return
            done.add(side)
            if len(done) < 2:
                return
            sock = self.conns.pop(conn_id)
            del self.half_done[conn_id]
        sock.close()

    def close_all(self) -> None:
        """The session's end: every connection's socket goes, and with it its pump thread."""
        with self.state_lock:
            self.closed = True
            socks = list(self.conns.values())
            self.conns.clear()
            self.half_done.clear()
        for sock in socks:
            end_socket(sock)


def end_socket(sock: socket.socket) -> None:
    """Shut, then close: a close alone does not wake a pump blocked in recv() on the socket (Linux), whose
    thread would then outlive the session."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more: nobody is blocked on it
    sock.close()


def read_frame(read: Callable[[int], bytes]) -> Optional[Tuple[int, int, bytes]]:
    """(connection id, kind, payload), or None at the stream's end; DamagedStream for a damaged stream,
    ValueError for one cut inside a frame."""
    head = read_exact(read, HEADER.size)
    if head is None:
        return None
    conn_id, kind, size = HEADER.unpack(head)
    if size > MAX_PAYLOAD_BYTES or kind not in (OPEN, DATA, CLOSE, LOG):
        raise DamagedStream("not a channel frame: kind {}, {} bytes".format(kind, size))
    payload = read_exact(read, size) if size else b""
    if payload is None:
        raise ValueError("the stream ended inside a frame")  # a cut session (ssh killed), not a damaged one
    return conn_id, kind, payload


def read_exact(read: Callable[[int], bytes], size: int) -> Optional[bytes]:
    chunks, left = [], size
    while left:
        chunk = read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class HostRelay:
    """The host's end: listens on the run's socket and carries the agent's connections and stdout."""

    def __init__(self, path: str) -> None:
        self.path = path
        old = os.umask(0o177)  # the socket file is 0600 from its first moment: the host's other accounts get nothing
        try:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(path)  # a path that exists already fails here: nobody else's socket is taken over
        finally:
            os.umask(old)
        self.listener.listen(16)
        self.stdout = os.fdopen(os.dup(1), "wb")
        self.mux = Mux(self.stdout)

    def serve(self, agent: "subprocess.Popen[bytes]") -> int:
        """Until the agent ends (its exit code) or the session does (the agent's stdin closes, then its exit)."""
        threading.Thread(target=self._accept, name="channel-accept", daemon=True).start()
        logs = threading.Thread(target=self._agent_stdout, args=(agent,), name="channel-log", daemon=True)
        logs.start()
        threading.Thread(target=self._from_executor, args=(agent,), name="channel-in", daemon=True).start()
        code = agent.wait()
        logs.join(10)
        self.mux.close_all()
        return code

    def _accept(self) -> None:
        conn_id = 0
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn_id += 1
            self.mux.send(conn_id, OPEN)
            self.mux.add(conn_id, sock)

    def _agent_stdout(self, agent: "subprocess.Popen[bytes]") -> None:
        assert agent.stdout is not None
        for line in iter(lambda: agent.stdout.readline(CHUNK_BYTES), b""):  # type: ignore[union-attr]
            self.mux.send(0, LOG, line)

    def _from_executor(self, agent: "subprocess.Popen[bytes]") -> None:
        """Frames from the session's stdin; at its end the agent's stdin closes, which stops the agent."""
        stdin = os.fdopen(0, "rb", buffering=CHUNK_BYTES)
        try:
            while True:
                frame = read_frame(stdin.read)
                if frame is None:
                    break
                self.mux.dispatch(*frame)
        except (OSError, ValueError):
            pass
        finally:
            if agent.stdin is not None:
                try:
                    agent.stdin.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
