"""The agent's HTTP carried over a session's stdin/stdout (host/channel.py, executors/remote/carried.py).

Real parts: an HTTP server on loopback, the agent's own HTTP connection over a unix socket, and a pair of OS pipes standing for
the ssh session's two directions. The host's half is HostRelay's own Mux, driven by threads here; the whole
HostRelay runs on a real host in tests/e2e/ssh/test_login_shells.py (the sshd that refuses forwarding).
"""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from potato_queue.agent.transport import UnixHTTPConnection
from potato_queue.executors.remote.carried import carry
from potato_queue.host.channel import HEADER, LOG, OPEN, Mux, read_frame

pytestmark = pytest.mark.unit


class _Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        reply = body[::-1]
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_connections_and_the_agents_stdout_cross_the_session_both_ways(server: str, tmp_path: Path) -> None:
    to_host_r, to_host_w = os.pipe()  # the session's stdin
    to_server_r, to_server_w = os.pipe()  # the session's stdout
    host_out = os.fdopen(to_server_w, "wb", buffering=0)
    host = Mux(host_out)
    log = tmp_path / "agent.log"
    with open(log, "wb") as agent_log, os.fdopen(to_server_r, "rb") as stdout, os.fdopen(to_host_w, "wb") as stdin:
        executor = threading.Thread(target=carry, args=(stdout, stdin, server, agent_log), daemon=True)
        executor.start()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = str(tmp_path / "run.sock")
        listener.bind(path)
        listener.listen(4)

        host_in = os.fdopen(to_host_r, "rb")

        def dispatch() -> None:
            for frame in iter(lambda: read_frame(host_in.read), None):
                host.dispatch(*frame)

        def host_side() -> None:  # what HostRelay does: accept, say OPEN, pump; frames from stdin dispatched
            threading.Thread(target=dispatch, daemon=True).start()
            for conn_id in range(1, 4):
                sock, _ = listener.accept()
                host.send(conn_id, OPEN)
                host.add(conn_id, sock)

        threading.Thread(target=host_side, daemon=True).start()
        host.send(0, LOG, b"the agent says hello\n")
        big = os.urandom(3 << 20)  # bigger than a frame: split and joined again, in order
        replies = []
        for body in (b"abc", big, b"xyz"):
            client = UnixHTTPConnection(path, timeout=10)  # the agent's own connection
            client.request("POST", "/", body=body, headers={"Content-Length": str(len(body))})
            replies.append(client.getresponse().read())
            client.close()
        assert replies == [b"cba", big[::-1], b"zyx"]
        host_out.close()  # the session ends
        executor.join(10)
        assert not executor.is_alive(), "the executor's end stops at the session's end"
    assert log.read_bytes() == b"the agent says hello\n"


def test_a_damaged_stream_is_refused_not_buffered() -> None:
    frames = iter([HEADER.pack(1, 2, 1 << 30)])
    with pytest.raises(ValueError, match="not a channel frame"):
        read_frame(lambda size: next(frames, b""))
    assert read_frame(lambda size: b"") is None
