"""The private Redis the tests and `up` start: answers, isolates, and leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import redis

from potato_queue.embedded_redis import EmbeddedRedis, ping


def test_starts_on_a_private_socket_and_stops_cleanly(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "r")
    url = server.start()
    assert url.startswith("unix://")
    assert oct(os.stat(server.socket_path).st_mode & 0o777) == "0o700"
    client = redis.Redis.from_url(url)
    client.set("k", "v")
    assert client.get("k") == b"v"
    client.close()
    pid = server.process.pid
    server.stop()
    assert not ping(url)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_session_redis_answers(redis_server_url: str) -> None:
    assert ping(redis_server_url)
