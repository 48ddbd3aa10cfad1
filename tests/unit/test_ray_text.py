"""The ray backend's pure functions: what executors/rayjobs/text.py sends to Ray's Jobs API and reads back,
check.py's placement verdict on a node list shaped like Ray's, the RayBackend config model, and
host/ray_entry.py's agent fetch against a tiny local HTTP server."""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import shlex
import stat
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from potato_queue.backends.models import RayBackend
from potato_queue.executors.rayjobs import text
from potato_queue.executors.rayjobs.check import placement
from potato_queue.worker import environment

pytestmark = pytest.mark.unit

ray_entry = importlib.import_module("potato_queue.host.ray_entry")
ENTRY = Path(ray_entry.__file__).read_text()
CODE = "one-time-code-7f3a9c"
SHA = "ab" * 32


def _backend(**fields: Any) -> RayBackend:
    return RayBackend(address="http://head:8265", **fields)


def test_a_runs_ray_job_is_named_after_the_run() -> None:
    assert text.submission_id("r42") == "potato-queue-r42"


def test_the_entrypoint_runs_the_entry_file_isolated_with_the_runs_arguments() -> None:
    backend = _backend(python="/opt/py env/bin/python", workdir="~/ray work")
    line = text.entrypoint(backend, "http://srv:8000", "r1", SHA)
    assert shlex.split(line) == [
        "/opt/py env/bin/python",
        "-I",
        "-c",
        ENTRY,
        "http://srv:8000",
        "r1",
        SHA,
        "~/ray work",
    ]


def test_the_one_time_code_is_never_on_the_command_line() -> None:
    body = text.job_request(_backend(), "http://srv:8000", ("r1", CODE), SHA, 30.0)
    assert CODE not in body["entrypoint"]


def test_resources_are_always_asked_with_one_cpu_by_default() -> None:
    assert text.asked_resources(_backend(num_gpus=0)) == {"entrypoint_num_gpus": 0, "entrypoint_num_cpus": 1}


def test_memory_is_asked_in_bytes_and_custom_resources_are_passed() -> None:
    asked = text.asked_resources(_backend(num_gpus=2, num_cpus=4, memory_mb=512, resources={"a100": 1}))
    assert asked == {
        "entrypoint_num_gpus": 2,
        "entrypoint_num_cpus": 4,
        "entrypoint_memory": 512 * 1024 * 1024,
        "entrypoint_resources": {"a100": 1},
    }


def test_the_job_request_carries_the_code_and_a_stop_wait_past_the_grace() -> None:
    body = text.job_request(_backend(num_gpus=2), "http://srv:8000", ("r1", CODE), SHA, 30.5)
    assert body["runtime_env"] == {"env_vars": {"POTATO_QUEUE_RUN_CODE": CODE, "RAY_JOB_STOP_WAIT_TIME_S": "46"}}
    assert body["submission_id"] == "potato-queue-r1" and body["metadata"] == {"potato_queue_run": "r1"}
    assert body["entrypoint_num_gpus"] == 2 and body["entrypoint_num_cpus"] == 1


def test_the_code_appears_only_in_the_jobs_environment() -> None:
    body = text.job_request(_backend(), "http://srv:8000", ("r1", CODE), SHA, 30.0)
    assert json.dumps(body).count(CODE) == 1
    body["runtime_env"]["env_vars"].pop("POTATO_QUEUE_RUN_CODE")
    assert CODE not in json.dumps(body)


@pytest.mark.parametrize("status", ["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"])
def test_each_of_rays_job_statuses_is_read(status: str) -> None:
    state = text.job_state({"status": status, "message": "m", "driver_exit_code": 3})
    assert state == text.JobState(status, "m", 3)


def test_a_job_without_message_or_exit_code_reads_as_empty() -> None:
    assert text.job_state({"status": "RUNNING", "message": None}) == text.JobState("RUNNING", "", None)


@pytest.mark.parametrize("reply", [{"status": "EXPLODED"}, "EXPLODED", ["EXPLODED"]])
def test_an_unknown_status_or_a_reply_that_is_not_an_object_is_refused_by_name(reply: Any) -> None:
    with pytest.raises(ValueError, match="EXPLODED"):
        text.job_state(reply)


def test_a_pending_timeout_names_the_job_the_head_what_ray_said_and_what_was_asked() -> None:
    backend = _backend(num_gpus=2, pending_timeout_s=90)
    message = text.pending_expired(backend, "potato-queue-r1", "waiting for GPUs")
    for part in ("potato-queue-r1", "head:8265", "90 s", "'waiting for GPUs'", "num_gpus=2, num_cpus=1", "fix:"):
        assert part in message, part


def test_a_pending_timeout_names_the_custom_resources_asked() -> None:
    message = text.pending_expired(_backend(resources={"a100": 1}), "j", "")
    assert "num_gpus=1, num_cpus=1, a100=1" in message


def _node(gpus: float, cpus: float, state: str = "ALIVE") -> dict[str, Any]:
    return {"node_ip": "10.0.0.1", "state": state, "is_head_node": False, "resources_total": {"GPU": gpus, "CPU": cpus}}


def test_a_job_that_fits_a_free_node_is_placed_now() -> None:
    assert placement(_backend(), [_node(1, 2)], {"GPU": [0.0, 1.0], "CPU": [0.0, 2.0]}) == (True, True)


def test_a_job_that_fits_a_busy_node_is_placed_later() -> None:
    assert placement(_backend(), [_node(1, 2)], {"GPU": [1.0, 1.0], "CPU": [0.0, 2.0]}) == (True, False)


def test_a_job_bigger_than_every_node_is_never_placed() -> None:
    nodes = [_node(1, 8), _node(1, 8)]
    usage = {"GPU": [0.0, 2.0], "CPU": [0.0, 16.0]}
    assert placement(_backend(num_gpus=2), nodes, usage) == (False, False)


def test_a_dead_node_does_not_count() -> None:
    usage = {"GPU": [0.0, 4.0], "CPU": [0.0, 8.0]}
    assert placement(_backend(), [_node(4, 8, state="DEAD")], usage) == (False, False)


def test_a_job_with_no_gpus_fits_a_cpu_only_node() -> None:
    assert placement(_backend(num_gpus=0), [_node(0, 2)], {"CPU": [0.0, 2.0]}) == (True, True)


@pytest.mark.parametrize("address", ["http://head:8265", "https://head.example.org:443/", "http://10.0.0.5:8265"])
def test_an_http_address_of_the_head_is_accepted(address: str) -> None:
    assert RayBackend(address=address).address == address


@pytest.mark.parametrize(
    "address",
    ["head:8265", "http://head:8265/api", "ftp://head:8265", "http://he ad:8265", "http://:8265", "http://head:port"],
)
def test_an_address_with_a_path_without_a_scheme_or_a_host_or_a_port_that_is_no_number_is_refused(address: str) -> None:
    with pytest.raises(ValidationError):
        RayBackend(address=address)


def test_the_head_is_host_and_port_without_a_trailing_slash() -> None:
    assert RayBackend(address="https://head:8265/").head == "head:8265"


@pytest.mark.parametrize("name", ["RAY_TOKEN", "_ray_token2"])
def test_token_env_names_an_environment_variable(name: str) -> None:
    assert RayBackend(address="http://head:8265", token_env=name).token_env == name


@pytest.mark.parametrize("value", ["secret token", "1TOKEN", "tok-en"])
def test_token_env_that_looks_like_a_value_is_refused(value: str) -> None:
    with pytest.raises(ValidationError):
        RayBackend(address="http://head:8265", token_env=value)


def test_a_negative_gpu_count_is_refused() -> None:
    with pytest.raises(ValidationError):
        _backend(num_gpus=-1)


class _Agent(ThreadingHTTPServer):
    payload = b""
    requests = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Agent

    def do_GET(self) -> None:
        self.server.requests += 1
        found = self.path == "/api/training/agent/v1/agent.pyz"
        body = self.server.payload if found else b""
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def agent_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Agent]:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    server = _Agent(("127.0.0.1", 0), _Handler)
    server.payload = _zipapp()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def _zipapp() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("__main__.py", "print('agent')\n")
        archive.writestr("potato_queue/__init__.py", "")
    return out.getvalue()


def _url(server: _Agent) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_the_agent_is_unpacked_private_when_its_sha256_matches_and_runs_as_a_folder(
    agent_server: _Agent, tmp_path: Path
) -> None:
    sha = hashlib.sha256(agent_server.payload).hexdigest()
    old = os.umask(0o077)  # the entry's own (main sets it first)
    try:
        path = Path(ray_entry.fetch_agent(_url(agent_server), sha, str(tmp_path)))
    finally:
        os.umask(old)
    assert path == tmp_path / "code" / sha and (path / "potato_queue" / "__init__.py").is_file()
    assert stat.S_IMODE((path / "__main__.py").stat().st_mode) == 0o600
    assert {stat.S_IMODE(p.stat().st_mode) for p in (path, path / "potato_queue", path.parent)} == {0o700}
    ran = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert ran.stdout == "agent\n"
    # The run's record names the code by the archive's sha256, as it would run from the archive.
    assert (path / environment.UNPACKED_FROM).read_text() == sha + "\n"
    assert ray_entry.UNPACKED_FROM == environment.UNPACKED_FROM


def test_an_agent_already_kept_is_not_fetched_again(agent_server: _Agent, tmp_path: Path) -> None:
    sha = hashlib.sha256(agent_server.payload).hexdigest()
    first = ray_entry.fetch_agent(_url(agent_server), sha, str(tmp_path))
    assert ray_entry.fetch_agent(_url(agent_server), sha, str(tmp_path)) == first
    assert agent_server.requests == 1


def test_an_agent_with_another_sha256_exits_and_leaves_no_file(agent_server: _Agent, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        ray_entry.fetch_agent(_url(agent_server), SHA, str(tmp_path))
    assert list((tmp_path / "code").iterdir()) == []
    # A copy unpacked by a job that died halfway is not taken for the agent: it is fetched whole again.
    sha = hashlib.sha256(agent_server.payload).hexdigest()
    (tmp_path / "code" / sha / "potato_queue").mkdir(parents=True)
    path = Path(ray_entry.fetch_agent(_url(agent_server), sha, str(tmp_path)))
    assert (path / "__main__.py").is_file()


def test_a_pending_timeout_says_memory_as_the_config_wrote_it() -> None:
    said = text.pending_expired(_backend(memory_mb=1024), "potato-queue-r1", "waiting")
    assert "num_gpus=1, num_cpus=1, memory_mb=1024;" in said


def test_a_requeued_runs_job_is_a_job_of_its_own() -> None:
    assert [text.submission_id("r1", attempt) for attempt in (0, 1, 2)] == [
        "potato-queue-r1",
        "potato-queue-r1-2",
        "potato-queue-r1-3",
    ]


def test_only_a_job_whose_node_died_counts_as_a_lost_node() -> None:
    died = "Job supervisor actor died: ...\nThe actor died because its node has died. Node Id: 3df3"
    lost = text.job_state({"status": "FAILED", "message": died, "error_type": "JOB_SUPERVISOR_ACTOR_DIED"})
    assert lost.node_lost()
    killed = text.job_state({"status": "FAILED", "message": "exited with -9", "driver_exit_code": -9})
    assert not killed.node_lost()
    other = text.job_state(
        {"status": "FAILED", "message": "died: out of memory", "error_type": "JOB_SUPERVISOR_ACTOR_DIED"}
    )
    assert not other.node_lost()


def test_a_waiting_jobs_removal_runs_on_the_head_with_rays_own_python_and_names_only_the_job() -> None:
    body = text.removal_request("potato-queue-r42")
    # No resources asked: Ray runs the job on the head, whose Python has Ray (ray_entry's need not).
    assert body["entrypoint_num_cpus"] == 0 and "entrypoint_num_gpus" not in body and "runtime_env" not in body
    assert body["submission_id"] == "potato-queue-r42-removal"
    command = body["entrypoint"]
    assert subprocess.run(["sh", "-n", "-c", command], capture_output=True).returncode == 0
    words = shlex.split(command.split("-I -c ", 1)[1])
    assert words[0] == text.REMOVER_SOURCE and words[1] == "potato-queue-r42" and words[2] == "${lib%/ray/*}"
    compile(text.REMOVER_SOURCE, "remover", "exec")
    assert "_ray_internal_job_actor_" in text.REMOVER_SOURCE and "PENDING_CREATION" in text.REMOVER_SOURCE


def test_the_removal_by_hand_names_the_jobs_supervisor_in_rays_namespace() -> None:
    said = shlex.split(text.removal_by_hand("potato-queue-r42"))
    assert said[:2] == ["python", "-c"]
    assert (
        'ray.get_actor("_ray_internal_job_actor_potato-queue-r42", namespace="SUPERVISOR_ACTOR_RAY_NAMESPACE")'
        in (said[2])
    )
    compile(said[2], "by hand", "exec")


def test_the_check_job_asks_what_a_run_asks_and_hands_the_check_its_question_on_stdin(tmp_path: Path) -> None:
    backend = _backend(num_gpus=2, resources={"A100": 1})
    source = "import sys; print(sys.stdin.readline().strip())"
    body = text.check_job_request(backend, source, {"packages": ["torch"], "env": {}}, "potato-queue-check-ab12")
    assert body["entrypoint_num_gpus"] == 2 and body["entrypoint_resources"] == {"A100": 1}
    assert body["submission_id"] == "potato-queue-check-ab12" and "runtime_env" not in body
    # The shell Ray runs it with: the question reaches the check's stdin as one line, quoted whole.
    command = body["entrypoint"].replace("python3 -I", f"{shlex.quote(sys.executable)} -I")
    said = subprocess.run(["sh", "-c", command], capture_output=True, text=True, cwd=tmp_path).stdout
    assert json.loads(said) == {"packages": ["torch"], "env": {}}


def test_the_checks_answer_is_the_last_json_line_with_an_interpreter_in_rays_log() -> None:
    answer = {"python": "3.11.7", "executable": "/usr/bin/python3", "packages": {"torch": False}}
    logs = "\n".join(
        [
            "2026-12-08 01:00:00,000 INFO job_manager.py:581 -- Runtime env is setting up.",
            "Running entrypoint for job potato-queue-check-ab12: printf ... | python3 -I -c ...",
            '{"a node": "printing JSON of its own first"}',
            json.dumps(answer),
            "",
        ]
    )
    assert text.check_facts(logs) == answer
    assert text.check_facts("sh: 1: /nonexistent/python3: not found\n") is None
    assert text.check_facts('{"python": 3}') is None
