"""One contract, every backend: the same test functions, parametrized over the backends.

In the manner of huey's one storage suite run against every storage: each
backend joins by adding a harness to HARNESSES (how to configure a project
for it, and how to find, freeze or kill its agent and worker on the host it
runs them on). The local backend runs against real processes: a real Redis,
`potato-queue serve`, `potato-queue executor`, the agent and the worker.
Freezing a process is SIGSTOP: it stands for a host whose process hangs (a
stuck filesystem, a frozen VM); nothing is mocked. The module's cases share one
sshd and one SLURM cluster; each has its own server, executor and remote_dir.
The clocks themselves (heartbeat, max_wall_seconds, a wait's deadline) are
checked for every backend type in process, on a manual clock:
tests/unit/test_stub_contract.py.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from potato_queue.settings import SSH_CONFIG_ENV
from tests.agent_helpers import BACKEND, Agent, nat_host, register
from tests.lifecycle_helpers import (
    TERMINAL,
    Services,
    agent_pid,
    alive_cmd,
    held_run,
    parent_of,
    pids,
    processes_of,
    run_paths,
    session_of,
    started,
    wait_running,
)
from tests.netns import NatHost
from tests.ray_cluster import RayCluster
from tests.slurm_cluster import SlurmCluster
from tests.sshd import ALIAS, Sshd

LONG_HF = {"epochs": 500, "batch_size": 4}
Harness = Any  # LocalHarness | AgentHarness: the same methods, duck-typed


class LocalHarness:
    """The local backend: agent and worker are processes on this machine."""

    def close_shared(self) -> None:
        """Nothing is shared between cases."""

    name = "local"
    code_from_archive = False  # the worker runs this checkout's code
    hard_stop_exit_code = 128 + signal.SIGKILL  # the worker killed after grace

    @contextmanager
    def project(self, tmp_path: Path, redis_url: str, **training: Any) -> Iterator[Services]:
        training.pop("queue_timeout_s", None)  # only pull backends wait for a claim
        with started(tmp_path, redis_url, executors=1, backend="local", **training) as svc:
            yield svc

    def agent_log(self, svc: Services, run_id: str) -> str:
        return run_paths(svc, run_id).agent_log.read_text()

    def model_folder(self, svc: Services, run: dict[str, Any]) -> Path:
        """Where the run's model files are, checked against its artifact_uri."""
        artifacts = run_paths(svc, run["run_id"]).artifacts
        assert run["artifact_uri"] == str(artifacts)
        return artifacts

    def thaw(self, svc: Services, run_id: str) -> None:
        """After a frozen agent's run has failed: the executor killed what was left (nothing to do)."""

    def vanished_error(self, heartbeat_timeout_s: float) -> str:
        """How a run whose agent was killed fails (the executor sees its process exit)."""
        return "The agent stopped without reporting a result"

    def agent_pid(self, svc: Services, run_id: str) -> int:
        return agent_pid(run_paths(svc, run_id).dir)

    def worker_pid(self, svc: Services, run_id: str) -> int:
        agent = self.agent_pid(svc, run_id)
        (worker,) = [p for p in pids() if session_of(p) == agent and "potato_queue.worker" in (alive_cmd(p) or "")]
        return worker

    def leftovers(self, svc: Services, run_id: str) -> list[str]:
        return processes_of(run_id, run_paths(svc, run_id).dir)


class AgentHarness:
    """The agent backend: one `potato-queue training agent` in a network namespace behind a one-way
    firewall (tests/netns.py) runs the project's runs; its worker is its child there."""

    def close_shared(self) -> None:
        """Nothing is shared between cases (each has its own namespace)."""

    name = BACKEND
    code_from_archive = False  # the tests' agent runs this checkout's code (a user's, the agent.pyz it fetched)
    hard_stop_exit_code = 128 + signal.SIGKILL  # the worker killed after grace

    def __init__(self) -> None:
        self.nat: NatHost | None = None
        self.agent: Agent | None = None

    @contextmanager
    def project(self, tmp_path: Path, redis_url: str, **training: Any) -> Iterator[Services]:
        backend = {"type": "agent"}
        if "heartbeat_timeout_s" in training:  # an agent backend has its own
            backend["heartbeat_timeout_s"] = training.pop("heartbeat_timeout_s")
        if training.pop("queue_timeout_s", None):
            backend["queue_timeout_s"] = 3
        with (
            nat_host() as nat,
            started(
                tmp_path,
                redis_url,
                executors=1,
                host=nat.host_ip,
                backend=BACKEND,
                backends={BACKEND: backend},
                **training,
            ) as svc,
        ):
            self.nat, self.agent = nat, Agent(nat, svc, register(svc))
            try:
                yield svc
            finally:
                self.agent.stop()

    def agent_pid(self, svc: Services, run_id: str) -> int:
        assert self.agent is not None
        return self.agent.proc.pid

    def _run_processes(self, run_id: str) -> list[int]:
        """Processes on the training machine working in the run's folder (a worker waiting for the next
        run, started ahead, waits in the code's own folder)."""
        assert self.nat is not None and self.agent is not None
        run_dir = str(self.agent.workdir / run_id)
        found = []
        for pid in self.nat.pids():
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if cwd.startswith(run_dir) and alive_cmd(pid):
                found.append(pid)
        return found

    def worker_pid(self, svc: Services, run_id: str) -> int:
        (worker,) = [p for p in self._run_processes(run_id) if "potato_queue.worker" in (alive_cmd(p) or "")]
        return worker

    def leftovers(self, svc: Services, run_id: str) -> list[str]:
        return [alive_cmd(p) or "" for p in self._run_processes(run_id)]

    def agent_log(self, svc: Services, run_id: str) -> str:
        assert self.agent is not None
        return self.agent.output()

    def model_folder(self, svc: Services, run: dict[str, Any]) -> Path:
        host, folder = run["artifact_uri"].split(":", 1)
        assert self.agent is not None and host == socket.gethostname()
        assert folder.startswith(str(self.agent.workdir)), "the model files stay on the training machine"
        return Path(folder)

    def thaw(self, svc: Services, run_id: str) -> None:
        """A frozen agent behind NAT can be stopped by nobody: once it runs again, it learns that its run
        ended (its token is revoked) and stops the worker itself."""
        assert self.agent is not None
        os.kill(self.agent.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while self.leftovers(svc, run_id) and time.monotonic() < deadline:
            time.sleep(0.2)

    def vanished_error(self, heartbeat_timeout_s: float) -> str:
        # Behind NAT nothing can be seen of the agent but its silence.
        return f"No word from the agent on {self.name} for {heartbeat_timeout_s:g} seconds"


class SshHarness:
    """The ssh backend: a real sshd on 127.0.0.1 (tests/sshd.py) is the GPU server; the agent and the
    worker run there under the login account, started over ssh by the executor."""

    name = "gpu-server"
    code_from_archive = True  # the agent.pyz the executor copied to the host
    hard_stop_exit_code = 128 + signal.SIGKILL  # the worker killed after grace

    def __init__(self) -> None:
        self.sshd: Sshd | None = None  # one for the module's cases (close_shared)
        self.remote = Path()
        self.frozen: list[int] = []

    @contextmanager
    def project(self, tmp_path: Path, redis_url: str, **training: Any) -> Iterator[Services]:
        training.pop("queue_timeout_s", None)  # an ssh run waits for its connection, bounded by ssh itself
        self.frozen = []
        try:
            backend = self.backend(tmp_path)
            if "heartbeat_timeout_s" in training:
                backend["heartbeat_timeout_s"] = training.pop("heartbeat_timeout_s")
            if self.sshd is None:
                self.sshd = Sshd(Path(tempfile.mkdtemp(prefix="pq-sshd-")))
            with started(
                tmp_path, redis_url, executors=0, backend=self.name, backends={self.name: backend}, **training
            ) as svc:
                svc.executor(env={SSH_CONFIG_ENV: str(self.sshd.config)})
                yield svc
        finally:
            for pid in self.frozen:
                _continue(pid)
            self.close()

    def close_shared(self) -> None:
        """What the module's cases shared: sshd."""
        if self.sshd is not None:
            self.sshd.close()
            shutil.rmtree(self.sshd.root, ignore_errors=True)
            self.sshd = None

    def backend(self, tmp_path: Path) -> dict[str, Any]:
        self.remote = tmp_path / "remote"
        return {"type": "ssh", "host": ALIAS, "python": sys.executable, "gpus": "none", "remote_dir": str(self.remote)}

    def close(self) -> None:
        """What the harness started for the project besides sshd."""

    def _ours(self) -> list[int]:
        """Our processes on the host: everything started from the code copied to remote_dir."""
        marker = f"{self.remote}/code/"
        return [p for p in pids() if marker in (alive_cmd(p) or "")]

    def agent_pid(self, svc: Services, run_id: str) -> int:
        (agent,) = [p for p in self._ours() if "potato_queue.agent" in (alive_cmd(p) or "")]
        return agent

    def worker_pid(self, svc: Services, run_id: str) -> int:
        agent = self.agent_pid(svc, run_id)
        (worker,) = [p for p in self._ours() if parent_of(p) == agent and "potato_queue.worker" in (alive_cmd(p) or "")]
        return worker

    def leftovers(self, svc: Services, run_id: str) -> list[str]:
        deadline = time.monotonic() + 10  # the session's end reaches the host's processes within moments
        while self._ours() and time.monotonic() < deadline:
            time.sleep(0.1)
        sockets = [str(p) for p in Path("/tmp").glob(f"potato-queue-{run_id}-*.sock")]
        jobs = [str(p) for p in (self.remote / "jobs").glob(f"{run_id}*")]
        return [alive_cmd(p) or "" for p in self._ours()] + sockets + jobs

    def agent_log(self, svc: Services, run_id: str) -> str:
        return run_paths(svc, run_id).agent_log.read_text()

    def model_folder(self, svc: Services, run: dict[str, Any]) -> Path:
        artifacts = run_paths(svc, run["run_id"]).artifacts
        assert run["artifact_uri"] == str(artifacts), "the model files came back from the host"
        return artifacts

    def thaw(self, svc: Services, run_id: str) -> None:
        """The executor closed the frozen agent's session; once it runs again it sees that and stops."""
        for pid in self.frozen:
            _continue(pid)

    def vanished_error(self, heartbeat_timeout_s: float) -> str:
        return "The agent stopped without reporting a result"


class SlurmHarness(SshHarness):
    """The slurm backend: the same sshd is the login node, a real single-node SLURM (tests/slurm_cluster.py)
    runs the worker as a batch job; remote_dir is outside /tmp, as SLURM's shared storage must be."""

    name = "cluster"
    # SLURM's hard stop (scancel) sends SIGCONT and SIGTERM before its SIGKILL: the frozen worker runs again,
    # takes the SIGTERM it had pending, and exits as cancelled.
    hard_stop_exit_code = 4

    def __init__(self) -> None:
        super().__init__()
        self.slurm: SlurmCluster | None = None  # one for the module's cases (close_shared)

    def backend(self, tmp_path: Path) -> dict[str, Any]:
        self.remote = Path(tempfile.mkdtemp(prefix="pq-contract-", dir="/srv"))
        if self.slurm is None:
            self.slurm = SlurmCluster(Path(tempfile.mkdtemp(prefix="pq-contract-slurm-")))
        return {
            "type": "slurm",
            "host": ALIAS,
            "python": sys.executable,
            "job_python": sys.executable,
            "remote_dir": str(self.remote),
            "poll_interval_s": 1,
            "env": self.slurm.env,
        }

    def close(self) -> None:
        if self.slurm is not None:
            self.slurm.wait_empty()  # the next case finds the node idle
        shutil.rmtree(self.remote, ignore_errors=True)

    def close_shared(self) -> None:
        if self.slurm is not None:
            self.slurm.close()
            shutil.rmtree(self.slurm.root, ignore_errors=True)
            self.slurm = None
        super().close_shared()

    def worker_pid(self, svc: Services, run_id: str) -> int:
        # The worker's parent is the job's shell, under slurmd: not the agent on the login node.
        (worker,) = [p for p in self._ours() if "potato_queue.worker --spec" in (alive_cmd(p) or "")]
        return worker

    def leftovers(self, svc: Services, run_id: str) -> list[str]:
        assert self.slurm is not None
        deadline = time.monotonic() + 20  # SLURM ends a cancelled job within its KillWait
        while self.slurm.queue() and time.monotonic() < deadline:
            time.sleep(0.1)
        return [f"SLURM job {line}" for line in self.slurm.queue()] + super().leftovers(svc, run_id)


class RayHarness:
    """The ray backend: a real Ray head (tests/ray_cluster.py) runs each run as one Ray job, whose entrypoint
    becomes the agent on the node (this machine); the worker is the agent's child there."""

    name = "ray-cluster"
    code_from_archive = True  # the agent.pyz the job fetched from the server
    hard_stop_exit_code = 128 + signal.SIGKILL  # the worker killed after grace, by its agent

    def __init__(self) -> None:
        self.ray: RayCluster | None = None  # one for the module's cases (close_shared)
        self.workdir = Path()

    @contextmanager
    def project(self, tmp_path: Path, redis_url: str, **training: Any) -> Iterator[Services]:
        training.pop("queue_timeout_s", None)
        if self.ray is None:
            self.ray = RayCluster()
        self.workdir = tmp_path / "node"
        backend = {"type": "ray", "address": self.ray.address, "python": sys.executable, "workdir": str(self.workdir)}
        if "heartbeat_timeout_s" in training:
            backend["heartbeat_timeout_s"] = training.pop("heartbeat_timeout_s")
        with started(
            tmp_path, redis_url, executors=1, backend=self.name, backends={self.name: backend}, **training
        ) as svc:
            yield svc

    def close_shared(self) -> None:
        if self.ray is not None:
            self.ray.close()
            self.ray = None

    def _ours(self) -> list[int]:
        """Our processes on the node: everything started from the code the job fetched into the workdir."""
        marker = f"{self.workdir}/code/"
        return [p for p in pids() if marker in (alive_cmd(p) or "")]

    def agent_pid(self, svc: Services, run_id: str) -> int:
        (agent,) = [p for p in self._ours() if f" run --server {svc.url} --run-id {run_id}" in (alive_cmd(p) or "")]
        return agent

    def worker_pid(self, svc: Services, run_id: str) -> int:
        agent = self.agent_pid(svc, run_id)
        (worker,) = [p for p in pids() if parent_of(p) == agent and "potato_queue.worker" in (alive_cmd(p) or "")]
        return worker

    def leftovers(self, svc: Services, run_id: str) -> list[str]:
        assert self.ray is not None
        deadline = time.monotonic() + 20  # Ray's stop reaches the job's processes within its stop wait
        job = f"potato-queue-{run_id}"
        while (self._ours() or (self.ray.job(job) or {}).get("status") == "RUNNING") and time.monotonic() < deadline:
            time.sleep(0.1)
        running = [f"Ray job {job}"] if (self.ray.job(job) or {}).get("status") in ("RUNNING", "PENDING") else []
        return [alive_cmd(p) or "" for p in self._ours()] + running

    def agent_log(self, svc: Services, run_id: str) -> str:
        assert self.ray is not None
        job = self.ray.job(f"potato-queue-{run_id}")
        assert job is not None
        deadline = time.monotonic() + 10  # Ray writes the job's log as the driver prints
        while job["status"] in ("PENDING", "RUNNING") and time.monotonic() < deadline:
            time.sleep(0.1)
            job = self.ray.job(job["submission_id"]) or job
        return self.ray.logs(job)

    def model_folder(self, svc: Services, run: dict[str, Any]) -> Path:
        artifacts = run_paths(svc, run["run_id"]).artifacts
        assert run["artifact_uri"] == str(artifacts), "the model files came back from the node, over HTTP"
        return artifacts

    def thaw(self, svc: Services, run_id: str) -> None:
        """The executor stopped the frozen agent's job: the agent, running again, takes Ray's SIGTERM (or its
        SIGKILL came already) and ends with its worker."""
        for pid in self._ours():
            _continue(pid)

    def vanished_error(self, heartbeat_timeout_s: float) -> str:
        # The agent was the job's entrypoint: Ray sees its end and says so.
        return "Ray job potato-queue-"


def _continue(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


HARNESSES: dict[str, Harness] = {
    "local": LocalHarness(),
    "agent": AgentHarness(),
    "ssh": SshHarness(),
    "slurm": SlurmHarness(),
    "ray": RayHarness(),
}


@pytest.fixture(scope="module", autouse=True)
def shared_stacks() -> Iterator[None]:
    """One sshd and one SLURM cluster for the module's cases (each case has its own server, executor and
    remote_dir), stopped when the module is done."""
    yield
    for harness in HARNESSES.values():
        harness.close_shared()


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest) -> Harness:
    return HARNESSES[request.param]


@contextmanager
def project(tmp_path: Path, redis_url: str, harness: Harness, **training: Any) -> Iterator[Services]:
    with harness.project(tmp_path, redis_url, **training) as svc:
        yield svc


def long_run(svc: Services, tiny_model: Path) -> str:
    """A real fine-tune that outlasts the test: for what its training loop does (a cancel at its next step)."""
    return svc.start_run(
        trainer="hf-text-classification", schemas=["sentiment"], params={"model_name": str(tiny_model), **LONG_HF}
    )


def test_a_run_succeeds_and_collects_its_artifacts(
    tmp_path: Path, redis_server_url: str, harness: LocalHarness
) -> None:
    """With a learning curve: its fits run where the run runs, and what the run page shows of the run (the
    curve, what to label next, the quality report) is there whatever the backend."""
    with project(tmp_path, redis_server_url, harness, grace_seconds=2) as svc:
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], params={"learning_curve": True})
        run = svc.wait_for(run_id, TERMINAL)
        assert run["state"] == "succeeded", (run, svc.logs())
        assert run["ran_on"] == harness.name and run["exit_code"] == 0
        assert sorted(p.name for p in harness.model_folder(svc, run).iterdir())
        # One scorer: the worker's metrics and the server's held-out scores agree on the same predictions.
        for split in ("val", "test"):
            held_out = run["held_out"]["sentiment"][split]
            assert held_out["n"] > 0
            assert run["metrics"][f"{split}/accuracy"] == held_out["accuracy"]
            assert run["metrics"][f"{split}/macro_f1"] == held_out["macro_f1"]
        curve = svc.api("GET", f"/runs/{run_id}/curve")[1]["schemas"]["sentiment"]["points"]
        assert [p["percent"] for p in curve] == [25, 50, 75, 100], curve
        assert curve[-1]["test_macro_f1"] == run["held_out"]["sentiment"]["test"]["macro_f1"]
        status, found = svc.api("GET", f"/runs/{run_id}/next?limit=5")
        assert status == 200 and len(found["items"]) == 5 and found["items"][0]["uncertainty"] > 0, found
        assert svc.api("GET", f"/runs/{run_id}/quality")[1]["schemas"]["sentiment"]["n"] == sum(
            run["held_out"]["sentiment"][s]["n"] for s in ("val", "test")
        )
        assert_reproducibility(svc, run, harness)
        # No GPU on this machine: every backend's agent says why it measured none, never a figure of 0.
        usage = run["gpu_usage"]
        assert usage["gpus"] == [] and set(usage) == {"gpus", "why"}, usage
        expected = "SLURM job" if harness.name == "cluster" else "no nvidia-smi on"
        assert usage["why"].startswith(expected), usage
        assert harness.leftovers(svc, run_id) == []


def assert_reproducibility(svc: Services, run: dict[str, Any], harness: Harness) -> None:
    """The record's fields, whatever the backend: the server's half from the run, the host's from its worker
    (every backend's host is this machine here, with this Python and these packages)."""
    from importlib import metadata

    from potato_queue.code_package import agent_zipapp
    from potato_queue.worker.environment import code_sha256

    record, backend = run["reproducibility"], harness.name
    assert record["code_sha256"] == (agent_zipapp().sha256 if harness.code_from_archive else code_sha256()), record
    seed = svc.project_config.model_training.split_seed
    assert (record["trainer"], record["params"], record["backend"]) == (run["trainer"], run["params"], backend)
    assert record["bundle_digest"] == run["bundle"]["digest"], record
    assert record["seeds"] == {"split_seed": seed, "training_seed": seed}, record
    assert (record["python"], record["host"]) == (platform.python_version(), socket.gethostname()), record
    assert record["packages"]["scikit-learn"] == metadata.version("scikit-learn"), record
    assert (record["cuda"], record["driver"], record["gpus"]) == (None, None, []), "sklearn-text imports no torch"


def test_an_llm_fine_tunes_with_lora_and_its_adapter_comes_back(
    tmp_path: Path, redis_server_url: str, harness: LocalHarness, tiny_llm: Path
) -> None:
    """hf-llm-lora on every backend, on the CPU (4-bit and GPUs: bench/gpu_check.py on a GPU machine)."""
    with project(tmp_path, redis_server_url, harness, grace_seconds=2) as svc:
        run_id = svc.start_run(
            trainer="hf-llm-lora",
            schemas=["sentiment"],
            params={
                "model_name": str(tiny_llm),
                "epochs": 1,
                "batch_size": 8,
                "max_length": 32,
                "lora": {"r": 4, "alpha": 8},
            },
        )
        run = svc.wait_for(run_id, TERMINAL)
        assert run["state"] == "succeeded", (run, svc.logs())
        folder = harness.model_folder(svc, run)
        assert sorted(p.name for p in (folder / "sentiment").iterdir()) == [
            "README.md",
            "adapter_config.json",
            "adapter_model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
        assert run["held_out"]["sentiment"]["test"]["n"] > 0
        assert harness.leftovers(svc, run_id) == []


def test_cancel_within_grace_ends_cancelled(
    tmp_path: Path, redis_server_url: str, harness: LocalHarness, tiny_model: Path
) -> None:
    # Grace to spare: the worker honours SIGTERM at its next step, which a loaded CI machine (three test
    # workers on two cores) once delayed past 5 s.
    with project(tmp_path, redis_server_url, harness, grace_seconds=15) as svc:
        run_id = long_run(svc, tiny_model)
        wait_running(svc, run_id)
        assert svc.api("POST", f"/runs/{run_id}/cancel")[0] == 200
        run = svc.wait_for(run_id, TERMINAL, timeout_s=30)
        assert (run["state"], run["exit_code"]) == ("cancelled", 4), run
        events = svc.api("GET", f"/runs/{run_id}/events")[1]
        assert any(e["event"] == "status" and e.get("state") == "cancelled" for e in events)
        # A run that ended without a result has the server's half of its record, and says what it lacks.
        record = run["reproducibility"]
        assert (record["bundle_digest"], record["trainer"]) == (run["bundle"]["digest"], "hf-text-classification")
        assert record["python"].startswith("not reported: the worker sends it with its result"), record
        assert harness.leftovers(svc, run_id) == []


def test_a_worker_deaf_to_sigterm_is_killed_after_grace_and_the_run_is_cancelled(
    tmp_path: Path, redis_server_url: str, harness: LocalHarness
) -> None:
    grace_s = 2
    with project(tmp_path, redis_server_url, harness, grace_seconds=grace_s) as svc:
        run_id = held_run(svc)
        wait_running(svc, run_id)
        os.kill(harness.worker_pid(svc, run_id), signal.SIGSTOP)  # SIGTERM now does nothing; SIGKILL still works
        asked = time.monotonic()
        svc.api("POST", f"/runs/{run_id}/cancel")
        run = svc.wait_for(run_id, TERMINAL, timeout_s=30)
        assert time.monotonic() - asked >= grace_s, "the run ended before grace_seconds had passed"
        assert (run["state"], run["exit_code"]) == ("cancelled", harness.hard_stop_exit_code), run
        log = harness.agent_log(svc, run_id)
        assert f"still running {grace_s} s after SIGTERM: SIGKILL" in log, log
        assert harness.leftovers(svc, run_id) == []


def test_the_agent_vanishing_fails_the_run_with_its_last_output(
    tmp_path: Path, redis_server_url: str, harness: LocalHarness
) -> None:
    with project(tmp_path, redis_server_url, harness, grace_seconds=2, heartbeat_timeout_s=5) as svc:
        run_id = held_run(svc)
        wait_running(svc, run_id)
        os.kill(harness.agent_pid(svc, run_id), signal.SIGKILL)
        run = svc.wait_for(run_id, TERMINAL, timeout_s=30)
        assert run["state"] == "failed"
        assert run["error"].startswith(harness.vanished_error(5)), run["error"]
        if harness.name == "local":  # behind NAT, the agent's last output stays on its machine
            assert "its last output:" in run["error"] and "worker started" in run["error"], run["error"]
        assert harness.leftovers(svc, run_id) == []


def test_silence_fails_the_run_with_no_word_from_the_agent(
    tmp_path: Path, redis_server_url: str, harness: LocalHarness
) -> None:
    with project(tmp_path, redis_server_url, harness, grace_seconds=2, heartbeat_timeout_s=3) as svc:
        run_id = held_run(svc)
        wait_running(svc, run_id)
        os.kill(harness.agent_pid(svc, run_id), signal.SIGSTOP)
        run = svc.wait_for(run_id, TERMINAL, timeout_s=30)
        assert (run["state"], run["error"]) == ("failed", f"No word from the agent on {harness.name} for 3 seconds")
        harness.thaw(svc, run_id)
        assert harness.leftovers(svc, run_id) == []


def test_cancel_before_the_trainers_loop_stops_the_worker_at_once(
    tmp_path: Path, redis_server_url: str, harness: LocalHarness, tiny_model: Path
) -> None:
    """While torch and the model load there is nothing to save: SIGTERM ends the worker then and there,
    not after grace_seconds, and the run is `cancelled`. Loading a tiny model takes a second or two: on a
    loaded machine the cancel can land after the trainer's loop began (it is then honoured at a step), and then
    the scenario is run again, up to three times."""
    with project(tmp_path, redis_server_url, harness, grace_seconds=20) as svc:
        for _ in range(3):
            run_id = long_run(svc, tiny_model)
            deadline = time.monotonic() + 60
            while "loading trainer" not in str(svc.api("GET", f"/runs/{run_id}")[1].get("step")):
                assert time.monotonic() < deadline, svc.api("GET", f"/runs/{run_id}")[1]
                time.sleep(0.02)
            svc.api("POST", f"/runs/{run_id}/cancel")
            run = svc.wait_for(run_id, TERMINAL, timeout_s=60)
            assert (run["state"], run["exit_code"]) == ("cancelled", 4), run
            agent_log = harness.agent_log(svc, run_id)
            assert "SIGTERM to" in agent_log and "after SIGTERM: SIGKILL" not in agent_log, agent_log
            assert harness.leftovers(svc, run_id) == []
            events = svc.api("GET", f"/runs/{run_id}/events")[1]
            if any("before the trainer's loop began" in str(e.get("step")) for e in events):
                return
            # Otherwise the loop had begun when the SIGTERM landed (before or after its first progress event):
            # the cancel was honoured at a step, as test_cancel_within_grace_ends_cancelled checks; again.
        raise AssertionError("the cancel never landed while the trainer loaded, in three runs")
