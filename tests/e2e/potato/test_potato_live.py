"""Potato's own Training page starts remote runs: the potato-queue-remote trainer, installed into Potato's
environment with `potato-queue potato install-trainer`, run by Potato 2.12.1's own manager and worker
child (pip potato-annotation), queues the run here; Potato publishes its predictions at once and records
the run once; cancelling in Potato cancels the run here."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from potato_queue.potato_hook import pth_path
from tests.conftest import run_cli
from tests.lifecycle_helpers import (
    ADMIN_KEY,
    TERMINAL,
    Services,
    make_project,
    processes_of,
    run_paths,
    wait_running,
    wait_until,
)
from tests.potato_helpers import PotatoServer, Recorder, add_potato_keys, potato_view


@contextmanager
def _trainer_users(shared: Path) -> Iterator[dict[str, int]]:
    """How many pytest-xdist workers use the installed trainer now, and whether it was there before the
    first (this session's workers share `shared`): read and written under one lock."""
    with open(shared / "potato-trainer.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        counts = shared / "potato-trainer.json"
        users = json.loads(counts.read_text()) if counts.exists() else {"n": 0, "there_before": 0}
        yield users
        counts.write_text(json.dumps(users))


@pytest.fixture(scope="module")
def trainer_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The documented install step, undone after when it was not there before. The install is the venv's:
    with this module's tests split over xdist workers, the last worker to finish removes it."""
    shared = tmp_path_factory.getbasetemp().parent
    with _trainer_users(shared) as users:
        if users["n"] == 0:
            users["there_before"] = int(pth_path().exists())
        proc = run_cli("potato", "install-trainer")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "potato-queue-remote is one of Potato's trainers" in proc.stdout
        users["n"] += 1
    yield
    with _trainer_users(shared) as users:
        users["n"] -= 1
        if users["n"] == 0 and not users["there_before"]:
            assert run_cli("potato", "remove-trainer").returncode == 0


@dataclass
class Live:
    svc: Services
    potato: PotatoServer
    config: Path


@pytest.fixture(scope="module")
def live(trainer_installed: None, tmp_path_factory: pytest.TempPathFactory, redis_server_url: str) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("potato-live")
    config = make_project(
        tmp, grace_seconds=2, writeback={"schemas": ["sentiment"], "include_unlabeled": True, "min_confidence": 0.0}
    )
    add_potato_keys(config)
    svc = Services(config, redis_server_url, tmp)
    try:
        svc.serve()
        svc.executor()
        potato = PotatoServer(
            config, tmp, ADMIN_KEY, env={"POTATO_QUEUE_URL": svc.url, "POTATO_QUEUE_API_KEY": ADMIN_KEY}
        )
        potato.start()
        yield Live(svc, potato, config)
    finally:
        svc.stop()
        if "potato" in locals():
            potato.stop()


def test_a_fresh_python_in_potatos_environment_knows_the_trainer(trainer_installed: None) -> None:
    """Potato's worker child is such a python: `python -m potato.training.worker`."""
    probe = "import potato.training.registry as r; print(r.get_trainer_class('potato-queue-remote').__name__)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "RemoteTrainer", proc.stderr


def test_the_hook_leaves_potato_queue_unimported_until_potato_asks(trainer_installed: None) -> None:
    """The code an ssh run copies to a host is run by the host's python: with the trainer installed in that
    python, `potato_queue` must still be free to come from the copy."""
    probe = "import sys; print(sorted(m for m in sys.modules if m.startswith('potato')))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_a_hook_whose_potato_queue_is_gone_steps_aside(trainer_installed: None) -> None:
    """As after `pip uninstall potato-queue` without `remove-trainer`: the line finds no potato_queue when
    Potato imports its registry (hidden here by a None in sys.modules, which find_spec takes for "absent"),
    and Potato starts as if it were not there."""
    probe = (
        "import sys\n"
        "asked = []\n"
        "class Spy:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        asked.append(name)\n"
        "sys.meta_path.insert(1, Spy)  # the finder after the hook is still asked for the registry\n"
        "sys.modules['potato_queue'] = None\n"
        "import potato.training.registry as r\n"
        "print('potato-queue-remote' in r.trainer_names(), 'potato.training.registry' in asked,\n"
        "      [f for f in sys.meta_path if 'PotatoQueue' in repr(f)])\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", timeout=60)
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "False True []", ""), proc


def _queue_run_for(live: Live, potato_run_id: str, timeout_s: float = 60) -> dict:
    """The run potato-queue queued for Potato's run (Potato builds its bundle first, then starts its worker)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = [r for r in live.svc.api("GET", "/runs")[1] if r.get("potato_run_id") == potato_run_id]
        assert len(runs) <= 1, runs
        if runs:
            return runs[0]
        time.sleep(0.2)
    raise AssertionError(f"no run here for Potato's {potato_run_id}: {live.potato.log()[-3000:]}")


def test_a_run_started_on_potatos_page_runs_here_and_its_prelabels_are_published_at_once(live: Live) -> None:
    from potato.training import store

    trainers = {t["name"]: t for t in live.potato.api("GET", "/admin/training/api/trainers")[1]["trainers"]}
    assert trainers["potato-queue-remote"]["available"], trainers
    status, started = live.potato.api(
        "POST",
        "/admin/training/api/runs",
        {
            "trainer": "potato-queue-remote",
            "schemas": ["sentiment"],
            "params": {"trainer": "sklearn-text", "backend": "local"},
        },
    )
    assert status == 200 and started["started"], started
    run = live.potato.wait_run(started["run_id"], {"success", "error", "cancelled"})
    assert run["status"] == "success", (run, live.potato.log()[-3000:], live.svc.logs())
    ours = _queue_run_for(live, started["run_id"])
    assert (ours["state"], ours["trigger"], ours["ran_on"]) == ("succeeded", "potato", "local")
    assert run["metrics"]["accuracy"] == ours["held_out"]["sentiment"]["test"]["accuracy"]
    cfg = potato_view(live.config)
    assert store.load_run(cfg, ours["run_id"]) is None, "Potato records its run; potato-queue does not record it again"

    # Potato records its run's success before its manager ingests the predictions (manager.py,
    # _record_completion then _after_success): the publish follows the success by a moment.
    def published() -> int:
        return live.potato.api("GET", "/admin/model-review")[1]["n_prelabelled"]

    def stored_items() -> int:
        return len({p["instance_id"] for p in store.load_predictions(cfg, run_id=started["run_id"])})

    wait_until(lambda: 0 < published() == stored_items(), 30, "published without a restart (every item Potato stored)")


def test_cancelling_in_potato_cancels_the_run_here(live: Live, tiny_model: Path) -> None:
    status, started = live.potato.api(
        "POST",
        "/admin/training/api/runs",
        {
            "trainer": "potato-queue-remote",
            "schemas": ["sentiment"],
            "params": {
                "trainer": "hf-text-classification",
                "backend": "local",
                "params": {"model_name": str(tiny_model), "epochs": 500, "batch_size": 4},
            },
        },
    )
    assert status == 200 and started["started"], started
    ours = _queue_run_for(live, started["run_id"])
    wait_running(live.svc, ours["run_id"], 120)
    status, reply = live.potato.api("POST", f"/admin/training/api/runs/{started['run_id']}/cancel")
    assert status == 200 and reply["cancelled"], reply
    assert live.potato.wait_run(started["run_id"], {"success", "error", "cancelled"}, 60)["status"] == "cancelled"
    assert live.svc.wait_for(ours["run_id"], TERMINAL, 60)["state"] == "cancelled"


def test_a_run_whose_params_name_another_server_sends_the_key_nowhere(live: Live) -> None:
    """Anyone who may start a run in Potato writes its params; potato-queue's admin key is the admin's."""
    listener = Recorder()  # someone else's listener: it records every request it gets
    try:
        status, started = live.potato.api(
            "POST",
            "/admin/training/api/runs",
            {
                "trainer": "potato-queue-remote",
                "schemas": ["sentiment"],
                "params": {"trainer": "sklearn-text", "backend": "local", "server": listener.url},
            },
        )
        assert status == 200 and started["started"], started
        run = live.potato.wait_run(started["run_id"], {"success", "error", "cancelled"})
    finally:
        listener.close()
    assert listener.got == [], "the listener got nothing, the key least of all"
    assert run["status"] == "error", run
    said = json.dumps(run)
    assert (
        f"params.server '{listener.url}' is not this Potato's potato-queue server ({live.svc.url}, from "
        "$POTATO_QUEUE_URL): a run's params cannot choose where potato-queue's admin key is sent"
    ) in said, said
    assert [r for r in live.svc.api("GET", "/runs")[1] if r.get("potato_run_id") == started["run_id"]] == []


def test_potato_queue_restarted_during_a_potato_run_the_prelabels_still_arrive(live: Live) -> None:
    """potato-queue's server stopped while Potato follows its run: Potato's step line says so, the run's
    training ends meanwhile, and once the server is back Potato takes the result and publishes the
    predictions, as if nothing happened."""
    from potato.training import store

    status, started = live.potato.api(
        "POST",
        "/admin/training/api/runs",
        {
            "trainer": "potato-queue-remote",
            "schemas": ["sentiment"],
            "params": {"trainer": "majority-baseline", "backend": "local", "params": {"hold_s": 3}},
        },
    )
    assert status == 200 and started["started"], started
    ours = _queue_run_for(live, started["run_id"])
    wait_running(live.svc, ours["run_id"], 120)
    run_dir = run_paths(live.svc, ours["run_id"]).dir
    live.svc.stop_server()
    try:

        def step() -> str:
            return str(live.potato.api("GET", "/admin/training/api/status")[1].get("step") or "")

        wait_until(lambda: "cannot be reached for" in step(), 30, "Potato's step line saying so")
        said = step()
        assert said.startswith(f"potato-queue's server at {live.svc.url} cannot be reached for "), said
        assert said.endswith(f"run {ours['run_id']} goes on there, asking again"), said
        # The training ends while the server is down: the worker is gone, its agent holds the result.
        wait_until(
            lambda: not [p for p in processes_of(ours["run_id"], run_dir) if "potato_queue.worker" in p],
            60,
            "the run's worker finished",
        )
        assert live.potato.api("GET", f"/admin/training/api/runs/{started['run_id']}")[1]["status"] == "running"
    finally:
        live.svc.serve_again()
    run = live.potato.wait_run(started["run_id"], {"success", "error", "cancelled"})
    assert run["status"] == "success", (run, live.potato.log()[-3000:], live.svc.logs())
    assert live.svc.wait_for(ours["run_id"], TERMINAL, 30)["state"] == "succeeded"
    cfg = potato_view(live.config)

    def stored_items() -> int:
        return len({p["instance_id"] for p in store.load_predictions(cfg, run_id=started["run_id"])})

    def published() -> int:
        return int(live.potato.api("GET", "/admin/model-review")[1]["n_prelabelled"])

    wait_until(lambda: 0 < published() == stored_items(), 30, "published without a restart (every item Potato stored)")
    events = json.dumps(live.potato.api("GET", f"/admin/training/api/runs/{started['run_id']}/events")[1])
    assert "answers again, after" in events, events
