"""Shared fixtures: a real Redis (started when none answers), real CLI runs, project folders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from potato_queue.processes.embedded_redis import EmbeddedRedis
from potato_queue.settings import REDIS_URL_ENV
from potato_queue.wire.isolated import THREAD_ENV_VARS
from tests.sshd import Sshd

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "potato_queue.cli"]


# Tests flush and fill their Redis: they get a private one unless this names one on purpose.
TEST_REDIS_ENV = "POTATO_QUEUE_TEST_REDIS_URL"


def _given_redis(url: str) -> str:
    import redis

    size = redis.Redis.from_url(url).dbsize()
    if size:
        pytest.exit(
            f"{TEST_REDIS_ENV}={url} holds {size} keys; the tests flush their database, so they run "
            "only on an empty one (unset it to use a private Redis)",
            returncode=2,
        )
    return url


@pytest.fixture(scope="session", autouse=True)
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private Redis on a unix socket for this session (never the user's own, which the tests
    would flush), or the empty one $POTATO_QUEUE_TEST_REDIS_URL names. Every process the tests
    start (server, executors, CLI) inherits it through $POTATO_QUEUE_REDIS_URL."""
    given = os.environ.get(TEST_REDIS_ENV)
    server = None if given else EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    url = _given_redis(given) if given else server.start()  # type: ignore[union-attr]
    before = os.environ.get(REDIS_URL_ENV)
    os.environ[REDIS_URL_ENV] = url
    try:
        yield url
    finally:
        if before is None:
            os.environ.pop(REDIS_URL_ENV, None)
        else:
            os.environ[REDIS_URL_ENV] = before
        if server is not None:
            server.stop()


@pytest.fixture(scope="session", autouse=True)
def stacks_stopped_in_the_background(redis_server_url: str) -> Iterator[None]:
    """The stacks `started` brings up are stopped while the next test runs (lifecycle_helpers.Reaper), and all
    of them are gone before the session's Redis stops."""
    from tests import lifecycle_helpers

    lifecycle_helpers.BACKGROUND_REAPER = reaper = lifecycle_helpers.Reaper()
    try:
        yield
    finally:
        lifecycle_helpers.BACKGROUND_REAPER = None
        reaper.close()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH server on 127.0.0.1 for one test module (tests/sshd.py)."""
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.close()


def run_cli(
    *args: str | os.PathLike[str], env: dict[str, str] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
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


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with a tokenizer trained on the example's reviews (tests/tiny_llm.py): hf-llm-lora's model."""
    import json

    from tests.lifecycle_helpers import SMALL_PROJECT
    from tests.tiny_llm import build_tiny_llm

    texts = [row["text"] for row in json.loads((SMALL_PROJECT / "data" / "reviews.json").read_text())]
    return build_tiny_llm(tmp_path_factory.mktemp("tiny-llama"), texts)


# The suite's tiers: a module marks itself `unit` (in process); every other test starts real processes and
# is `e2e`; these modules' tests each take seconds of real time (servers, SLURM, chromium, training) and are
# also `slow`. `make test-fast` runs the unit tier.
SLOW_MODULES = frozenset(
    {
        "test_contract",
        "test_slurm_backend",
        "test_ssh_backend",
        "test_agent_backend",
        "test_page",
        "test_lifecycle",
        "test_potato_live",
        "test_retrain",
        "test_chaos",
    }
)

# tests/e2e/runs/test_chaos.py's rows, one file per case, from whichever xdist worker ran it: the table is printed at
# the end of the session (the controller sets the folder before its workers start, so they inherit it).
CHAOS_TABLE_ENV = "POTATO_QUEUE_CHAOS_TABLE"


def pytest_configure(config: pytest.Config) -> None:
    # One thread per pool in every process the tests start, unless the caller set one: the suite runs three
    # workers on two cores, and a fine-tune's OpenMP threads (one per core by default) spin while they wait
    # for a core. Measured: the fine-tuning tests took 44% less CPU and a third less time so. A run's own
    # num_threads (the ssh tests set 3) still wins inside its worker.
    for name in THREAD_ENV_VARS:
        os.environ.setdefault(name, "1")
    if not os.environ.get(CHAOS_TABLE_ENV):
        os.environ[CHAOS_TABLE_ENV] = tempfile.mkdtemp(prefix="pq-chaos-")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    folder = Path(os.environ.get(CHAOS_TABLE_ENV, ""))
    rows = sorted(folder.glob("*.txt")) if folder.name else []
    if rows:
        terminalreporter.write_sep("-", "chaos: what was broken, and how the run ended")
        for row in rows:
            terminalreporter.write_line(row.read_text().rstrip())
    if folder.name:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.e2e)
            if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
                item.add_marker(pytest.mark.slow)
