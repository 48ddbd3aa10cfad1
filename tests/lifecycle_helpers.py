"""A real project, a real server and real executor processes for the run-lifecycle tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from potato_queue.config import ProjectConfig
from potato_queue.store.keys import RunPaths
from potato_queue.validate import load_checked
from tests.conftest import ROOT

ADMIN_KEY = "test-admin-key-123"
SMALL_PROJECT = ROOT / "tests" / "fixtures" / "reviews_small"


def make_project(tmp_path: Path, source: Path = SMALL_PROJECT, **training: Any) -> Path:
    """The tests' small reviews project (160 templated reviews: a tiny model learns them in seconds), or
    `source`, copied, with model_training overrides. The README's example (examples/reviews) is bundled in
    test_bundle.py and trained by bench/bench_demo.py."""
    project = tmp_path / "project"
    shutil.copytree(source, project, ignore=shutil.ignore_patterns("training"))
    config = yaml.safe_load((project / "config.yaml").read_text())
    config["admin_api_key"] = ADMIN_KEY
    config["model_training"].update(training)
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return project / "config.yaml"


def reap(procs: list[subprocess.Popen[str]], grace_s: float = 10) -> None:
    """Wait for processes told to stop; a group still there after `grace_s` is killed."""
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Reaper:
    """Waits in the background for stacks told to stop. An executor's graceful exit takes about a second (Celery
    reads the answer to its last BRPOP, so that no message popped is lost); a test that is done need not wait
    for it: the next one starts meanwhile. `close` waits for them all (the suite leaves nothing running)."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def reap(self, procs: list[subprocess.Popen[str]]) -> None:
        thread = threading.Thread(target=reap, args=(list(procs),), daemon=True, name="reaper")
        thread.start()
        self.threads.append(thread)

    def close(self) -> None:
        for thread in self.threads:
            thread.join()
        self.threads.clear()


# Set by the suite for its session (tests/conftest.py): then `started` leaves its stack to it. Unset (a benchmark
# that uses these helpers), `started` waits for its processes itself.
BACKGROUND_REAPER: Reaper | None = None


@contextmanager
def started(
    tmp_path: Path,
    redis_url: str,
    executors: int = 1,
    host: str = "127.0.0.1",
    *,
    prepare: Callable[[Path], object] | None = None,
    executor_env: dict[str, str] | None = None,
    **training: Any,
) -> Iterator[Services]:
    """The example project with `training` overrides (and what `prepare` adds to its config file), its server
    (on `host`) and `executors` executors (with `executor_env`), stopped after."""
    config = make_project(tmp_path, **training)
    if prepare is not None:
        prepare(config)
    svc = Services(config, redis_url, tmp_path)
    svc.serve(host)
    try:
        for _ in range(executors):
            svc.executor(env=executor_env)
        yield svc
    finally:
        svc.stop(BACKGROUND_REAPER)


class Services:
    """`potato-queue serve` and any number of `potato-queue executor` processes, torn down hard."""

    def __init__(self, config: Path, redis_url: str, tmp_path: Path) -> None:
        self.config, self.redis_url, self.tmp_path = config, redis_url, tmp_path
        self.env = {**os.environ, "POTATO_QUEUE_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
        self.procs: list[subprocess.Popen[str]] = []
        self.url = ""
        self.ssl_context: ssl.SSLContext | None = None  # for a server on https
        self._project_config: ProjectConfig | None = None
        self.server: subprocess.Popen[str] | None = None

    def _spawn(
        self,
        *args: str,
        name: str,
        env: dict[str, str] | None = None,
        pipe: bool = False,
        cwd: Path | None = None,
        prefix: tuple[str, ...] = (),
    ) -> subprocess.Popen[str]:
        log = open(self.tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        # From another folder, the console script: `python -m` would put that folder on sys.path.
        command = (
            [str(Path(sys.executable).parent / "potato-queue")] if cwd else [sys.executable, "-m", "potato_queue.cli"]
        )
        proc = subprocess.Popen(
            [*prefix, *command, *args],
            stdout=subprocess.PIPE if pipe else log,
            stderr=log,
            text=True,
            env={**self.env, **(env or {})},
            start_new_session=True,
            cwd=cwd,
        )
        self.procs.append(proc)
        return proc

    @property
    def project_config(self) -> ProjectConfig:
        """The project's config, as the processes read it."""
        if self._project_config is None:
            self._project_config = load_checked(self.config)
        return self._project_config

    def serve(
        self,
        host: str = "127.0.0.1",
        *args: str,
        open_files: int | None = None,
        env: dict[str, str] | None = None,
        port: int = 0,
    ) -> str:
        """`potato-queue serve`; `open_files` runs it under that RLIMIT_NOFILE (soft and hard), as a unit would."""
        prefix = ("prlimit", f"--nofile={open_files}:{open_files}", "--") if open_files else ()
        proc = self._spawn(
            "serve",
            str(self.config),
            "--host",
            host,
            "--port",
            str(port),
            *args,
            name="server",
            pipe=True,
            prefix=prefix,
            env=env,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " at http" in line, line + (self.tmp_path / "server.log").read_text()
        self.url = line.rsplit(" at ", 1)[1].strip()
        self.server = proc
        return self.url

    def stop_server(self) -> None:
        """The server alone stopped (SIGTERM, as systemd stops it); `serve_again` starts it on the same port."""
        assert self.server is not None
        self.server.terminate()
        self.server.wait(30)

    def serve_again(self) -> str:
        port = urllib.parse.urlsplit(self.url).port
        assert port is not None
        return self.serve(port=port)

    def executor(self, env: dict[str, str] | None = None, cwd: Path | None = None, *args: str) -> subprocess.Popen[str]:
        return self._spawn("executor", str(self.config), *args, name=f"executor{len(self.procs)}", env=env, cwd=cwd)

    def stop(self, reaper: Reaper | None = None) -> None:
        """SIGTERM to every process's group, and wait until they are gone (SIGKILL after 10 s); with a `reaper`,
        it waits for them instead, and this returns at once."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        if reaper is None:
            reap(self.procs)
        else:
            reaper.reap(self.procs)

    # -- the admin API, as a client would use it ---------------------------------
    def api(self, method: str, path: str, body: Any = None, key: str | None = ADMIN_KEY) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}/admin/training/api{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key is not None:
            req.add_header("X-API-Key", key)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl_context) as resp:
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


# ---------------------------------------------------------------- runs and their processes

TERMINAL = {"succeeded", "failed", "cancelled"}


def build_tiny_model(folder: Path, words: list[str] | None = None, seed: int | None = 0) -> Path:
    """A 2-layer, 32-wide BERT with a word-level vocabulary of `words` (by default the example's reviews'),
    built here (no download); its starting weights drawn after `seed` (None: unseeded)."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    if words is None:
        texts = [row["text"] for row in json.loads((SMALL_PROJECT / "data" / "reviews.json").read_text())]
        words = sorted({w.strip(".,").lower() for t in texts for w in t.split()})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {word: i for i, word in enumerate(specials + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    ).save_pretrained(folder)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
    )
    if seed is not None:  # the same starting weights every session: a fine-tune's scores depend on no random draw
        torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def run_paths(svc: Services, run_id: str) -> RunPaths:
    """The run's folder and its files, named as the store names them (store/keys.py's RunPaths)."""
    return RunPaths.of(svc.project_config, run_id)


def _stat_fields(pid: int | str) -> list[str]:
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def alive_cmd(pid: int) -> str | None:
    """The command line of a live (not zombie) process, else None."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        state = _stat_fields(pid)[0]
    except (OSError, IndexError):
        return None
    return None if state == "Z" else cmd


def session_of(pid: int | str) -> int | None:
    try:
        return int(_stat_fields(pid)[3])
    except (OSError, ValueError, IndexError):
        return None


def parent_of(pid: int | str) -> int | None:
    try:
        return int(_stat_fields(pid)[1])
    except (OSError, ValueError, IndexError):
        return None


def pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def agent_pid(run_dir: Path) -> int:
    """The agent's pid, from run.log (a pre-started agent's command line does not name the run)."""
    match = re.search(r"started the agent on this machine \(pid (\d+)", (run_dir / "run.log").read_text())
    assert match, (run_dir / "run.log").read_text()
    return int(match.group(1))


def processes_of(run_id: str, run_dir: Path | None = None) -> list[str]:
    """Live processes of the run: everything in its agent's session (agent, worker, the worker's
    children), and any process whose command line names the run."""
    agent = agent_pid(run_dir) if run_dir is not None else None
    found = []
    for pid in pids():
        cmd = alive_cmd(pid)
        if cmd and (run_id in cmd or (agent is not None and session_of(pid) == agent)):
            found.append(cmd)
    return found


# Longer than any test: a held run ends by what the test does to it.
HELD_S = 600


def held_run(services: Services, **where: Any) -> str:
    """A run that outlasts the test without torch: majority-baseline holding in its train phase (a step a
    second, a stop honoured at once), on `where`'s backend. For what happens to the processes, sessions and
    jobs around a worker (stopped, killed, silenced, cut off), which is the same for any trainer; a real
    fine-tune's loop is tested where its loop matters (cancel at its next step)."""
    return services.start_run(trainer="majority-baseline", schemas=["sentiment"], params={"hold_s": HELD_S}, **where)


def wait_running(services: Services, run_id: str, timeout_s: float = 60) -> dict[str, Any]:
    """Wait until the run's worker is training (its progress phase is `train`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = services.api("GET", f"/runs/{run_id}")[1]
        if run["state"] == "running" and (run.get("progress") or {}).get("phase") == "train":
            return run
        assert run["state"] not in TERMINAL, run
        time.sleep(0.1)
    raise AssertionError(f"{run_id} never reached training")


def job_as_the_executor_stores_it(store: Any, run_id: str, data: bytes, **fields: Any) -> None:
    """`data` as the run's bundle.tar.gz and its Job in run.json, as RunLife leaves them before the launch
    (wire/job.py's one shape): for tests that drive the agent protocol by hand."""
    import hashlib

    from potato_queue.runs.job import heartbeat_interval_s, max_predictions_bytes
    from potato_queue.wire.job import BundleRef, Job

    record = store.read(run_id)
    store.paths(run_id).bundle.write_bytes(data)
    fields.setdefault("bundle", BundleRef(len(data), hashlib.sha256(data).hexdigest()))
    job = Job(
        run_id=run_id,
        trainer=record["trainer"],
        schemas=record["schemas"],
        heartbeat_interval_s=heartbeat_interval_s(store.config, record["backend"]),
        max_predictions_bytes=max_predictions_bytes(store.config),
        **fields,
    )
    store.update(run_id, job=job.to_dict())


def wait_until(condition: Any, timeout_s: float = 30, what: str = "the condition") -> None:
    """Poll `condition()` every 50 ms until it holds (an event another process makes happen)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not hold within {timeout_s} s"
        time.sleep(0.05)
