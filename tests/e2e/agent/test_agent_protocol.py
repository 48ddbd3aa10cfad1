"""The agent protocol end to end: the real routes served by uvicorn (TCP and a unix socket),
the real agent as a subprocess (token on stdin), a real Redis.

The worker is a scripted stand-in for the trainer (FAKE_WORKER, passed to the
agent as its --python): the real worker belongs to potato_queue/worker and
is tested there. Here only its protocol behaviour matters: events on stdout,
predictions.jsonl in its workdir, and how it meets SIGTERM.
"""

from __future__ import annotations

import glob
import http.client as http_client
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import uvicorn
from fastapi import FastAPI

from potato_queue.agent.launchers.process import group_members
from potato_queue.config import ProjectConfig, build_config
from potato_queue.executors.untar import unpack_upload
from potato_queue.runs.service import RunService
from potato_queue.server.agent_api import agent_router
from potato_queue.server.guard import guard
from potato_queue.store import RunStore
from potato_queue.store.keys import Keys
from potato_queue.wire.job import BundleRef, Limits
from tests.conftest import ROOT
from tests.lifecycle_helpers import job_as_the_executor_stores_it

PREFIX = "/api/training/agent/v1"

FAKE_WORKER = r'''#!{python}
"""A scripted stand-in for `python -m potato_queue.worker --spec SPEC` (see the test module)."""
import json, os, signal, subprocess, sys, time

if "--spec-on-stdin" in sys.argv:  # started ahead of time by a warm agent: the spec's path comes on stdin
    spec_path = sys.stdin.readline().strip()
    if not spec_path:
        sys.exit(0)
else:
    spec_path = sys.argv[sys.argv.index("--spec") + 1]
spec = json.load(open(spec_path))
work, params = spec["workdir"], spec["params"]
mode = params["mode"]


def emit(kind, **fields):
    print(json.dumps(dict(v=1, event=kind, t=time.time(), **fields)), flush=True)


def mark(name, data):
    tmp = os.path.join(work, name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, os.path.join(work, name))


def on_term(signum, frame):
    mark("sigterm", time.time())
    sys.exit(4)


mark("started", {"pid": os.getpid(), "spec": spec, "argv": sys.argv, "pythonpath": os.environ.get("PYTHONPATH"),
                 "bundle": sorted(os.listdir(spec["bundle_dir"]))})
if mode == "success":
    emit("status", state="running", step="training")
    for i in range(params["n"]):
        emit("metric", split="val", name="accuracy", value=i / 1000, step=i)
    emit("progress", phase="train", current=3, total=4, eta_s=1.5)
    emit("log", level="warning", msg="a warning for run.log")
    sys.stderr.write("a line on stderr\n")
    sys.stderr.flush()
    with open(os.path.join(work, "model.bin"), "wb") as fh:
        fh.write(b"weights")
    lines = [{"instance_id": str(i), "schema_name": "sentiment", "payload": {"label": "positive", "confidence": 0.9},
              "confidence": 0.9} for i in range(params.get("predictions", 3))]
    with open(os.path.join(work, "predictions.jsonl"), "w") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)
    emit("result", status="success", model_version="m1", metrics={"accuracy": 0.9}, label_order=["positive", "negative"],
         notes="", predictions_file="predictions.jsonl", n_predictions=len(lines))
    sys.exit(0)
if mode == "hostile":
    # Between good events, lines a broken or hostile trainer writes: a key that is a lone surrogate (JSON
    # escapes, which parse), an 8 MB metric, a log line and a step with lone surrogates.
    emit("metric", split="val", name="accuracy", value=0.5, step=0)
    print('{"v": 1, "event": "metric", "t": 1, "split": "val", "name": "odd", "value": 1, "\\ud800": "a key"}', flush=True)
    emit("metric", split="val", name="huge", value="x" * (8 << 20), step=0)
    print('{"v": 1, "event": "log", "t": 1, "level": "warning", "msg": "bad \\ud800 text"}', flush=True)
    print('{"v": 1, "event": "status", "t": 1, "state": "running", "step": "step \\udfff"}', flush=True)
    emit("metric", split="val", name="accuracy", value=0.9, step=1)
    sys.exit(0)
if mode == "hang":
    signal.signal(signal.SIGTERM, on_term)
    # A child in the worker's group that ignores SIGTERM: the agent must not leave it behind.
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
    mark("ready", {"child": child.pid})
elif mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    mark("ready", {})
elif mode == "hog":
    mark("ready", {})
    hoard = []
    for _ in range(150):
        hoard.append(b"x" * (20 * 1024 * 1024))  # written, so resident
        time.sleep(0.02)
    sys.exit(0)
while True:
    time.sleep(0.05)
'''


# -- the server ------------------------------------------------------------------
@dataclass
class Served:
    """One project's agent routes, served on 127.0.0.1 and on a unix socket."""

    config: ProjectConfig
    store: RunStore
    tcp_url: str
    unix_path: str
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def unix_url(self) -> str:
        return f"unix://{self.unix_path}"

    def http(self, transport: str = "tcp") -> httpx.Client:
        if transport == "unix":
            return httpx.Client(transport=httpx.HTTPTransport(uds=self.unix_path), base_url="http://agent", timeout=40)
        return httpx.Client(base_url=self.tcp_url, timeout=40)

    def stop(self) -> None:
        # force_exit: do not wait for an agent's control long-poll to end (up to 30 s).
        self.server.should_exit = self.server.force_exit = True
        self.thread.join(10)
        assert not self.thread.is_alive(), "uvicorn did not stop"


def _serve(config: ProjectConfig, redis_url: str, socket_dir: str) -> Served:
    store = RunStore(config, redis.Redis.from_url(redis_url))
    app = FastAPI()
    app.state.store = store
    app.state.config = config
    app.state.runs = RunService(config, store)
    app.state.stopping = threading.Event()  # set by the server's signal handler; the control long-poll reads it
    app.include_router(agent_router(), prefix=PREFIX)
    guard(app, store, config)  # as create_app has it
    tcp = socket.socket(
        socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # proto set: asyncio then sets TCP_NODELAY
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("127.0.0.1", 0))
    unix_path = os.path.join(socket_dir, f"agent-{os.urandom(3).hex()}.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o600)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [tcp, unix]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    return Served(config, store, f"http://127.0.0.1:{tcp.getsockname()[1]}", unix_path, server, thread)


@pytest.fixture
def make_server(redis_server_url: str, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """make_server(**model_training) -> a served project in its own folder (own Redis prefix)."""
    socket_dir = tempfile.mkdtemp(prefix="pq-agent-")  # short: unix socket paths are limited to ~100 bytes
    made: list[Served] = []

    def make(**training: Any) -> Served:
        project = tmp_path / f"project{len(made)}"
        project.mkdir()
        data = {
            "annotation_task_name": "agent protocol test",
            "task_dir": str(project),
            "admin_api_key": "admin-secret",
            "model_training": {"enabled": True, **training},
        }
        served = _serve(build_config(data, project / "config.yaml"), redis_server_url, socket_dir)
        made.append(served)
        return served

    yield make
    for served in made:
        served.stop()
        client = served.store.redis
        keys = list(client.scan_iter(match=f"{Keys.of(served.config).prefix}:*"))
        if keys:
            client.delete(*keys)
    for leftover in Path(socket_dir).iterdir():
        leftover.unlink()
    os.rmdir(socket_dir)


@pytest.fixture
def served(make_server: Callable[..., Served]) -> Served:
    return make_server()


# -- runs, bundles, the agent ---------------------------------------------------------
def bundle_bytes(extra_bytes: int = 0) -> bytes:
    """A tiny bundle in Potato's v1 layout, packed the way pack_bundle does (sorted, mtime 0)."""
    rows = {"train": ["1", "2", "3"], "val": ["4"], "test": ["5"]}
    files = {
        f"{split}.jsonl": "".join(
            json.dumps({"id": i, "text": f"review {i}", "labels": {"sentiment": "positive"}}) + "\n" for i in ids
        ).encode()
        for split, ids in rows.items()
    }
    files["labels.json"] = json.dumps({"sentiment": ["positive", "negative"]}).encode()
    files["manifest.json"] = json.dumps(
        {
            "v": 1,
            "schemas": [{"name": "sentiment", "labels": ["positive", "negative"]}],
            "splits": {s: {"path": f"{s}.jsonl", "format": "jsonl", "n": len(ids)} for s, ids in rows.items()},
            "media_dir": "media",
        }
    ).encode()
    files["media/padding.bin"] = os.urandom(extra_bytes)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(files[name]), 0, 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return out.getvalue()


def make_run(
    served: Served,
    mode: str,
    *,
    grace: float | None = 5,
    max_ram_mb: float | None = None,
    sha256: str | None = None,
    extra_bytes: int = 2000,
    send_model_max_bytes: int | None = None,
    **params: Any,
) -> tuple[str, str, bytes]:
    """A run as the executor leaves it when it starts the agent: (run_id, token, bundle bytes)."""
    store = served.store
    run_id = store.create(trainer="fake", schemas=["sentiment"], backend="local", params={"mode": mode, **params})[
        "run_id"
    ]
    data = bundle_bytes(extra_bytes)
    job_as_the_executor_stores_it(
        store,
        run_id,
        data,
        params={"mode": mode, **params},
        seed=7,
        grace_seconds=grace,
        limits=Limits(max_wall_s=600, max_ram_mb=max_ram_mb, device="cpu", num_threads=1),  # type: ignore[arg-type]
        send_model_max_bytes=send_model_max_bytes,
        **({"bundle": BundleRef(len(data), sha256)} if sha256 else {}),
    )
    assert store.transition(run_id, "starting") and store.transition(run_id, "running")
    return run_id, store.tokens.issue(run_id, ttl_s=3600), data


@pytest.fixture
def fake_worker(tmp_path: Path) -> Path:
    path = tmp_path / "fake-python"
    path.write_text(FAKE_WORKER.replace("{python}", sys.executable))
    path.chmod(0o755)
    return path


@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    log_path: Path
    root: Path  # DIR/<run_id>

    def wait(self, timeout_s: float = 60) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self.close_stdin()
        return code

    def close_stdin(self) -> None:
        """What the executor's death looks like to the agent."""
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def marker(self, name: str, timeout_s: float = 20) -> Any:
        path = self.root / "work" / name
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            assert self.proc.poll() is None or path.exists(), f"agent ended ({self.proc.returncode}):\n{self.log}"
            assert time.monotonic() < deadline, f"no {name} from the worker:\n{self.log}"
            time.sleep(0.02)
        return json.loads(path.read_text())


def start_agent(
    url: str, run_id: str, token: str, python: Path, agent_dir: Path, *extra: str, interpreter: str = sys.executable
) -> Agent:
    log_path = agent_dir.parent / f"agent-{run_id}.log"
    agent_dir.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                interpreter,
                "-m",
                "potato_queue.agent",
                "run",
                "--server",
                url,
                "--run-id",
                run_id,
                "--workdir",
                str(agent_dir),
                "--python",
                str(python),
                *extra,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=ROOT,
        )
    assert proc.stdin is not None
    proc.stdin.write(token.encode() + b"\n")
    proc.stdin.flush()  # and kept open, as the executors do: its end stops the run
    return Agent(proc, log_path, agent_dir / run_id)


def events_of(served: Served, run_id: str) -> list[dict[str, Any]]:
    path = served.store.paths(run_id).events
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def live_processes(pgid: int) -> list[int]:
    return group_members(pgid)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- the whole path ---------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_run_end_to_end(transport: str, served: Served, fake_worker: Path, tmp_path: Path) -> None:
    n = 300 if transport == "tcp" else 50
    run_id, token, _ = make_run(served, "success", n=n)
    url = served.tcp_url if transport == "tcp" else served.unix_url
    agent = start_agent(url, run_id, token, fake_worker, tmp_path / "agent")
    assert agent.wait() == 0, agent.log

    started = agent.marker("started")
    # Started through the bootstrap that keeps the working directory off sys.path (wire/isolated.py).
    assert started["argv"][1] == "-c" and started["argv"][3:6] == [str(ROOT), "potato_queue.worker", "--spec"]
    assert started["bundle"] == ["labels.json", "manifest.json", "media", "test.jsonl", "train.jsonl", "val.jsonl"]
    spec = started["spec"]
    assert spec["v"] == 1 and spec["run_id"] == run_id and spec["trainer"] == "fake" and spec["seed"] == 7
    assert spec["workdir"] == str(agent.root / "work") and spec["bundle_dir"] == str(agent.root / "bundle")
    assert spec["limits"]["device"] == "cpu"
    assert started["pythonpath"] is None  # the code's folder comes from the bootstrap, not the environment

    events = events_of(served, run_id)
    steps = [e["step"] for e in events if e["event"] == "metric"]
    assert steps == list(range(n)), "worker events are relayed in order, none lost"
    assert [e["step"] for e in events if e["event"] == "status"][:2] == [
        "downloading the bundle",
        "unpacking the bundle",
    ]
    assert {"event": "log", "level": "stderr", "msg": "a line on stderr"}.items() <= next(
        e for e in events if e.get("level") == "stderr"
    ).items()
    assert all(e["v"] == 1 and "t" in e for e in events)

    store = served.store
    live = store.live(run_id)
    assert live["agent_exit_code"] == "0"
    assert live["artifact_uri"] == f"{socket.gethostname()}:{agent.root / 'work'}"
    assert store.metrics(run_id) == {"val/accuracy": (n - 1) / 1000}
    assert live["progress"] == {"phase": "train", "current": 3, "total": 4, "eta_s": 1.5}
    assert live["result"]["model_version"] == "m1"
    predictions = store.paths(run_id).predictions.read_text().splitlines()
    assert len(predictions) == 3 and json.loads(predictions[0])["schema_name"] == "sentiment"
    assert not store.paths(run_id).predictions_partial.exists()
    run_log = store.paths(run_id).run_log.read_text()
    for line in (
        "step: training",
        "[warning] a warning for run.log",
        "[stderr] a line on stderr",
        "predictions received: 3 lines",
        "agent finished: exit code 0",
    ):
        assert line in run_log
    assert token not in agent.log and token not in run_log
    assert (agent.root / "work" / "model.bin").exists(), "model files stay on the training machine (AGT-6)"
    assert not (agent.root / "bundle.tar.gz").exists() and not (agent.root / "bundle").exists()


def python38() -> str | None:
    """A Python 3.8 that really runs (pyenv's shim for it may not), or None."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    candidates += [p for p in [shutil.which("python3.8")] if p]
    for candidate in candidates:
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(python38() is None, reason="no Python 3.8 on this machine")
def test_the_agent_runs_on_python_38(served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, _ = make_run(served, "success", n=20)
    agent = start_agent(served.unix_url, run_id, token, fake_worker, tmp_path / "agent", interpreter=str(python38()))
    assert agent.wait() == 0, agent.log
    assert [e["step"] for e in events_of(served, run_id) if e["event"] == "metric"] == list(range(20))
    assert served.store.live(run_id)["agent_exit_code"] == "0"


def test_a_warm_agent_hands_its_prestarted_worker_the_spec(served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, _ = make_run(served, "success", n=5)
    agent_dir, log_path = tmp_path / "agent", tmp_path / "warm-agent.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-S",
            "-m",
            "potato_queue.agent",
            "run",
            "--assignment-on-stdin",
            "--python",
            str(fake_worker),
        ],
        stdin=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdin is not None
    assignment = {"run_id": run_id, "server": served.unix_url, "workdir": str(agent_dir), "log": str(log_path)}
    proc.stdin.write(json.dumps(assignment).encode() + b"\n" + token.encode() + b"\n")
    proc.stdin.flush()
    try:
        assert proc.wait(timeout=60) == 0, log_path.read_text()
    finally:
        proc.stdin.close()
    started = json.loads((agent_dir / run_id / "work" / "started").read_text())
    assert started["argv"][1] == "-c" and started["argv"][3:] == [str(ROOT), "potato_queue.worker", "--spec-on-stdin"]
    assert started["spec"]["run_id"] == run_id
    assert f"worker started: pid {started['pid']}" in log_path.read_text()
    assert [e["step"] for e in events_of(served, run_id) if e["event"] == "metric"] == list(range(5))
    assert served.store.live(run_id)["agent_exit_code"] == "0"


def test_a_warm_agent_without_a_run_exits_0(fake_worker: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-S",
            "-m",
            "potato_queue.agent",
            "run",
            "--assignment-on-stdin",
            "--python",
            str(fake_worker),
        ],
        input=b"",
        cwd=ROOT,
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr


# -- auth ------------------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_token_opens_its_own_run_only(transport: str, served: Served) -> None:
    run_a, token_a, _ = make_run(served, "success", n=1)
    run_b, token_b, _ = make_run(served, "success", n=1)
    job = f"{PREFIX}/runs/{run_a}/job"
    with served.http(transport) as http:
        assert http.get(job).status_code == 401
        assert http.get(job, headers={"Authorization": "Basic abc"}).status_code == 401
        wrong = http.get(job, headers=auth("not-a-token-" + token_a[:5]))
        assert wrong.status_code == 401 and token_a[:5] not in wrong.text
        # Another run's token is refused like a wrong one: its holder cannot tell which runs it opens.
        other = http.get(job, headers=auth(token_b))
        assert (other.status_code, other.json()) == (wrong.status_code, wrong.json()) and token_b not in other.text
        assert http.get(f"{PREFIX}/runs/{run_b}/bundle", headers=auth(token_a)).status_code == 401
        posted = http.post(f"{PREFIX}/runs/{run_b}/events", json={"events": []}, headers=auth(token_a))
        assert (posted.status_code, posted.json()) == (wrong.status_code, wrong.json()), "the Guard's answer too"
        # Through the unix socket too, an admin key is worth nothing here (SSH-10).
        admin = {"X-API-Key": "admin-secret", "Authorization": "Bearer admin-secret"}
        assert http.post(f"{PREFIX}/runs/{run_a}/events", json={"events": []}, headers=admin).status_code == 401
        reply = http.get(job, headers=auth(token_a))
    assert reply.status_code == 200
    body = reply.json()
    assert body["run_id"] == run_a and body["trainer"] == "fake" and body["grace_seconds"] == 5
    assert body["max_predictions_bytes"] == 512 * 1024 * 1024 and 1 <= body["heartbeat_interval_s"] <= 10
    beat = served.store.view(run_a).heartbeat_at
    assert beat is not None and time.time() - beat < 5, "an authorized call is a heartbeat"


# -- the bundle ---------------------------------------------------------------------------
def test_bundle_range_gives_206_from_the_byte_asked(served: Served) -> None:
    run_id, token, data = make_run(served, "success", n=1, extra_bytes=300_000)
    url = f"{PREFIX}/runs/{run_id}/bundle"
    with served.http() as http:
        whole = http.get(url, headers=auth(token))
        part = http.get(url, headers={**auth(token), "Range": "bytes=100000-"})
    assert whole.status_code == 200 and whole.content == data
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes 100000-{len(data) - 1}/{len(data)}"
    assert part.content == data[100000:]


@pytest.mark.parametrize("partial", ["prefix", "stale"])
def test_agent_resumes_a_partial_bundle(partial: str, served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, data = make_run(served, "success", n=5, extra_bytes=200_000)
    half = len(data) // 2
    (tmp_path / "agent" / run_id).mkdir(parents=True)
    (tmp_path / "agent" / run_id / "bundle.tar.gz").write_bytes(
        data[:half] if partial == "prefix" else os.urandom(half)
    )
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent", "--keep")
    assert agent.wait() == 0, agent.log
    assert f"resuming the bundle download at byte {half} of {len(data)}" in agent.log
    restarted = "does not match its sha256: downloading it again from the start" in agent.log
    assert restarted == (partial == "stale"), agent.log
    assert (agent.root / "bundle.tar.gz").read_bytes() == data, "--keep keeps the verified bundle"


def test_agent_refuses_a_bundle_whose_sha256_differs(served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, _ = make_run(served, "success", n=5, sha256="0" * 64)
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent")
    assert agent.wait() == 2, agent.log
    assert not (agent.root / "work" / "started").exists(), "the worker never ran"
    assert not (agent.root / "bundle.tar.gz").exists()
    live = served.store.live(run_id)
    assert live["agent_exit_code"] == "2" and "sha256" in live["agent_message"]
    errors = [e for e in events_of(served, run_id) if e["event"] == "error"]
    assert errors and errors[0]["code"] == "bad_bundle" and "refusing" in errors[0]["message"]


# -- cancel ----------------------------------------------------------------------------------
def test_cancel_reaches_the_worker_within_a_second(served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, _ = make_run(served, "hang")
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent")
    ready = agent.marker("ready")
    pgid = agent.marker("started")["pid"]
    assert ready["child"] in group_members(pgid), "the worker's child shares its process group"
    time.sleep(0.3)  # let the control long-poll settle in
    asked = time.time()
    served.store.request_cancel(run_id)
    got_term = agent.marker("sigterm", timeout_s=5)
    assert got_term - asked < 1.0, "SIGTERM within a second of the cancel (AGT-8)"
    assert agent.wait(30) == 4, agent.log
    assert served.store.live(run_id)["agent_exit_code"] == "4"
    assert live_processes(pgid) == [], "nothing of the worker's group is left, not even its SIGTERM-deaf child"
    assert "cancel requested" in served.store.live(run_id)["agent_message"]


def test_a_worker_deaf_to_sigterm_is_killed_after_grace(served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, _ = make_run(served, "stubborn", grace=1)
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent")
    agent.marker("ready")
    pgid = agent.marker("started")["pid"]
    asked = time.monotonic()
    served.store.request_cancel(run_id)
    assert agent.wait(30) == 128 + signal.SIGKILL, agent.log
    assert 1.0 <= time.monotonic() - asked < 10
    live = served.store.live(run_id)
    assert live["agent_exit_code"] == "137" and "killed after 1 s" in live["agent_message"]
    assert live_processes(pgid) == []


def test_control_long_poll_answers_a_cancel_at_once(served: Served) -> None:
    run_id, token, _ = make_run(served, "hang")
    url = f"{PREFIX}/runs/{run_id}/control"
    with served.http() as http:
        started = time.monotonic()
        assert http.get(url, params={"wait_s": 0.2}, headers=auth(token)).json() == {"cancel": False}
        assert time.monotonic() - started < 2
        replies: list[tuple[float, Any]] = []
        poll = threading.Thread(
            target=lambda: replies.append(
                (time.monotonic(), http.get(url, params={"wait_s": 60}, headers=auth(token)).json())
            )
        )
        poll.start()
        time.sleep(0.5)
        asked = time.monotonic()
        served.store.request_cancel(run_id)
        poll.join(10)
        answered, body = replies[0]
        assert body == {"cancel": True} and answered - asked < 0.5
        assert http.post(f"{PREFIX}/runs/{run_id}/events", json={"events": []}, headers=auth(token)).json() == {
            "cancel": True
        }


def test_the_token_dies_with_its_run(served: Served) -> None:
    """However a run ends (here as the orphan sweep ends it), its token opens nothing of it any more."""
    run_id, token, _ = make_run(served, "hang")
    events = f"{PREFIX}/runs/{run_id}/events"
    with served.http() as http:
        assert http.post(events, json={"events": []}, headers=auth(token)).json() == {"cancel": False}
        assert served.store.transition(run_id, "failed", error="the executor stopped")
        for method, name in (
            ("GET", "job"),
            ("GET", "bundle"),
            ("POST", "events"),
            ("GET", "control"),
            ("PUT", "predictions"),
            ("POST", "result"),
        ):
            body = {"events": []} if name == "events" else ({"exit_code": 0} if name == "result" else None)
            reply = http.request(method, f"{PREFIX}/runs/{run_id}/{name}", json=body, headers=auth(token))
            assert reply.status_code == 401, (name, reply.text)
    assert "agent_exit_code" not in served.store.live(run_id)


def test_an_agent_whose_run_ended_on_the_server_stops_its_worker(
    served: Served, fake_worker: Path, tmp_path: Path
) -> None:
    run_id, token, _ = make_run(served, "hang")
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent")
    agent.marker("ready")
    assert served.store.transition(run_id, "failed", error="the executor stopped")
    assert agent.wait(timeout_s=30) == 4, agent.log
    assert "the server no longer accepts this run's token" in agent.log


# -- limits -----------------------------------------------------------------------------------
def test_predictions_over_the_limit_get_413(make_server: Callable[..., Served]) -> None:
    served = make_server(max_predictions_mb=0.001)  # 1048 bytes
    run_id, token, _ = make_run(served, "success", n=1)
    paths = served.store.paths(run_id)
    url = f"{PREFIX}/runs/{run_id}/predictions"
    big = b'{"instance_id": "1"}\n' * 100
    with served.http() as http:
        declared = http.put(url, content=big, headers=auth(token))
        streamed = http.put(url, content=iter([big[:700], big[700:]]), headers=auth(token))  # chunked: no length
        for reply in (declared, streamed):
            assert reply.status_code == 413
            assert "max_predictions_mb" in reply.json()["detail"]
        assert not paths.predictions_partial.exists() and not paths.predictions.exists()
        small = http.put(url, content=b'{"a": 1}\n{"b": 2}', headers=auth(token))
        assert small.json() == {"bytes": 17, "lines": 2}
        assert http.put(url, content=b"{}\n", headers=auth(token)).status_code == 409
    assert paths.predictions.read_bytes() == b'{"a": 1}\n{"b": 2}'


def test_agent_reports_predictions_over_the_limit(
    make_server: Callable[..., Served], fake_worker: Path, tmp_path: Path
) -> None:
    served = make_server(max_predictions_mb=0.001)
    run_id, token, _ = make_run(served, "success", n=1, predictions=50)
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent")
    assert agent.wait() == 0, agent.log
    live = served.store.live(run_id)
    assert "above max_predictions_mb" in live["agent_message"]
    assert not served.store.paths(run_id).predictions.exists()
    assert any(e.get("code") == "predictions_not_sent" for e in events_of(served, run_id))


def test_the_model_route_stores_an_upload_once_and_only_for_a_job_that_asks(served: Served) -> None:
    kept_there, token_there, _ = make_run(served, "success")
    run_id, token, _ = make_run(served, "success", send_model_max_bytes=1000)
    paths = served.store.paths(run_id)
    with served.http() as http:
        refused = http.put(f"{PREFIX}/runs/{kept_there}/model", content=b"x", headers=auth(token_there))
        assert refused.status_code == 409 and "its job does not ask for them" in refused.json()["detail"]
        # A body declared bigger than the disk's free space is refused before a byte is read.
        conn = http_client.HTTPConnection(*served.tcp_url.removeprefix("http://").split(":"))
        conn.putrequest("PUT", f"{PREFIX}/runs/{run_id}/model")
        conn.putheader("Authorization", f"Bearer {token}")
        conn.putheader("Content-Length", str(10**18))
        conn.endheaders()
        huge = conn.getresponse()
        assert huge.status == 413 and "more than this server's disk has free" in json.loads(huge.read())["detail"]
        conn.close()
        assert not paths.model_upload_partial.exists() and not paths.model_upload.exists()
        stored = http.put(f"{PREFIX}/runs/{run_id}/model", content=b'{"manifest": {}}\n', headers=auth(token))
        assert stored.json() == {"bytes": 17}
        again = http.put(f"{PREFIX}/runs/{run_id}/model", content=b"{}", headers=auth(token))
        assert again.status_code == 409
    assert paths.model_upload.read_bytes() == b'{"manifest": {}}\n'


@pytest.mark.parametrize("limit", [1000, 3])
def test_the_agent_sends_the_model_files_its_job_asks_for_and_keeps_the_too_big(
    limit: int, served: Served, fake_worker: Path, tmp_path: Path
) -> None:
    run_id, token, _ = make_run(served, "success", n=1, send_model_max_bytes=limit)
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent")
    assert agent.wait() == 0, agent.log
    paths = served.store.paths(run_id)
    note = unpack_upload(paths.model_upload, paths.artifacts, limit)
    node_copy = agent.root / "work" / "model.bin"
    if limit == 1000:  # b"weights" is 7 bytes
        assert (paths.artifacts / "model.bin").read_bytes() == b"weights" and "model.bin" not in note["kept"]
        assert not node_copy.exists() and "model files sent: " in agent.log
    else:
        assert not (paths.artifacts / "model.bin").exists() and note["kept"]["model.bin"] == 7
        assert node_copy.read_bytes() == b"weights" and "model.bin (0 MB) is over max_artifact_mb" in agent.log
    assert not (agent.root / "model.upload").exists()


def test_memory_limit_kills_the_worker_with_exit_5(served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, _ = make_run(served, "hog", max_ram_mb=150)
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent")
    pgid = agent.marker("started")["pid"]
    assert agent.wait() == 5, agent.log
    live = served.store.live(run_id)
    assert live["agent_exit_code"] == "5"
    assert live["agent_message"].startswith("out of memory: the run used ")
    assert live["agent_message"].endswith(" MB, above max_ram_mb 150")
    assert live["error"].startswith("out of memory") and "(fix: raise model_training.max_ram_mb" in live["error"]
    assert live_processes(pgid) == []


# -- the server gone --------------------------------------------------------------------------
def test_agent_stops_the_worker_when_the_server_is_gone(served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, _ = make_run(served, "hang")
    agent = start_agent(served.unix_url, run_id, token, fake_worker, tmp_path / "agent", "--unreachable-s", "2")
    agent.marker("ready")
    time.sleep(3)
    assert not (agent.root / "work" / "sigterm").exists(), "a quiet run is not a lost server"
    served.stop()  # the ssh tunnel dropped, say
    assert agent.wait(40) == 4, agent.log
    assert (agent.root / "work" / "sigterm").exists()
    assert "no answer from the server for 2 s" in agent.log
    assert token not in agent.log


def test_agent_stops_the_worker_when_stdin_closes(served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, _ = make_run(served, "hang")
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent")
    agent.marker("ready")
    agent.close_stdin()  # the executor (or the ssh session) is gone
    assert agent.wait(30) == 4, agent.log
    assert (agent.root / "work" / "sigterm").exists()
    assert "stdin closed" in served.store.live(run_id)["agent_message"]


def test_a_token_from_a_file_needs_ignore_stdin_eof(served: Served, fake_worker: Path, tmp_path: Path) -> None:
    run_id, token, _ = make_run(served, "success", n=3)
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent", "--ignore-stdin-eof")
    agent.close_stdin()
    assert agent.wait() == 0, agent.log


# -- ingestion ------------------------------------------------------------------------------------
def test_events_update_the_live_state_and_run_log(served: Served) -> None:
    run_id, token, _ = make_run(served, "hang")
    batch = [
        {"v": 1, "event": "status", "t": 1.0, "state": "running", "step": "loading"},
        {"v": 1, "event": "metric", "t": 1.1, "split": "val", "name": "f1", "value": 0.5, "step": 1},
        {"v": 1, "event": "metric", "t": 1.2, "split": "val", "name": "f1", "value": 0.7, "step": 2},
        {"v": 1, "event": "log", "t": 1.3, "level": "info", "msg": "quiet"},
        {
            "v": 1,
            "event": "error",
            "t": 1.4,
            "code": "missing_dependency",
            "message": "Trainer 'x' could not be imported",
            "install_hint": "pip install potato-queue[train-text]",
        },
    ]
    with served.http() as http:
        assert (
            http.post(f"{PREFIX}/runs/{run_id}/events", json={"events": batch[:2]}, headers=auth(token)).status_code
            == 200
        )
        assert (
            http.post(f"{PREFIX}/runs/{run_id}/events", json={"events": batch[2:]}, headers=auth(token)).status_code
            == 200
        )
        more = [{"v": 1, "event": "metric", "t": 2, "split": "test", "name": "acc", "value": 0.9, "step": 3}]
        assert (
            http.post(f"{PREFIX}/runs/{run_id}/events", json={"events": more}, headers=auth(token)).status_code == 200
        )
    live = served.store.live(run_id)
    assert live["step"] == "loading"
    assert served.store.metrics(run_id) == {"val/f1": 0.7, "test/acc": 0.9}
    assert live["error"] == "Trainer 'x' could not be imported (fix: pip install potato-queue[train-text])"
    assert events_of(served, run_id) == batch + more
    run_log = served.store.paths(run_id).run_log.read_text()
    assert "step: loading" in run_log and "quiet" not in run_log
    assert "error: Trainer 'x' could not be imported (fix: pip install potato-queue[train-text])" in run_log


def test_openapi_describes_the_protocol(served: Served) -> None:
    app = FastAPI()
    app.include_router(agent_router(), prefix=PREFIX)
    doc = app.openapi()
    assert {
        f"{PREFIX}/runs/{{run_id}}/{name}" for name in ("job", "bundle", "events", "control", "predictions", "result")
    } <= set(doc["paths"])
    assert doc["components"]["securitySchemes"]["run token"]["scheme"] == "bearer"
    assert "413" in doc["paths"][f"{PREFIX}/runs/{{run_id}}/predictions"]["put"]["responses"]


def test_a_long_poll_ends_when_the_agent_hangs_up(served: Served) -> None:
    run_id, token, _ = make_run(served, "hang")
    with httpx.Client(base_url=served.tcp_url, timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.get(f"{PREFIX}/runs/{run_id}/control", params={"wait_s": 30}, headers=auth(token))
    deadline = time.monotonic() + 5
    while served.server.server_state.tasks:
        assert time.monotonic() < deadline, "the handler kept waiting for an agent that is gone"
        time.sleep(0.05)


# -- what an agent may not do -----------------------------------------------------------------------
def test_one_result_per_run_and_its_exit_code_is_checked(served: Served) -> None:
    run_id, token, _ = make_run(served, "hang")
    result = f"{PREFIX}/runs/{run_id}/result"
    with served.http() as http:
        too_big = http.post(result, json={"exit_code": 99999999999999999999999}, headers=auth(token))
        assert too_big.status_code == 422 and "exit_code" in too_big.text
        assert http.post(result, json={"exit_code": -1}, headers=auth(token)).status_code == 422
    replies: dict[int, int] = {}

    def post(code: int) -> None:
        with served.http() as http:
            replies[code] = http.post(result, json={"exit_code": code}, headers=auth(token)).status_code

    threads = [threading.Thread(target=post, args=(code,)) for code in (0, 1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(replies.values()) == [200, 409, 409], replies
    (winner,) = [code for code, status in replies.items() if status == 200]
    assert served.store.live(run_id)["agent_exit_code"] == str(winner), "the first result stands"


def test_a_message_cannot_forge_a_line_of_run_log(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    from potato_queue.agent.runner import log_line

    run_id, token, _ = make_run(served, "hang")
    forged = "ok\n2026-12-01 08:00:00 FAKE: succeeded\r\x00\u2028"
    with served.http() as http:
        event = {"v": 1, "event": "log", "t": 1.0, "level": "warning", "msg": forged}
        assert http.post(f"{PREFIX}/runs/{run_id}/events", json={"events": [event]}, headers=auth(token)).is_success
        assert http.post(
            f"{PREFIX}/runs/{run_id}/result", json={"exit_code": 1, "message": forged}, headers=auth(token)
        ).is_success
    log = served.store.paths(run_id).run_log.read_text()
    assert not [line for line in log.splitlines() if line.startswith("2026-12-01 08:00:00 FAKE")], log
    assert log.count("ok\\n2026-12-01 08:00:00 FAKE: succeeded\\r\\x00\\u2028") == 2, log
    assert "\r" not in log and "\x00" not in log and "\u2028" not in log
    log_line(forged)  # the agent's own log (agent.log) follows the same rule
    written = capsys.readouterr().err
    assert written.count("\n") == 1 and "ok\\n2026-12-01 08:00:00 FAKE" in written


def test_events_that_cannot_be_served_back_are_refused_or_made_servable(served: Served) -> None:
    run_id, token, _ = make_run(served, "hang")
    events = f"{PREFIX}/runs/{run_id}/events"
    deep: Any = "leaf"
    for _ in range(300):
        deep = [deep]
    with served.http() as http:
        reply = http.post(
            events, json={"events": [{"v": 1, "event": "metric", "t": 1, "value": deep}]}, headers=auth(token)
        )
        assert reply.status_code == 400
        assert reply.json()["detail"] == "event 0 of the batch nests more than 20 levels deep; at most 20 are accepted"
        raw = (
            '{"events": [{"v": 1, "event": "log", "t": 1, "level": "warning", "msg": "bad \\ud800 text"},'
            '{"v": 1, "event": "metric", "t": 1, "split": "val", "name": "loss", "value": 1e400}]}'
        )
        reply = http.post(events, content=raw, headers={**auth(token), "Content-Type": "application/json"})
        assert reply.status_code == 200, reply.text
    stored = [json.loads(line) for line in served.store.paths(run_id).events.read_text().splitlines()]
    assert [e.get("msg") for e in stored][0] == "bad \ufffd text" and stored[1]["value"] == "inf"
    assert "bad \ufffd text" in served.store.paths(run_id).run_log.read_text()
    assert served.store.metrics(run_id) == {"val/loss": "inf"}


def test_a_key_that_is_a_lone_surrogate_is_made_servable_and_costs_no_other_event(served: Served) -> None:
    run_id, token, _ = make_run(served, "hang")
    raw = (
        '{"events": [{"v": 1, "event": "metric", "t": 1, "split": "val", "name": "f1", "value": 0.5},'
        '{"v": 1, "event": "metric", "t": 1, "\\ud800": "a text value", "split": "val", "name": "odd", "value": 2},'
        '{"v": 1, "event": "log", "t": 1, "level": "warning", "\\udfff": 1.5, "msg": "still here"}]}'
    )
    with served.http() as http:
        reply = http.post(
            f"{PREFIX}/runs/{run_id}/events", content=raw, headers={**auth(token), "Content-Type": "application/json"}
        )
    assert reply.status_code == 200, reply.text
    stored = events_of(served, run_id)
    assert [e.get("\ufffd") for e in stored] == [None, "a text value", 1.5]
    assert served.store.metrics(run_id) == {"val/f1": 0.5, "val/odd": 2}
    assert "[warning] still here" in served.store.paths(run_id).run_log.read_text()


def test_the_agent_relays_a_hostile_workers_good_events_and_none_is_lost(
    served: Served, fake_worker: Path, tmp_path: Path
) -> None:
    run_id, token, _ = make_run(served, "hostile")
    agent = start_agent(served.tcp_url, run_id, token, fake_worker, tmp_path / "agent")
    agent.wait()
    assert "the server refused" not in agent.log, agent.log
    worker = [e for e in events_of(served, run_id) if e["event"] in ("metric", "log") and e.get("level") != "stderr"]
    assert [(e.get("name"), e.get("value"), e.get("msg")) for e in worker] == [
        ("accuracy", 0.5, None),
        ("odd", 1, None),
        (None, None, "bad \ufffd text"),
        ("accuracy", 0.9, None),
    ]
    assert worker[1]["\ufffd"] == "a key"
    assert served.store.metrics(run_id) == {"val/accuracy": 0.9, "val/odd": 1}
    run_log = served.store.paths(run_id).run_log.read_text()
    assert "[warning] bad \ufffd text" in run_log and "step: step \ufffd" in run_log
    assert (
        f"metric 'val/huge': its value is text of {8 << 20} characters; fix: report a metric as a number, or as "
        "text of at most 200 characters"
    ) in run_log


def test_a_run_keeps_at_most_1000_metric_names_and_their_values_still_update(served: Served) -> None:
    from potato_queue.bounds import MAX_METRICS_PER_RUN

    run_id, token, _ = make_run(served, "hang")
    events = f"{PREFIX}/runs/{run_id}/events"

    def metric(name: str, value: float) -> dict[str, Any]:
        return {"v": 1, "event": "metric", "t": 1, "split": "train", "name": name, "value": value}

    with served.http() as http:
        first = [metric(f"m{i}", 0.0) for i in range(MAX_METRICS_PER_RUN - 1)]
        assert http.post(events, json={"events": first}, headers=auth(token)).status_code == 200
        last = [metric("m0", 1.0), metric("last", 2.0), metric("one-too-many", 3.0), metric("m1", 4.0)]
        assert http.post(events, json={"events": last}, headers=auth(token)).status_code == 200
    metrics = served.store.metrics(run_id)
    assert len(metrics) == MAX_METRICS_PER_RUN and "train/one-too-many" not in metrics
    assert (metrics["train/m0"], metrics["train/last"], metrics["train/m1"]) == (1.0, 2.0, 4.0)
    assert (
        "metric 'train/one-too-many': the run has 1000 metric names already, the most a run keeps (their values "
        "still update)"
    ) in served.store.paths(run_id).run_log.read_text()


def test_an_unauthenticated_body_is_refused_before_it_is_read(served: Served) -> None:
    from tests.e2e.server.test_server_hardening import raw_request

    run_id, token, _ = make_run(served, "hang")
    head = (
        f"POST {PREFIX}/runs/{run_id}/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {24 << 20}\r\nAuthorization: Bearer wrong-token"
    )
    status, body = raw_request(served.tcp_url, head)
    assert status == 401 and "a valid run token is required" in body
    status, body = raw_request(served.tcp_url, head.replace("wrong-token", token).replace(str(24 << 20), str(40 << 20)))
    assert status == 413 and "more than this route takes (33554432)" in body
