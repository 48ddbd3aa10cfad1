"""The private Redis the tests and `up` start: answers, isolates, and leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import redis

from potato_queue.processes.embedded_redis import EmbeddedRedis, ping


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


def test_the_suite_runs_on_a_private_redis_not_the_users(redis_server_url: str, tmp_path: Path) -> None:
    # The user's Redis (the default URL, where one runs) is never the one the tests flush.
    assert redis_server_url.startswith("unix://") and "/redis.sock" in redis_server_url
    assert os.environ["POTATO_QUEUE_REDIS_URL"] == redis_server_url


def test_a_given_test_redis_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    with EmbeddedRedis(tmp_path / "r") as server:
        redis.Redis.from_url(server.url).set("somebody's", "data")
        env = {**os.environ, "POTATO_QUEUE_TEST_REDIS_URL": server.url}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "tests/e2e/server/test_embedded_redis.py::test_session_redis_answers",
            ],
            cwd=str(ROOT),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "holds 1 keys; the tests flush their database" in proc.stdout + proc.stderr
        assert redis.Redis.from_url(server.url).get("somebody's") == b"data"
