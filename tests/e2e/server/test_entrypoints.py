"""Every entry point that reads the config refuses a bad one with the validator's messages (VAL-2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.runs.test_validate_cli import SEED, seed_config, write_project

ENTRY_POINTS = [
    ["serve", "{cfg}"],
    ["worker", "{cfg}"],
    ["beat", "{cfg}"],
    ["up", "{cfg}"],
    ["training", "check", "gpu-server", "{cfg}"],
    ["training", "register", "lab-workstation", "{cfg}"],
    ["training", "run", "{cfg}", "--trainer", "sklearn-text", "--schema", "sentiment"],
    ["training", "runs", "{cfg}"],
    ["training", "cancel", "20260101T000000-abcdef", "{cfg}"],
    ["training", "logs", "20260101T000000-abcdef", "{cfg}"],
    ["training", "bundle", "{cfg}", "--out", "{out}"],
]


@pytest.fixture
def typo_config(tmp_path: Path) -> Path:
    cfg = seed_config()
    cfg["model_training"]["backends"]["gpu-server"]["pyhton"] = cfg["model_training"]["backends"]["gpu-server"].pop(
        "python"
    )
    return write_project(tmp_path, cfg)


@pytest.mark.parametrize("argv", ENTRY_POINTS, ids=lambda a: " ".join(a[:2]))
def test_entry_point_refuses_typo(argv: list[str], typo_config: Path, tmp_path: Path) -> None:
    proc = run_cli(*(a.format(cfg=typo_config, out=tmp_path / "out") for a in argv))
    assert proc.returncode == 1, proc.stderr
    assert (
        "error: model_training.backends.gpu-server.pyhton: unknown key for a ssh backend; did you mean 'python'?"
        in proc.stderr
    )
    assert f"potato-queue validate {typo_config} --strict" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", ENTRY_POINTS[:3], ids=lambda a: a[0])
def test_entry_point_prints_warnings_at_start(argv: list[str], tmp_path: Path) -> None:
    cfg = seed_config()
    cfg["model_training"]["backends"]["cluster"]["time"] = "2-00:00:00"
    path = write_project(tmp_path, cfg)
    # A Redis that does not answer makes the long-running commands stop right after their start-up checks.
    proc = run_cli(
        *(a.format(cfg=path, out=tmp_path / "out") for a in argv),
        env={"POTATO_QUEUE_REDIS_URL": "redis://127.0.0.1:1/0"},
    )
    assert "warning: model_training.backends.cluster.time is 2-00:00:00. A job that holds a GPU" in proc.stderr


def test_entry_point_refuses_unparsable_config_with_exit_2(tmp_path: Path) -> None:
    path = write_project(tmp_path, "model_training: [\n")
    proc = run_cli("serve", path)
    assert proc.returncode == 2
    assert "is not valid YAML at line" in proc.stderr


def test_valid_config_gets_past_the_check(tmp_path: Path) -> None:
    # Past the config check, beat says what it needs: the seed project has auto-retrain off.
    proc = run_cli("beat", SEED / "config.yaml")
    assert "error: model_training" not in proc.stderr
    assert proc.returncode == 2 and "auto-retrain is off in" in proc.stderr, proc.stderr


def test_cli_help_lists_the_command_tree() -> None:
    top = run_cli("--help").stdout
    for command in ("validate", "serve", "worker", "beat", "up", "training"):
        assert command in top
    sub = run_cli("training", "--help").stdout
    for command in ("check", "register", "agent", "run", "runs", "cancel", "logs", "bundle"):
        assert command in sub


def test_console_script_is_installed() -> None:
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "potato-queue"
    assert exe.exists(), "the potato-queue console script is not installed beside this Python (pip install -e .)"
    out = subprocess.run([str(exe), "validate", str(SEED / "config.yaml")], capture_output=True, text=True)
    assert out.returncode == 0 and "valid" in out.stdout


def test_check_local_names_the_device() -> None:
    # This machine has no GPU: a local run uses the CPU (LOC-2).
    proc = run_cli("training", "check", "local", SEED / "config.yaml")
    assert proc.returncode == 0, proc.stderr
    device, writeback = proc.stdout.strip().splitlines()
    assert device == "local: this machine, CPU"
    assert writeback.startswith("Potato write-back is on: runs, their splits and predictions are recorded in ")


def test_check_says_what_it_did_not_foresee_and_a_redis_that_is_gone(tmp_path: Path) -> None:
    """The check's answer is a report, never a traceback (nor, on the page, an error page)."""
    cfg = seed_config()
    cfg["model_training"]["backends"]["gpu-server"]["python"] = "$HOME/venv/bin/python"
    path = write_project(tmp_path, cfg)
    proc = run_cli("training", "check", "gpu-server", path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith(
        "the check of gpu-server failed: ValueError: '$HOME/venv/bin/python' cannot pass through every login shell"
    ), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    # An agent backend's registration is kept in Redis: none answering is said, with the fix.
    proc = run_cli("training", "check", "lab-workstation", path, "--redis-url", "redis://127.0.0.1:1/0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[:2] == [
        "the check of lab-workstation failed: Redis does not answer, and backend lab-workstation's registration "
        "is kept there",
        "fix: start Redis, or point --redis-url (or POTATO_QUEUE_REDIS_URL) at the server's",
    ], proc.stdout


def test_serve_refuses_the_placeholder_key_on_a_reachable_address(tmp_path: Path, redis_server_url: str) -> None:
    cfg = seed_config()
    cfg["admin_api_key"] = "change-me"
    proc = run_cli("serve", write_project(tmp_path, cfg), "--host", "0.0.0.0", "--port", "0")
    assert proc.returncode == 1
    assert "admin_api_key 'change-me' is a placeholder anyone can guess, and 0.0.0.0 is reachable" in proc.stderr
    assert "fix: set a real key" in proc.stderr


def test_serve_says_at_start_that_the_admin_api_is_closed_without_a_key(tmp_path: Path, redis_server_url: str) -> None:
    import subprocess
    import sys

    cfg = seed_config()
    del cfg["admin_api_key"]
    env = {k: v for k, v in os.environ.items() if k != "POTATO_ADMIN_API_KEY"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "potato_queue.cli", "serve", str(write_project(tmp_path, cfg)), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
    finally:
        proc.kill()
        proc.wait()
    assert "the admin API refuses every request: no admin key is set" in lines[1], lines


def test_a_read_only_project_is_refused_at_start(tmp_path: Path, redis_server_url: str) -> None:
    path = write_project(tmp_path, seed_config())
    # A file where the output folder should be: nothing can be written there, even by root.
    (tmp_path / "annotation_output").write_text("not a folder")
    for command in (["serve", str(path), "--port", "0"], ["executor", str(path)], ["worker", str(path)]):
        proc = run_cli(*command)
        assert proc.returncode == 1, proc.stderr
        assert "runs cannot be written in" in proc.stderr and "annotation_output/training/runs" in proc.stderr
        assert "fix: make the project's output_annotation_dir writable" in proc.stderr


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_up_stops_its_whole_tree_on_a_signal(signame: str, tmp_path: Path) -> None:
    import contextlib
    import signal
    import subprocess
    import sys
    import threading
    import time

    from tests.lifecycle_helpers import alive_cmd, parent_of, pids

    # No Redis answers at this URL, so `up` starts its own as well; auto-retrain is on, so beat too.
    env = {**os.environ, "POTATO_QUEUE_REDIS_URL": "redis://127.0.0.1:1/0"}
    cfg = seed_config()
    cfg["model_training"]["auto_retrain"] = {"enabled": True, "trainer": "majority-baseline", "update_frequency": 1000}
    up = subprocess.Popen(
        [sys.executable, "-m", "potato_queue.cli", "up", str(write_project(tmp_path, cfg)), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert up.stdout is not None
    children: list[int] = []
    try:
        lines = [up.stdout.readline(), up.stdout.readline()]
        assert "runs privately at unix://" in lines[0] and " at http://" in lines[1], lines
        # The rest of what the tree prints is read, as a terminal would: a full pipe must not stall it.
        threading.Thread(target=up.stdout.read, daemon=True).start()
        socket_path = Path(lines[0].split("unix://", 1)[1].split("?", 1)[0])
        deadline = time.monotonic() + 30
        while len(children) < 4 and time.monotonic() < deadline:  # redis-server, serve, worker, beat
            children = [p for p in pids() if parent_of(p) == up.pid and alive_cmd(p)]
            time.sleep(0.1)
        assert len(children) == 4, [alive_cmd(p) for p in children]
        assert any(" beat " in str(alive_cmd(p)) for p in children), [alive_cmd(p) for p in children]
        up.send_signal(getattr(signal, signame))
        up.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(alive_cmd(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [alive_cmd(p) for p in children if alive_cmd(p)] == []
        assert not socket_path.exists() and not socket_path.parent.exists()
    finally:  # a failure above leaves nothing running either
        for pid in [up.pid, *children]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        up.wait(timeout=10)


def test_help_names_every_option_and_cuts_no_summary_short() -> None:
    import re

    top = run_cli("--help").stdout
    summaries = top.split("Commands:", 1)[1]
    assert (
        "..." not in summaries
        and "Start everything on this machine: Redis if none answers, the server, an executor, beat." in top
    )
    for command in (["training", "run"], ["training", "agent"], ["up"], ["worker"]):
        text = run_cli(*command, "--help").stdout
        options = [line for line in text.splitlines() if line.startswith("  -")]
        without_help = [line for line in options if len(re.split(r"\s{2,}", line.strip())) < 2]
        assert options and without_help == [], text
    assert "--param KEY=VALUE" in run_cli("training", "run", "--help").stdout


def test_training_run_passes_trainer_params(tmp_path: Path, redis_server_url: str) -> None:
    """Also: `worker --quiet` prints no line per run (test_lifecycle's visibility test sees them without it)."""
    from tests.lifecycle_helpers import run_paths, started

    with started(tmp_path, redis_server_url, executors=0) as svc:
        svc.executor(None, None, "--quiet")
        proc = run_cli(
            "training",
            "run",
            svc.config,
            "--trainer",
            "majority-baseline",
            "--schema",
            "sentiment",
            "--param",
            "epochs=3",
            "--param",
            "note=a b",
            "--param",
            "lr=0.5",
            "--follow",
            timeout_s=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        run_id = proc.stdout.split("queued run ", 1)[1].split()[0]
        assert svc.api("GET", f"/runs/{run_id}")[1]["params"] == {"epochs": 3, "note": "a b", "lr": 0.5}
        assert "predictions: " in proc.stdout and "annotation_output/training/predictions.jsonl" in proc.stdout
        # `training logs -f` from a run's start prints its log to the run's last line, then returns.
        followed = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
        log = run_cli("training", "logs", followed, svc.config, "-f", timeout_s=120)
        assert log.returncode == 0, log.stdout + log.stderr
        assert log.stdout.splitlines()[-1].endswith(" succeeded"), log.stdout
        assert run_paths(svc, followed).run_log.read_text().startswith(log.stdout)
        bad = run_cli(
            "training",
            "run",
            svc.config,
            "--trainer",
            "majority-baseline",
            "--schema",
            "sentiment",
            "--param",
            "epochs",
        )
        assert bad.returncode == 1 and "--param 'epochs' is not KEY=VALUE" in bad.stderr
        # One wording for a backend the project does not have, wherever it is named.
        unknown = "Backend 'gpu-box' is not configured; configured backends: local"
        status, reply = svc.api(
            "POST", "/runs", {"trainer": "majority-baseline", "schemas": ["sentiment"], "backend": "gpu-box"}
        )
        assert status == 409 and reply["detail"].startswith(unknown) and "fix: name one of those" in reply["detail"]
        for argv in (["training", "check", "gpu-box", svc.config], ["training", "register", "gpu-box", svc.config]):
            proc = run_cli(*argv)
            assert proc.returncode == 1 and unknown in proc.stderr and "under model_training.backends" in proc.stderr, (
                argv
            )
    quiet = (tmp_path / "executor1.log").read_text()
    assert run_id in run_paths(svc, run_id).run_log.read_text()
    assert "woken for run" not in quiet and f"ran {run_id}" not in quiet, quiet


def test_the_demo_is_not_drowned_by_the_executors_log(tmp_path: Path, redis_server_url: str) -> None:
    from tests.lifecycle_helpers import make_project

    proc = run_cli("up", make_project(tmp_path), "--run", "majority-baseline", "--port", "0", timeout_s=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[config]" not in out and "superuser privileges" not in out and "woken for run" not in out, out
    assert " at http://127.0.0.1:" in out and "predictions: " in out


def test_up_runs_several_trainers_in_order_and_compares_them(tmp_path: Path, redis_server_url: str) -> None:
    """The README's demo, on the tests' small project: each --run in turn, a --param only where it belongs,
    then one table of held-out scores on the same split."""
    from tests.lifecycle_helpers import make_project

    config = make_project(tmp_path)
    proc = run_cli(
        "up",
        config,
        "--run",
        "majority-baseline",
        "--run",
        "sklearn-text",
        "--param",
        "C=0.5",
        "--port",
        "0",
        timeout_s=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    table = out.split("Held-out scores, the same split for every run:\n", 1)[1]
    header, majority, sklearn = table.splitlines()[:3]
    assert header.split()[:4] == ["trainer", "schema", "val", "acc"], table
    assert majority.split()[:2] == ["majority-baseline", "sentiment"] and sklearn.split()[:2] == [
        "sklearn-text",
        "sentiment",
    ]
    assert out.index("== majority-baseline") < out.index("== sklearn-text")
    assert "the Training page, while this runs: http://127.0.0.1:" in out and "/admin/training (admin key" in out
    assert f"In Potato: these runs are in {config.parent / 'project.sqlite'}. Start Potato on the project" in out
    runs = sorted((config.parent / "annotation_output" / "training" / "runs").glob("*/run.json"))
    params = {json.loads(p.read_text())["trainer"]: json.loads(p.read_text())["params"] for p in runs}
    assert params == {"majority-baseline": {}, "sklearn-text": {"C": 0.5}}
    stray = run_cli("up", config, "--run", "majority-baseline", "--param", "epochs=3", "--port", "0")
    assert stray.returncode == 2 and "--param epochs is not a param of majority-baseline" in stray.stderr, stray.stderr


def test_up_checks_every_run_before_it_queues_any(tmp_path: Path) -> None:
    """Potato's check-box example (a multiselect only): majority-baseline takes no scheme of it, so an `up` that
    names it second queues nothing at all, not the first run either (it would run during a later `up`)."""
    from tests.potato_examples import example_project

    config = example_project("check-box", tmp_path / "project")
    proc = run_cli("up", config, "--run", "sklearn-text", "--run", "majority-baseline", "--port", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "error: Scheme 'favorite_color' is multilabel (multiselect), and majority-baseline trains only nominal "
        "schemes\n  fix: train favorite_color with hf-llm-lora or hf-text-classification or sklearn-text"
    ) in proc.stderr, proc.stderr
    assert "== sklearn-text" not in proc.stdout, "nothing started"
    assert not list(tmp_path.rglob("run.json")), "no run was recorded"
