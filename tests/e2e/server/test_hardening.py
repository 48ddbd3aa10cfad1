"""A GPU host shared with accounts we do not trust, through the real local backend (issue 7).

Everything is real: Redis, `potato-queue serve`, `potato-queue executor`, the
agent and the worker; the planted modules are files an attacker with write
access to /tmp could leave there.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.lifecycle_helpers import TERMINAL, agent_pid, held_run, pids, run_paths, session_of, started, wait_running

PLANTED = ("json", "socket", "tarfile", "potato_queue")


def plant(folder: Path) -> Path:
    """Modules named like stdlib ones, and like ours, that leave a mark when imported."""
    folder.mkdir(parents=True, exist_ok=True)
    marks = folder / "imported"
    for name in PLANTED:
        target = folder / name / "__init__.py" if name == "potato_queue" else folder / f"{name}.py"
        target.parent.mkdir(exist_ok=True)
        target.write_text(f"open({str(marks)!r} + '-{name}', 'w').write('imported')\n")
    return marks


def test_nothing_is_imported_from_the_working_directory_or_tmpdir(tmp_path: Path, redis_server_url: str) -> None:
    planted = tmp_path / "shared-tmp"
    plant(planted)
    with started(tmp_path, redis_server_url, executors=0, grace_seconds=2) as svc:
        svc.executor(env={"TMPDIR": str(planted), "TMP": str(planted), "TEMP": str(planted)}, cwd=planted)
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
        run = svc.wait_for(run_id, TERMINAL)
        assert run["state"] == "succeeded", (run, svc.logs())
    imported = sorted(p.name for p in planted.glob("imported-*"))
    assert imported == [], f"planted modules were imported: {imported}"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def test_the_agent_and_the_worker_get_an_allow_listed_environment(tmp_path: Path, redis_server_url: str) -> None:
    secrets = {
        "POTATO_ADMIN_API_KEY": "admin-key-123456",
        "MY_SERVICE_TOKEN": "t0k3n",
        "DB_PASSWORD": "pw",
        "HF_TOKEN": "hf_secret",
        "SOMETHING_ELSE": "x",
    }
    with started(tmp_path, redis_server_url, executors=0, grace_seconds=2) as svc:
        svc.executor(env=secrets)
        run_id = held_run(svc)
        wait_running(svc, run_id)
        agent = agent_pid(run_paths(svc, run_id).dir)
        run_processes = [p for p in pids() if session_of(p) == agent]
        assert len(run_processes) >= 2  # the agent and its worker
        for pid in run_processes:
            env = _environ(pid)
            leaked = sorted(set(env) & {*secrets, "POTATO_QUEUE_REDIS_URL", "PYTHONPATH"})
            assert leaked == [], f"pid {pid} got {leaked}"
            assert env.get("PATH") == os.environ["PATH"]
        svc.api("POST", f"/runs/{run_id}/cancel")
        assert svc.wait_for(run_id, TERMINAL, timeout_s=30)["state"] == "cancelled"


def test_everything_a_run_writes_is_this_accounts_only(tmp_path: Path, redis_server_url: str) -> None:
    with started(tmp_path, redis_server_url, grace_seconds=2) as svc:
        run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
        assert svc.wait_for(run_id, TERMINAL)["state"] == "succeeded"
        training = svc.config.parent / "annotation_output" / "training"
        found = {p: p.stat().st_mode & 0o777 for p in [training, *training.rglob("*")]}
    assert any(p.name == "bundle.tar.gz" for p in found) and any(p.parent.name == "artifacts" for p in found)
    wrong = {
        str(p.relative_to(training)): oct(mode) for p, mode in found.items() if mode != (0o700 if p.is_dir() else 0o600)
    }
    assert wrong == {}, wrong


def test_a_run_folder_that_stops_taking_writes_ends_the_run_and_disk_catches_up(
    tmp_path: Path, redis_server_url: str, tiny_model: Path
) -> None:
    """chattr +i (root, ext4): the run folder takes no new file, as a full disk or a read-only remount."""
    import json
    import subprocess
    import time

    with started(tmp_path, redis_server_url, grace_seconds=2) as svc:
        run_id = svc.start_run(
            trainer="hf-text-classification",
            schemas=["sentiment"],
            params={"model_name": str(tiny_model), "epochs": 6, "batch_size": 8},
        )
        wait_running(svc, run_id)
        folder = run_paths(svc, run_id).dir
        subprocess.run(["chattr", "+i", str(folder)], check=True)
        try:
            run = svc.wait_for(run_id, TERMINAL, timeout_s=120)
            assert run["state"] == "failed", run
            assert "cannot write" in run["error"] or "cannot be written" in run["error"], run["error"]
            assert json.loads((folder / "run.json").read_text())["state"] != "failed"  # disk could not follow yet
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        deadline = time.monotonic() + 30
        while json.loads((folder / "run.json").read_text())["state"] != "failed":
            assert time.monotonic() < deadline, "run.json never caught up with Redis"
            time.sleep(0.2)
        on_disk = json.loads((folder / "run.json").read_text())
        assert on_disk["error"] == run["error"] and svc.api("GET", f"/runs/{run_id}")[1]["state"] == "failed"
