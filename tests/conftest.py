"""Shared fixtures: a real Redis (started when none answers), real CLI runs, project folders."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from potato_queue.config import REDIS_URL_ENV, redis_url
from potato_queue.embedded_redis import EmbeddedRedis, ping

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "potato_queue.cli"]


@pytest.fixture(scope="session")
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The configured Redis if it answers; else a private one on a unix socket for this session."""
    url = redis_url()
    if ping(url):
        yield url
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    url = server.start()
    os.environ[REDIS_URL_ENV] = url  # subprocesses (executors, CLI) inherit it
    try:
        yield url
    finally:
        server.stop()


def run_cli(*args: str | os.PathLike[str], env: dict[str, str] | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `potato-queue ARGS` as a user would, in a fresh process."""
    return subprocess.run(
        [*CLI, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT built locally (tests/lifecycle_helpers.build_tiny_model): real training, no download."""
    from tests.lifecycle_helpers import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-bert"))
