"""A real project, a real server and real executor processes for the run-lifecycle tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

ADMIN_KEY = "test-admin-key-123"


def make_project(tmp_path: Path, **training: Any) -> Path:
    """The example reviews project, copied, with model_training overrides."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples" / "reviews", project, ignore=shutil.ignore_patterns("training"))
    config = yaml.safe_load((project / "config.yaml").read_text())
    config["admin_api_key"] = ADMIN_KEY
    config["model_training"].update(training)
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return project / "config.yaml"


@contextmanager
def started(tmp_path: Path, redis_url: str, executors: int = 1, **training: Any) -> Iterator[Services]:
    """The example project with `training` overrides, its server and `executors` executors, stopped after."""
    svc = Services(make_project(tmp_path, **training), redis_url, tmp_path)
    svc.serve()
    try:
        for _ in range(executors):
            svc.executor()
        yield svc
    finally:
        svc.stop()


class Services:
    """`potato-queue serve` and any number of `potato-queue worker` processes, torn down hard."""

    def __init__(self, config: Path, redis_url: str, tmp_path: Path) -> None:
        self.config, self.redis_url, self.tmp_path = config, redis_url, tmp_path
        self.env = {**os.environ, "POTATO_QUEUE_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
        self.procs: list[subprocess.Popen[str]] = []
        self.url = ""

    def _spawn(self, *args: str, name: str, env: dict[str, str] | None = None, pipe: bool = False) -> subprocess.Popen[str]:
        log = open(self.tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, "-m", "potato_queue.cli", *args],
                                stdout=subprocess.PIPE if pipe else log, stderr=log, text=True,
                                env={**self.env, **(env or {})}, start_new_session=True)
        self.procs.append(proc)
        return proc

    def serve(self) -> str:
        proc = self._spawn("serve", str(self.config), "--port", "0", name="server", pipe=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " at http://" in line, line + (self.tmp_path / "server.log").read_text()
        self.url = line.rsplit(" at ", 1)[1].strip()
        return self.url

    def executor(self, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return self._spawn("worker", str(self.config), name=f"executor{len(self.procs)}", env=env)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    # -- the admin API, as a client would use it ---------------------------------
    def api(self, method: str, path: str, body: Any = None, key: str | None = ADMIN_KEY) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}/admin/training/api{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key is not None:
            req.add_header("X-API-Key", key)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()

    def start_run(self, **body: Any) -> str:
        status, reply = self.api("POST", "/runs", body)
        assert status == 202, reply
        return reply["run_id"]

    def wait_for(self, run_id: str, states: set[str], timeout_s: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, run = self.api("GET", f"/runs/{run_id}")
            if status == 200 and run["state"] in states:
                return run
            time.sleep(0.1)
        raise AssertionError(f"run {run_id} not in {states} after {timeout_s} s: {run}; logs: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.tmp_path.glob("*.log"))
