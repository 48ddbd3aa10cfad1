"""Connections before they are requests (server/connections.py), against a real `potato-queue serve`.

The flood comes from a machine of its own (a network namespace, tests/netns.py), as it would: one client
address holding idle connections, the server's own clients elsewhere.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

import pytest

from potato_queue.server.connections import ConnectionGate
from tests.agent_helpers import nat_host
from tests.lifecycle_helpers import ADMIN_KEY, Services, make_project

# Opens COUNT connections to HOST:PORT, sends half a request header on each, and holds them; prints how many
# the server had closed (read b"") once WAIT_S passed.
HOLDER = """import socket, sys, time
host, port, count, wait_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
held, cut_at_once = [], 0
for _ in range(count):
    try:
        conn = socket.create_connection((host, port), timeout=5)
        conn.sendall(b"GET /healthz HTTP/1.1\\r\\nHost: x\\r\\n")
        held.append(conn)
    except OSError:
        cut_at_once += 1
print("cut_at_once", cut_at_once, flush=True)
time.sleep(wait_s)
closed = 0
for conn in held:
    conn.settimeout(0.01)
    try:
        closed += conn.recv(1) == b""
    except OSError as exc:
        closed += not isinstance(exc, socket.timeout)
print("closed", closed, flush=True)
"""


def healthz_answers(url: str, timeout_s: float = 5) -> int:
    """/healthz's status (503: no executor runs in these tests), its JSON read whole."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout_s) as reply:
            json.loads(reply.read())
            return int(reply.status)
    except urllib.error.HTTPError as error:
        json.loads(error.read())
        return int(error.code)


def _said(server: subprocess.Popen[str], text: str, wait_s: float = 10) -> str:
    """What the server printed on stdout after its address line, up to the line with *text* (or wait_s)."""
    assert server.stdout is not None
    lines: list[str] = []
    seen = threading.Event()

    def read(out: IO[str]) -> None:
        for line in out:  # ends at the server's exit
            lines.append(line)
            if text in line:
                seen.set()

    threading.Thread(target=read, args=(server.stdout,), daemon=True).start()
    seen.wait(wait_s)
    return "".join(lines)


@pytest.mark.unit
def test_the_gate_caps_each_client_and_all_but_not_loopback() -> None:
    gate = ConnectionGate.for_file_limit(1024)
    assert (gate.max_total, gate.max_per_client) == (768, 96)
    assert all(gate.admit("10.0.0.2") for _ in range(96)) and not gate.admit("10.0.0.2")
    assert gate.admit("10.0.0.3"), "another client has its own share"
    assert all(gate.admit("127.0.0.1") for _ in range(768 - 97)), "the proxy in front (loopback) is not one client"
    assert not gate.admit("10.0.0.4") and gate.refused == 2, "nobody past the total"
    gate.release("127.0.0.1")
    assert gate.admit("10.0.0.4")
    for _ in range(96):
        gate.release("10.0.0.2")
    assert "10.0.0.2" not in gate.by_client, "a client that left costs nothing"
    assert ConnectionGate.for_file_limit(65536).max_per_client == 1024


def test_1100_idle_connections_under_1024_open_files_leave_the_server_answering(
    tmp_path: Path, redis_server_url: str
) -> None:
    """Before, uvicorn kept each half-sent request open for good: 1,100 of them against 1,024 open files and
    `/healthz` answered nothing. Now one client holds at most its share, the rest are closed at once, and the
    held ones are cut HEADER_TIMEOUT_S (here 2 s) after they connected."""
    with nat_host() as nat:
        svc = Services(make_project(tmp_path), redis_server_url, tmp_path)
        try:
            svc.serve(nat.host_ip, open_files=1024, env={"POTATO_QUEUE_HEADER_TIMEOUT_S": "2"})
            said = _said(svc.procs[-1], "RLIMIT_NOFILE")
            assert (
                "warning: this process may open only 1024 files (RLIMIT_NOFILE), so it serves at most 768 "
                "connections at once (96 per client)"
                in said
                and "LimitNOFILE=65536" in said
            ), said
            port = int(svc.url.rsplit(":", 1)[1])
            holder = tmp_path / "holder.py"
            holder.write_text(HOLDER)
            flood = nat.popen(
                [sys.executable, str(holder), nat.host_ip, str(port), "1100", "4"], stdout=subprocess.PIPE
            )
            assert flood.stdout is not None
            cut_at_once = int(flood.stdout.readline().split()[1])
            assert healthz_answers(svc.url) in (200, 503), "the server answers while the flood holds its share"
            closed = int(flood.stdout.readline().split()[1])
            flood.wait(30)
            assert cut_at_once + closed == 1100, (cut_at_once, closed, "every idle connection was closed")
            assert healthz_answers(svc.url) in (200, 503)
        finally:
            svc.stop()


def test_a_slow_header_is_cut_and_a_whole_request_on_the_same_server_is_not(
    tmp_path: Path, redis_server_url: str
) -> None:
    svc = Services(make_project(tmp_path), redis_server_url, tmp_path)
    try:
        svc.serve("127.0.0.1", env={"POTATO_QUEUE_HEADER_TIMEOUT_S": "1"})
        port = int(svc.url.rsplit(":", 1)[1])
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        started_s = time.monotonic()
        assert slow.recv(1) == b"", "the server hung up on the half-sent header"
        assert time.monotonic() - started_s < 8
        assert healthz_answers(svc.url) in (200, 503)
    finally:
        svc.stop()


def _post_head(port: int, length: int) -> bytes:
    return (
        f"POST /admin/training/api/runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-API-Key: {ADMIN_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_stalled_body_is_cut_and_one_that_keeps_coming_is_read(tmp_path: Path, redis_server_url: str) -> None:
    """The body's limit counts from its last byte (BODY_IDLE_S, here 1 s): a client that stops sending mid-body
    is hung up on; a slow one that keeps sending gets its answer, however long the whole body takes."""
    svc = Services(make_project(tmp_path), redis_server_url, tmp_path)
    try:
        svc.serve("127.0.0.1", env={"POTATO_QUEUE_BODY_IDLE_S": "1"})
        port = int(svc.url.rsplit(":", 1)[1])
        body = b'{"trainer": "nope", "schemas": ["sentiment"]}'
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stalled:
            stalled.sendall(_post_head(port, len(body)) + body[:10])
            started_s = time.monotonic()
            assert stalled.recv(1) == b"", "the server hung up on the stalled body"
            assert time.monotonic() - started_s < 8
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(_post_head(port, len(body)))
            for i in range(0, len(body), 8):  # 6 pieces 0.5 s apart: 2.5 s in all, never 1 s idle
                slow.sendall(body[i : i + 8])
                time.sleep(0.5)
            reply = slow.recv(200)
        assert reply.startswith(b"HTTP/1.1 4"), reply  # an unknown trainer: refused, but read and answered
    finally:
        svc.stop()
