"""The ssh backend, for real: a real sshd on 127.0.0.1 (tests/sshd.py) stands for the GPU server,
reached through an alias in an ssh config file. Everything else is real too: Redis, the server, the
executor, the bootstrap, the agent and the worker on the "host". The GPUs are not: `nvidia-smi` is a
script on the remote PATH printing scripted CSV, standing in for hardware this machine lacks.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from potato_queue.errors import PotatoQueueError
from potato_queue.executors.remote.session import forward_target
from potato_queue.processes.embedded_redis import EmbeddedRedis
from potato_queue.store.keys import project_predictions_path
from tests.agent_helpers import PYTHON38
from tests.conftest import run_cli
from tests.lifecycle_helpers import (
    TERMINAL,
    Services,
    alive_cmd,
    held_run,
    make_project,
    pids,
    run_paths,
    started,
    wait_running,
)
from tests.potato_helpers import potato_view
from tests.sshd import ALIAS, Sshd

BACKEND = "gpu-server"
TWO_GPUS = "0, NVIDIA A100-SXM4-80GB, 1200, 81920, 97, 8.0\n1, NVIDIA A100-SXM4-80GB, 70000, 81920, 3, 8.0\n"


def test_the_forward_goes_to_the_servers_plain_http_address() -> None:
    assert forward_target("http://127.0.0.1:8000") == "127.0.0.1:8000"
    assert forward_target("http://[::1]:8000/") == "[::1]:8000"
    assert forward_target("http://annotate.lab.org") == "annotate.lab.org:80"
    with pytest.raises(PotatoQueueError, match="plain http address, not https://annotate.lab.org"):
        forward_target("https://annotate.lab.org")


def fake_nvidia_smi(folder: Path, csv: str) -> str:
    """A folder for the backend's PATH whose nvidia-smi prints `csv` (it stands in for GPUs)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{csv}EOF\n")
    script.chmod(0o755)
    return f"{folder}:/usr/local/bin:/usr/bin:/bin"


def gpu_server(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    backend = {
        "type": "ssh",
        "host": ALIAS,
        "python": "/usr/bin/python3",
        "remote_dir": str(tmp_path / "remote"),
        "heartbeat_timeout_s": 60,
        **extra,
    }
    return {"backends": {BACKEND: backend}}


def over_ssh(
    tmp_path: Path, redis_url: str, sshd: Sshd, *, training: dict[str, Any] | None = None, **backend: Any
) -> Any:
    """The server and one executor whose ssh uses the test's config file (POTATO_QUEUE_SSH_CONFIG); `training`:
    model_training keys beside the backend."""
    sshd.write_config("root")
    context = started(tmp_path, redis_url, executors=0, **gpu_server(tmp_path, **backend), **(training or {}))
    svc = context.__enter__()
    svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
    return context, svc


@pytest.fixture
def svc_factory(tmp_path: Path, redis_server_url: str, sshd: Sshd) -> Iterator[Any]:
    contexts: list[Any] = []

    def make(**backend: Any) -> Services:
        context, svc = over_ssh(tmp_path, redis_server_url, sshd, **backend)
        contexts.append(context)
        return svc

    yield make
    for context in contexts:
        context.__exit__(None, None, None)


def run_log(svc: Services, run_id: str) -> str:
    return run_paths(svc, run_id).run_log.read_text()


def test_a_run_over_ssh_succeeds_gets_the_gpu_and_the_code_is_copied_once(svc_factory: Any, tmp_path: Path) -> None:
    svc = svc_factory(env={"PATH": fake_nvidia_smi(tmp_path / "bin", TWO_GPUS)})
    first = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(first, TERMINAL, 120)
    assert run["state"] == "succeeded", (run, svc.logs())
    log = run_log(svc, first)
    assert f"{ALIAS}: Python 3.11" in log and "(/usr/bin/python3)" in log, "run.log names the host's Python"
    assert f"{ALIAS}: the run gets GPU 1: NVIDIA A100-SXM4-80GB, 70000 of 81920 MB free" in log
    # The worker sees the GPU by the index nvidia-smi gave it (CUDA numbers fastest first unless told).
    assert "(CUDA_VISIBLE_DEVICES=1, CUDA_DEVICE_ORDER=PCI_BUS_ID)" in run_paths(svc, first).events.read_text()
    assert f"copying Potato's code to {ALIAS}" in log and f"waiting for the agent on {ALIAS}" in log
    second = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    assert svc.wait_for(second, TERMINAL, 120)["state"] == "succeeded"
    assert "copying Potato's code" not in run_log(svc, second), "the code is on the host already"
    assert len(list((tmp_path / "remote" / "code").iterdir())) == 1
    assert not any((tmp_path / "remote" / "jobs").iterdir()), "the remote job folders are removed"


def test_a_bare_python_38_with_nothing_of_ours_runs_a_run_that_potato_sees(svc_factory: Any) -> None:
    from potato.training import store

    svc = svc_factory(python=str(PYTHON38), gpus="none")
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 120)
    assert run["state"] == "succeeded", (run, svc.logs())
    assert f"{ALIAS}: Python 3.8.18" in run_log(svc, run_id)
    # In Potato's own store (potato-annotation 2.12.1), named after the backend and the host it ran on.
    cfg = potato_view(svc.config)
    row = store.load_run(cfg, run_id)
    assert (row.status, row.backend, row.host) == ("success", f"potato-queue/{BACKEND}", ALIAS)
    assert row.metrics["accuracy"] == run["held_out"]["sentiment"]["test"]["accuracy"]
    assert (
        len(store.load_predictions(cfg, run_id=run_id))
        == len(run_paths(svc, run_id).dir.joinpath("predictions.jsonl").read_text().splitlines())
        > 0
    )
    assert sorted(store.training_split_ids(cfg, run_id)) == sorted(
        json.loads(line)["instance_id"]
        for line in (run_paths(svc, run_id).bundle_dir / "train.jsonl").read_text().splitlines()
    )


def test_a_python_the_host_lacks_is_err_2(svc_factory: Any) -> None:
    from potato.training import store

    svc = svc_factory(python="/opt/no-such/python3")
    run = svc.wait_for(svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND), TERMINAL, 60)
    assert run["state"] == "failed"
    assert run["error"].startswith(f"/opt/no-such/python3 was not found on {ALIAS}"), run["error"]
    row = store.load_run(potato_view(svc.config), run["run_id"])
    assert (row.status, row.error) == ("error", run["error"]), "Potato's page says why the run failed"


def test_an_account_without_a_key_fails_at_once_with_err_1(svc_factory: Any, sshd: Sshd) -> None:
    svc = svc_factory(user=sshd.add_user("pqnokey"))
    run = svc.wait_for(svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND), TERMINAL, 60)
    assert run["state"] == "failed"
    assert run["error"].startswith(f"ssh to {ALIAS} failed: Permission denied"), run["error"]


def test_a_min_free_gpu_mb_no_gpu_there_has_at_all_fails_at_once(svc_factory: Any, tmp_path: Path) -> None:
    # A wait that could never end is no wait (tests/e2e/ssh/test_gpu_wait.py has the wait for a GPU with room).
    svc = svc_factory(env={"PATH": fake_nvidia_smi(tmp_path / "bin", TWO_GPUS)}, min_free_gpu_mb=90000)
    run = svc.wait_for(svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND), TERMINAL, 60)
    assert run["state"] == "failed"
    assert run["error"] == (
        f"min_free_gpu_mb (90000) is more than any GPU on {ALIAS} has: the largest, GPU 0, has 81920 MB"
    ), run["error"]


def test_a_trainer_whose_packages_the_host_lacks_is_err_4(svc_factory: Any) -> None:
    svc = svc_factory(gpus="none")  # Debian's python3 there has no scikit-learn
    run = svc.wait_for(svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND), TERMINAL, 120)
    assert run["state"] == "failed"
    assert "Trainer 'sklearn-text' could not be imported" in run["error"], run["error"]


def test_the_token_is_in_no_argv_on_either_side(svc_factory: Any, tmp_path: Path) -> None:
    svc = svc_factory(python=sys.executable, gpus="none", num_threads=3)
    run_id = held_run(svc, backend=BACKEND)
    wait_running(svc, run_id)
    (worker,) = [
        p
        for p in pids()
        if f"{tmp_path}/remote/code/" in (alive_cmd(p) or "") and "potato_queue.worker --spec" in (alive_cmd(p) or "")
    ]
    environ = dict(
        item.split("=", 1) for item in Path(f"/proc/{worker}/environ").read_text().split("\0") if "=" in item
    )
    assert [environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")] == ["3"] * 3
    assert not [name for name in environ if "TOKEN" in name or name == "POTATO_QUEUE_REDIS_URL"], sorted(environ)
    # The run token is 43 url-safe characters (secrets.token_urlsafe(32)); nothing of ours has such a
    # word on its command line, so any would be a leak. Both sides are this machine's /proc.
    ours = [cmd for pid in pids() if (cmd := alive_cmd(pid)) and (str(tmp_path) in cmd or "potato" in cmd)]
    assert any("potato_queue.agent run --assignment-on-stdin" in cmd for cmd in ours), ours
    assert any(cmd.startswith("ssh ") and "-R /tmp/potato-queue-" in cmd for cmd in ours), ours
    leaks = [word for cmd in ours for word in cmd.split() if re.fullmatch(r"[A-Za-z0-9_-]{43}", word)]
    assert leaks == []
    svc.api("POST", f"/runs/{run_id}/cancel")
    assert svc.wait_for(run_id, TERMINAL, 60)["state"] == "cancelled"


def test_killing_the_ssh_client_fails_the_run_and_leaves_nothing_on_the_host(svc_factory: Any, tmp_path: Path) -> None:
    svc = svc_factory(python=sys.executable, gpus="none")
    run_id = held_run(svc, backend=BACKEND)
    wait_running(svc, run_id)
    (client,) = [
        pid
        for pid in pids()
        if (alive_cmd(pid) or "").startswith("ssh ") and f"potato-queue-{run_id}-" in (alive_cmd(pid) or "")
    ]
    os.kill(client, signal.SIGKILL)
    run = svc.wait_for(run_id, TERMINAL, 60)
    assert run["state"] == "failed"
    assert run["error"].startswith("The agent stopped without reporting a result (the ssh session to "), run["error"]
    remote = tmp_path / "remote"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and [p for p in pids() if f"{remote}/code/" in (alive_cmd(p) or "")]:
        time.sleep(0.1)
    assert [alive_cmd(p) for p in pids() if f"{remote}/code/" in (alive_cmd(p) or "")] == []
    assert list(Path("/tmp").glob(f"potato-queue-{run_id}-*.sock")) == []
    assert list((remote / "jobs").iterdir()) == []


def test_the_model_files_come_back_and_the_job_folder_goes(svc_factory: Any, tmp_path: Path) -> None:
    svc = svc_factory(gpus="none")
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 120)
    artifacts = run_paths(svc, run_id).artifacts
    assert (run["state"], run["artifact_uri"]) == ("succeeded", str(artifacts)), run
    assert sorted(p.name for p in artifacts.iterdir()) and not (artifacts / "predictions.jsonl").exists()
    assert "copying the model back:" in run_log(svc, run_id)
    assert list((tmp_path / "remote" / "jobs").iterdir()) == []


def test_files_over_max_artifact_mb_stay_on_the_host_and_are_named(svc_factory: Any, tmp_path: Path) -> None:
    svc = svc_factory(gpus="none", max_artifact_mb=0.000001)
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 120)
    job = tmp_path / "remote" / "jobs" / run_id
    assert (run["state"], run["artifact_uri"]) == ("succeeded", f"{ALIAS}:{job}/work"), run
    kept = [p.name for p in (job / "work").iterdir() if p.name != "predictions.jsonl"]
    assert kept and all(
        f"{name} (0 MB) is over max_artifact_mb (1e-06 MB): it stays on {ALIAS}" in run_log(svc, run_id)
        for name in kept
    ), run_log(svc, run_id)


@pytest.mark.parametrize("setting", [{"fetch_artifacts": False}, {"keep_remote": True}])
def test_fetch_artifacts_false_and_keep_remote_leave_the_job_folder(
    svc_factory: Any, tmp_path: Path, setting: dict[str, bool]
) -> None:
    svc = svc_factory(gpus="none", **setting)
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 120)
    job = tmp_path / "remote" / "jobs" / run_id
    assert run["state"] == "succeeded" and any((job / "work").iterdir())
    artifacts = run_paths(svc, run_id).artifacts
    if setting.get("fetch_artifacts") is False:
        assert run["artifact_uri"] == f"{ALIAS}:{job}/work" and not artifacts.exists()
    else:
        assert run["artifact_uri"] == str(artifacts) and any(artifacts.iterdir())
    assert list(Path("/tmp").glob(f"potato-queue-{run_id}-*.sock")) == []


def test_a_copy_that_sends_nothing_ends_with_err_7_and_the_predictions_count(
    tmp_path: Path, redis_server_url: str, sshd: Sshd
) -> None:
    # The host's python stops itself (SIGSTOP) when it is asked to send the model files: a stalled sender.
    python = on_copy(tmp_path, "kill -STOP $$")
    sshd.write_config("root")
    with started(
        tmp_path, redis_server_url, executors=0, **gpu_server(tmp_path, python=str(python), gpus="none")
    ) as svc:
        svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config), "POTATO_QUEUE_COPY_STALL_S": "2"})
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "failed"
        assert run["error"] == f"The copy from {ALIAS} sent nothing for 2 s; {left_there(svc, tmp_path, run_id)}"
        assert run["artifact_uri"] == f"{ALIAS}:{tmp_path}/remote/jobs/{run_id}/work"
        assert any((tmp_path / "remote" / "jobs" / run_id / "work").iterdir()), "the model files stay on the host"
        assert run["held_out"]["sentiment"]["test"]["n"] > 0, "the predictions were scored and published"
        assert project_predictions_path(svc.project_config).exists()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [p for p in pids() if str(python) in (alive_cmd(p) or "")]:
        time.sleep(0.1)
    assert [alive_cmd(p) for p in pids() if str(python) in (alive_cmd(p) or "")] == []


def left_there(svc: Services, tmp_path: Path, run_id: str) -> str:
    """What a copy that is not whole says of the model files: where they stay, and the command that fetches them."""
    work = f"{tmp_path}/remote/jobs/{run_id}/work"
    return (
        f"the predictions are stored, and the model files stay on {ALIAS} in {work}: fetch them with "
        f"`ssh {ALIAS} tar -C {work} -cf - . | tar -xf - -C {run_paths(svc, run_id).artifacts}`"
    )


def on_copy(tmp_path: Path, body: str) -> Path:
    """A `python` whose second start (the first is the run's bootstrap, which then runs the agent with the real
    python) is the copy of the model files back, where it runs `body` (sh) first."""
    count = tmp_path / "python-starts"
    return fake_python(
        tmp_path,
        f"n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n"
        f'if [ $n -eq 2 ]; then\n{body}\nfi\nexec /usr/bin/python3 "$@"\n',
    )


def fake_python(tmp_path: Path, body: str) -> Path:
    """A `python` for the backend: a shell script standing in for a host whose interpreter misbehaves."""
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("#!/bin/sh\n" + body)
    python.chmod(0o755)
    return python


def wait_gone(marker: str, timeout_s: float = 15) -> list[str]:
    """The command lines still naming `marker` once they had timeout_s to go."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and [p for p in pids() if marker in (alive_cmd(p) or "")]:
        time.sleep(0.1)
    return [cmd for cmd in (alive_cmd(p) for p in pids()) if cmd and marker in cmd]


def test_a_setup_that_hangs_fails_at_setup_timeout_s_and_leaves_nothing_on_the_host(
    svc_factory: Any, tmp_path: Path
) -> None:
    """An interpreter that never answers (a hung NFS mount, a python that sleeps): before this bound the run
    held the slot past max_wall_seconds, and its process outlived the run."""
    python = fake_python(tmp_path, "while :; do sleep 1; done\n")
    svc = svc_factory(python=str(python), gpus="none", setup_timeout_s=3)
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 60)
    assert run["state"] == "failed"
    assert run["error"].startswith(
        f"The setup on {ALIAS} did not finish within setup_timeout_s (3 s): it was still "
        f"connecting to {ALIAS}. Fix: raise setup_timeout_s of backend {BACKEND}"
    ), run
    assert wait_gone(str(python)) == [], "the hard stop reached the process the setup started"
    assert list(Path("/tmp").glob(f"potato-queue-{run_id}-*.sock")) == []
    after = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    assert svc.wait_for(after, TERMINAL, 120)["state"] == "succeeded", "the run behind it ran"


# Passes the first member of a tar stream on stdin to stdout and stops, with exit 0: a sender cut off between
# two files, which the receiving tar takes for a whole archive.
FIRST_MEMBER_ONLY = """import sys
sys.stdout.buffer.write(sys.stdin.buffer.readline())  # the stage's marker line
head = sys.stdin.buffer.read(512)
size = int(head[124:136].strip(b"\\0 ") or b"0", 8)
sys.stdout.buffer.write(head + sys.stdin.buffer.read((size + 511) // 512 * 512))
"""


def test_a_copy_cut_short_between_files_fails_and_leaves_no_partial_model(
    tmp_path: Path, redis_server_url: str, sshd: Sshd
) -> None:
    cut = tmp_path / "first_member_only.py"
    cut.write_text(FIRST_MEMBER_ONLY)
    python = on_copy(
        tmp_path,
        f"  for work in {tmp_path}/remote/jobs/*/work; do head -c 300000 /dev/urandom > "
        '"$work/zz-second-file.bin"; done\n'
        f'  /usr/bin/python3 "$@" | /usr/bin/python3 {cut}; exit 0',
    )
    sshd.write_config("root")
    with started(
        tmp_path, redis_server_url, executors=0, **gpu_server(tmp_path, python=str(python), gpus="none")
    ) as svc:
        svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "failed", run
        assert re.fullmatch(
            rf"The copy from {ALIAS} was cut short: \S+ did not arrive; "
            + re.escape(left_there(svc, tmp_path, run_id)),
            run["error"],
        ), run["error"]
        assert not run_paths(svc, run_id).artifacts.exists(), "no partial model"
        work = tmp_path / "remote" / "jobs" / run_id / "work"
        assert run["artifact_uri"] == f"{ALIAS}:{work}" and (work / "zz-second-file.bin").is_file(), (
            "the host keeps all"
        )
        assert run["held_out"]["sentiment"]["test"]["n"] > 0, "the predictions were scored and published"


# A lying host's sender: the manifest it announces on stderr, then a tar stream of what it likes on stdout.
LYING_SENDER = """import io, json, sys, tarfile
kind = sys.argv[1]
sys.stdout.buffer.write(sys.argv[2].encode() + b"\\n")
out = io.BytesIO()
with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
    info = tarfile.TarInfo("model.bin")
    info.size = 4
    tar.addfile(info, io.BytesIO(b"1234"))
    manifest = {"model.bin": 4}
    if kind == "links":  # besides the announced file
        for name, type_, target in (("config.json", tarfile.SYMTYPE, "/etc/shadow"), ("rootfs", tarfile.SYMTYPE, "/"),
                                    ("tty", tarfile.CHRTYPE, ""), ("pipe", tarfile.FIFOTYPE, "")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = type_, target
            tar.addfile(info)
    else:  # announced, but over max_artifact_mb 1: a sender that keeps no cap
        info = tarfile.TarInfo("big.bin")
        info.size = manifest["big.bin"] = 31_000_000
        tar.addfile(info, io.BytesIO(bytes(info.size)))
sys.stderr.write(json.dumps({"manifest": manifest}) + "\\n")
sys.stderr.write(json.dumps({"total": sum(manifest.values())}) + "\\n")
sys.stderr.flush()
sys.stdout.buffer.write(out.getvalue())
"""


@pytest.mark.parametrize(
    ("kind", "refusal"),
    [
        ("links", "config.json is a symbolic link (only regular files and folders are taken)"),
        (
            "oversize",
            "big.bin is announced with 31000000 bytes, over max_artifact_mb (1 MB): the sender should have kept "
            "it on the host",
        ),
    ],
)
def test_a_lying_host_gets_nothing_into_artifacts(
    tmp_path: Path, redis_server_url: str, sshd: Sshd, kind: str, refusal: str
) -> None:
    """The host's sender lies: beside the model file it announced, symbolic links to the server's files, a
    device node and a FIFO; or a 31 MB file under max_artifact_mb 1. Before, the links and nodes were created
    in artifacts/ (the executor runs as root here), the 31 MB landed, and the run succeeded."""
    liar = tmp_path / "lying_sender.py"
    liar.write_text(LYING_SENDER)
    python = on_copy(tmp_path, f'  exec /usr/bin/python3 {liar} {kind} "$3"')  # $3: the stage's marker
    sshd.write_config("root")
    settings = gpu_server(tmp_path, python=str(python), gpus="none", max_artifact_mb=1)
    with started(tmp_path, redis_server_url, executors=0, **settings) as svc:
        svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
        run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "failed", run
        assert run["error"] == f"The copy from {ALIAS} was refused: {refusal}; {left_there(svc, tmp_path, run_id)}"
        assert f"the copy from {ALIAS} was refused: {refusal}; nothing of it was kept here" in run_log(svc, run_id)
        artifacts = run_paths(svc, run_id).artifacts
        assert not os.path.lexists(artifacts), "a refused copy leaves nothing here"
        assert run["artifact_uri"] == f"{ALIAS}:{tmp_path}/remote/jobs/{run_id}/work", "and says where the files are"
        assert run["held_out"]["sentiment"]["test"]["n"] > 0, "the predictions were scored and published"


def test_redis_stopped_mid_run_still_stops_every_process_and_the_end_is_recorded_when_it_answers(
    tmp_path: Path, sshd: Sshd
) -> None:
    """Redis frozen (SIGSTOP: every call times out) while a run trains over ssh: the executor cannot keep the
    run slot, so it stops the run, first its processes on the host, then, once Redis answers, its record.
    Before, the failure path wrote to Redis first: the session and the worker outlived the run for minutes,
    and the run then failed as if the executor had died."""
    with EmbeddedRedis(tmp_path / "redis") as redis_server:
        context, svc = over_ssh(tmp_path, redis_server.url, sshd, python=sys.executable, gpus="none")
        try:
            run_id = held_run(svc, backend=BACKEND)
            wait_running(svc, run_id)
            on_host = f"{tmp_path}/remote/code/"
            assert [p for p in pids() if on_host in (alive_cmd(p) or "")], "the agent and worker run on the host"
            assert redis_server.process is not None
            os.kill(redis_server.process.pid, signal.SIGSTOP)
            try:
                left_on_host = wait_gone(on_host, timeout_s=60)
                left_here = wait_gone(f"potato-queue-{run_id}-", timeout_s=10)
            finally:
                os.kill(redis_server.process.pid, signal.SIGCONT)
            assert left_on_host == [] and left_here == [], (left_on_host, left_here)
            run = svc.wait_for(run_id, TERMINAL, 60)
            assert run["state"] == "failed"
            assert run["error"].startswith("Redis was unreachable ("), run["error"]
            after = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
            assert svc.wait_for(after, TERMINAL, 120)["state"] == "succeeded", "the next run runs"
        finally:
            context.__exit__(None, None, None)


def check(tmp_path: Path, sshd: Sshd, *extra: str, **backend: Any) -> Any:
    config = tmp_path / "project" / "config.yaml"
    if not config.exists():
        make_project(tmp_path, **gpu_server(tmp_path, **backend))
    sshd.write_config("root")
    return run_cli(
        "training", "check", BACKEND, config, *extra, env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)}, timeout_s=120
    )


def test_check_reports_python_gpus_the_gpu_a_run_gets_and_missing_packages(tmp_path: Path, sshd: Sshd) -> None:
    path = fake_nvidia_smi(tmp_path / "bin", TWO_GPUS)
    done = check(tmp_path, sshd, env={"PATH": path})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{ALIAS}: Python 3.11") and "(/usr/bin/python3)" in lines[0]
    assert "  GPU 0: NVIDIA A100-SXM4-80GB, 1200 of 81920 MB free, 97 % busy" in lines
    assert "a run now: the run gets GPU 1: NVIDIA A100-SXM4-80GB, 70000 of 81920 MB free, 3 % busy" in lines
    assert any(
        line.startswith("training packages missing from /usr/bin/python3: ") and "torch" in line for line in lines
    ), lines
    as_json = json.loads(check(tmp_path, sshd, "--json", env={"PATH": path}).stdout)
    assert (
        as_json["ok"] is True
        and [g["index"] for g in as_json["gpus"]] == [0, 1]
        and "torch" in as_json["missing_packages"]
    )


def test_check_exits_1_when_a_run_could_not_start(tmp_path: Path, sshd: Sshd) -> None:
    full = check(tmp_path, sshd, env={"PATH": fake_nvidia_smi(tmp_path / "bin", TWO_GPUS)}, min_free_gpu_mb=80000)
    assert full.returncode == 1 and "a run now would not start: No GPU has 80000 MB free" in full.stdout
    missing = check(tmp_path / "other", sshd, python="/opt/no-such/python3")
    assert missing.returncode == 1 and f"/opt/no-such/python3 was not found on {ALIAS}" in missing.stdout


def test_check_llm_says_whether_the_model_fits_the_gpu_a_run_may_get(tmp_path: Path, sshd: Sshd) -> None:
    """`training check --llm MODEL`: the model's config.json where the host has it (here a folder), its need
    against the GPUs' free memory (the fake nvidia-smi's), and bitsandbytes, which Debian's python3 lacks."""
    model = tmp_path / "llama-70b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 8192,
                "num_hidden_layers": 80,
                "intermediate_size": 28672,
                "vocab_size": 128256,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "tie_word_embeddings": False,
            }
        )
    )
    path = fake_nvidia_smi(tmp_path / "bin", TWO_GPUS)
    full = check(tmp_path, sshd, "--llm", str(model), "--load-in-4bit", "false", env={"PATH": path})
    assert full.returncode == 1, full.stdout
    assert f"hf-llm-lora: {model} (70.55 B parameters) in bf16: about " in full.stdout
    assert "needed, more than the 70000 MB free on GPU 1; fix: set load_in_4bit: true, or free memory" in full.stdout
    four_bit = check(tmp_path, sshd, "--llm", str(model), "--load-in-4bit", "true", env={"PATH": path})
    assert (
        four_bit.returncode == 1
        and "hf-llm-lora: load_in_4bit needs bitsandbytes, which this host's Python "
        "lacks: pip install bitsandbytes there (on an ssh backend, add it to packages:)"
        in four_bit.stdout
    )


def test_packages_build_the_venv_once_and_the_hosts_own_packages_stay_visible(svc_factory: Any, tmp_path: Path) -> None:
    svc = svc_factory(gpus="none", packages=["iniconfig"])  # from PyPI; Debian's python3 lacks it
    first = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    assert svc.wait_for(first, TERMINAL, 300)["state"] == "succeeded", svc.logs()
    assert f"creating the environment on {ALIAS}: a venv with iniconfig" in run_log(svc, first)
    second = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    assert svc.wait_for(second, TERMINAL, 120)["state"] == "succeeded"
    assert "creating the environment" not in run_log(svc, second), "the venv is built once per packages list"
    (venv,) = (tmp_path / "remote" / "venvs").iterdir()
    # iniconfig from the venv, yaml from Debian's own dist-packages (--system-site-packages).
    subprocess.run([str(venv / "bin" / "python"), "-c", "import iniconfig, yaml"], check=True)


def fake_torch(folder: Path, archs: list[str]) -> str:
    """A `torch` whose CUDA build has kernels for `archs` only: it stands in for a host's torch."""
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text(
        f"class cuda:\n    @staticmethod\n    def get_arch_list():\n        return {archs!r}\n"
    )
    return str(folder)


def test_a_pinned_gpu_is_taken_as_asked(svc_factory: Any, tmp_path: Path) -> None:
    svc = svc_factory(gpus="0", min_free_gpu_mb=1000, env={"PATH": fake_nvidia_smi(tmp_path / "bin", TWO_GPUS)})
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    assert svc.wait_for(run_id, TERMINAL, 120)["state"] == "succeeded"
    assert f"{ALIAS}: the run gets GPU 0: NVIDIA A100-SXM4-80GB, 1200 of 81920 MB free, 97 % busy" in run_log(
        svc, run_id
    )


def test_gpus_the_hosts_torch_has_no_kernels_for_are_err_5(svc_factory: Any, tmp_path: Path, sshd: Sshd) -> None:
    env = {"PATH": fake_nvidia_smi(tmp_path / "bin", TWO_GPUS), "PYTHONPATH": fake_torch(tmp_path / "site", ["sm_90"])}
    svc = svc_factory(env=env)
    run = svc.wait_for(svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND), TERMINAL, 60)
    assert (run["state"], run["error"]) == ("failed", "This host's torch has no kernels for any of its GPUs")
    report = check(tmp_path / "check", sshd, env=env)
    assert report.returncode == 1
    assert "  GPU 1: NVIDIA A100-SXM4-80GB, 70000 of 81920 MB free, 3 % busy (torch there has no kernels for it)" in (
        report.stdout.splitlines()
    )


def test_a_run_as_an_ordinary_account_in_its_home(tmp_path: Path, redis_server_url: str, sshd: Sshd) -> None:
    user = sshd.add_user("pqrun")
    sshd.authorize(user, sshd.key)
    sshd.write_config(user)
    backend = {"type": "ssh", "host": ALIAS, "python": "/usr/bin/python3", "gpus": "none"}  # remote_dir: ~/.cache/...
    try:
        with started(tmp_path, redis_server_url, executors=0, backends={BACKEND: backend}) as svc:
            svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
            run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
            run = svc.wait_for(run_id, TERMINAL, 120)
        assert run["state"] == "succeeded", run
        home = Path(f"/home/{user}/.cache/potato-training")
        assert (home / "code").is_dir() and home.stat().st_uid == pwd.getpwnam(user).pw_uid
        assert oct(home.stat().st_mode & 0o777) == "0o700"
    finally:
        sshd.write_config("root")


def test_a_backend_env_reaches_the_trainer_but_a_secret_named_one_only_when_listed(
    tmp_path: Path, svc_factory: Any
) -> None:
    """The same rule as on slurm: before, an env entry outside the allow-list (PQ_PLAIN) reached the agent but
    not the trainer, and no secret could be passed on purpose."""
    # The host's python runs the agent and (as sys.executable) the worker: a venv whose .pth line (site runs it
    # at start) records the worker's environment.
    venv = tmp_path / "host-venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    record = (
        f"open({str(tmp_path / 'worker.env')!r}, 'w').write(''.join(k + '=' + v + chr(10) for k, v in "
        "os.environ.items())) if b'potato_queue.worker' in open('/proc/self/cmdline', 'rb').read().split(b'\\0') "
        "else None"
    )
    (next(venv.glob("lib/python3*/site-packages")) / "record_worker_env.pth").write_text(f"import os; {record}\n")
    python = venv / "bin" / "python3"
    svc = svc_factory(
        python=str(python),
        gpus="none",
        secret_env=["HF_TOKEN"],
        env={"PQ_PLAIN": "plain-value", "MY_API_KEY": "do-not-pass-2", "HF_TOKEN": "listed-value"},
    )
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend=BACKEND)
    assert svc.wait_for(run_id, TERMINAL, 120)["state"] == "succeeded", run_log(svc, run_id)
    seen = dict(line.split("=", 1) for line in (tmp_path / "worker.env").read_text().splitlines() if "=" in line)
    assert seen.get("PQ_PLAIN") == "plain-value" and seen.get("HF_TOKEN") == "listed-value"
    assert "MY_API_KEY" not in seen and "do-not-pass-2" not in "".join(seen.values())


def test_a_trainer_package_missing_on_the_host_names_what_to_install_there(svc_factory: Any) -> None:
    """ERR-4 on a host that has only our zipapp: before, the fix said pip install 'potato-queue[train-sklearn]',
    which is nothing that host needs; the host's Debian python3 has no scikit-learn (nor numpy)."""
    svc = svc_factory(python="/usr/bin/python3", gpus="none")
    run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend=BACKEND)
    run = svc.wait_for(run_id, TERMINAL, 120)
    assert run["state"] == "failed"
    assert run["error"] == (
        "Trainer 'sklearn-text' could not be imported: No module named 'numpy' (fix: install the "
        "trainer's packages into the Python that ran it on this host: /usr/bin/python3 -m pip "
        "install scikit-learn (or, on an ssh backend, list them under packages:))"
    ), run["error"]
