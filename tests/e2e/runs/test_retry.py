"""A retry (issue 22, part 3): a run whose worker was killed is retried from the API and resumes from its
checkpoint on the training machine instead of starting over, on the same data; every part real (Redis, the
server, the executor, the agent and the worker; sshd for the ssh backend).

The trainer is majority-baseline holding 20 s and saving a checkpoint each second (each second held is a
step); the worker is killed (SIGKILL) once a whole checkpoint is on disk (its DONE file), found as an
operator would find it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from potato_queue.wire.checkpoint import Checkpoints
from tests.agent_helpers import AGENT, lab, register
from tests.conftest import run_cli
from tests.lifecycle_helpers import (
    TERMINAL,
    Services,
    agent_pid,
    alive_cmd,
    pids,
    run_paths,
    session_of,
    started,
    wait_until,
)
from tests.sshd import ALIAS, Sshd

# 8 s: the kill lands just after the first checkpoint (a second in), with seconds to spare on a loaded
# machine; the retry then holds only the rest.
HOLD = {"trainer": "majority-baseline", "schemas": ["sentiment"], "params": {"hold_s": 8, "checkpoint_every_steps": 1}}
SSH, PULL = "gpu-server", "lab"


def _worker(candidates: Callable[[str], bool]) -> int:
    found = [p for p in pids() if "potato_queue.worker" in (alive_cmd(p) or "") and candidates(str(p))]
    assert len(found) == 1, [alive_cmd(p) for p in found]
    return found[0]


def _run_log(svc: Services, run_id: str) -> str:
    return run_paths(svc, run_id).run_log.read_text()


def kill_then_retry(
    svc: Services, backend: str, folder_of: Callable[[str], Path], worker_of: Callable[[str], int]
) -> None:
    """The whole story, as a user lives it: a run whose worker dies, its retry, the retry resuming."""
    old = svc.start_run(**HOLD, backend=backend)
    folder = folder_of(old)
    wait_until(lambda: Checkpoints(str(folder)).latest() is not None, 60, "a whole checkpoint of the run")
    saved = Checkpoints(str(folder)).latest()
    assert saved is not None
    os.kill(worker_of(old), signal.SIGKILL)
    failed = svc.wait_for(old, TERMINAL, 60)
    assert failed["state"] == "failed", failed
    assert Checkpoints(str(folder)).latest() is not None, "the failed run's checkpoint outlived its job folder"

    status, reply = svc.api("POST", f"/runs/{old}/retry")
    assert (status, reply["state"]) == (202, "queued"), reply
    retry = reply["run_id"]
    status, again = svc.api("POST", f"/runs/{old}/retry")
    assert (status, again["detail"]) == (
        409,
        f"Run {old} was retried already, as run {retry}; fix: retry run {retry} if it did not succeed either",
    )
    run = svc.wait_for(retry, TERMINAL, 120)
    assert run["state"] == "succeeded", (run, svc.logs())
    assert (run["trigger"], run["resume_of"], run["ran_on"]) == ("retry", old, backend)
    assert run["held_out"], run
    assert svc.api("GET", f"/runs/{old}")[1]["retried_by"] == retry
    log = _run_log(svc, retry)
    said = re.search(rf"resuming run {old} from its checkpoint at step (\d+)", log)
    assert said and int(said.group(1)) >= saved.step, log
    resumed = re.search(r"resumed at step (\d+) from the checkpoint in ", log)
    assert resumed and resumed.group(1) == said.group(1), log
    assert f"bundle of run {old} reused" in log
    assert not folder.exists(), "the success removed the checkpoints it resumed from"
    status, refused = svc.api("POST", f"/runs/{retry}/retry")
    assert (status, refused["detail"].split("; fix:")[0]) == (
        409,
        f"Run {retry} is succeeded: only a failed or cancelled run can be retried",
    )


def test_a_local_run_whose_worker_was_killed_resumes_when_retried_and_the_refusals_say_why(
    tmp_path: Path, redis_server_url: str
) -> None:
    with started(tmp_path, redis_server_url) as svc:

        def folder_of(run_id: str) -> Path:
            return run_paths(svc, run_id).local_checkpoints / run_id

        def worker_of(run_id: str) -> int:
            agent = agent_pid(run_paths(svc, run_id).dir)
            return _worker(lambda p: session_of(p) == agent)

        kill_then_retry(svc, "local", folder_of, worker_of)

        # A run cancelled while queued never had a bundle; one cancelled later whose bundle retain_runs removed
        # cannot train on the same data: both are refused, saying so.
        first = svc.start_run(**HOLD, backend="local")
        queued = svc.start_run(**HOLD, backend="local")
        assert svc.api("POST", f"/runs/{queued}/cancel")[0] == 200
        svc.wait_for(first, {"running"}, 60)
        assert svc.api("POST", f"/runs/{first}/retry")[1]["detail"].startswith(
            f"Run {first} is running: only a failed or cancelled run can be retried; fix: wait for it to end"
        )
        assert svc.api("POST", f"/runs/{first}/cancel")[0] == 200
        assert svc.wait_for(first, TERMINAL, 60)["state"] == "cancelled"
        status, reply = svc.api("POST", f"/runs/{queued}/retry")
        assert (status, reply["detail"].split("; fix:")[0]) == (
            409,
            f"Run {queued} ended before its bundle was built: there is nothing to resume",
        )
        run_paths(svc, first).bundle.unlink()  # as retain_runs does
        shutil.rmtree(run_paths(svc, first).bundle_dir)
        status, reply = svc.api("POST", f"/runs/{first}/retry")
        assert (status, reply["detail"]) == (
            409,
            (
                f"Run {first} cannot be retried: its bundle was removed (model_training.retain_runs keeps the bundles "
                "of the newest 5 failed or cancelled runs), so the retry could not train on the same data; fix: start a new run instead: "
                "it trains on the annotations as they are now, from the beginning; raise model_training.retain_runs "
                "to keep more runs' bundles"
            ),
        )
        assert svc.api("POST", "/runs/20200101T000000-abcdef/retry")[0] == 404
        out = run_cli("training", "retry", first, svc.config, env=svc.env)
        assert (out.returncode, out.stdout) == (1, ""), out
        assert out.stderr.startswith(f"error: Run {first} cannot be retried: its bundle was removed "), out.stderr
        assert "\n  fix: start a new run instead" in out.stderr


def test_an_ssh_run_whose_worker_was_killed_resumes_when_retried(
    tmp_path: Path, redis_server_url: str, sshd: Sshd
) -> None:
    sshd.write_config("root")
    remote = tmp_path / "remote"
    backend = {"type": "ssh", "host": ALIAS, "python": sys.executable, "gpus": "none", "remote_dir": str(remote)}
    with started(tmp_path, redis_server_url, executors=0, backends={SSH: backend}) as svc:
        svc.executor(env={"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)})
        kill_then_retry(
            svc,
            SSH,
            lambda run_id: remote / "jobs" / "checkpoints" / run_id,
            lambda run_id: _worker(lambda p: f"{remote}/code/" in (alive_cmd(int(p)) or "")),
        )
        assert sorted(p.name for p in (remote / "jobs").iterdir()) == [], "nothing left on the host"


@pytest.fixture
def pull_agent(tmp_path: Path) -> Iterator[Callable[[Services], subprocess.Popen[bytes]]]:
    agents: list[subprocess.Popen[bytes]] = []

    def start(svc: Services) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POTATO_")}
        env["POTATO_TRAINING_TOKEN"] = register(svc, PULL)
        with open(tmp_path / "agent.out", "ab") as out:
            agents.append(
                subprocess.Popen(
                    [*AGENT, "--server", svc.url, "--backend", PULL, "--workdir", str(tmp_path / "agent-work")],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=tmp_path,
                    start_new_session=True,
                )
            )
        return agents[-1]

    yield start
    for agent in agents:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def test_an_agent_run_whose_worker_was_killed_resumes_when_retried(
    tmp_path: Path, redis_server_url: str, pull_agent: Any
) -> None:
    with started(tmp_path, redis_server_url, **lab()) as svc:
        agent = pull_agent(svc)
        kill_then_retry(
            svc,
            PULL,
            lambda run_id: tmp_path / "agent-work" / "checkpoints" / run_id,
            lambda run_id: _worker(lambda p: session_of(p) == agent.pid),
        )


# -- the training machine's side, without a run ----------------------------------------------------------------


def _job(**fields: Any) -> Any:
    from potato_queue.wire.job import Job

    return Job.from_dict(
        {
            "run_id": "20260101T000000-aaaaaa",
            "trainer": "majority-baseline",
            "schemas": ["s"],
            "bundle": {"bytes": 1, "sha256": "0"},
            "heartbeat_interval_s": 1,
            "max_predictions_bytes": 1,
            **fields,
        }
    )


def test_a_retry_names_where_it_resumes_or_that_this_machine_has_nothing(tmp_path: Path) -> None:
    import socket

    from potato_queue.agent.checkpoints import checkpoint_dir_for, resume_note

    root = tmp_path / "checkpoints"
    job = _job(resume_of="20250101T000000-bbbbbb")
    folder = checkpoint_dir_for(str(root), job)
    assert folder == str(root / "20250101T000000-bbbbbb")
    assert (os.stat(root).st_mode & 0o777, os.stat(folder).st_mode & 0o777) == (0o700, 0o700)
    assert resume_note(job, folder) == (
        f"no checkpoint of run 20250101T000000-bbbbbb on this machine "
        f"({socket.gethostname()}): starting from the beginning"
    )
    Checkpoints(folder).save(7, lambda path: None)
    assert resume_note(job, folder) == "resuming run 20250101T000000-bbbbbb from its checkpoint at step 7"
    assert resume_note(_job(), checkpoint_dir_for(str(root), _job())) is None, "not a retry: nothing to say"


def test_a_resume_of_that_is_a_path_is_not_a_job() -> None:
    from potato_queue.wire.job import JobError

    with pytest.raises(JobError, match="resume_of is not a run id: '../../etc'"):
        _job(resume_of="../../etc")


def test_the_agent_removes_checkpoint_folders_untouched_for_a_week(tmp_path: Path) -> None:
    import time

    from potato_queue.agent.checkpoints import MAX_AGE_S, prune_stale

    for name in ("old", "fresh", "mine"):
        (tmp_path / name / "step-1").mkdir(parents=True)
    week_ago = time.time() - MAX_AGE_S - 60
    for name in ("old", "mine"):
        os.utime(tmp_path / name, (week_ago, week_ago))
    prune_stale(str(tmp_path), keep=str(tmp_path / "mine"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "mine"]


def test_two_retries_of_one_run_asked_at_once_queue_one_run(tmp_path: Path, redis_server_url: str) -> None:
    """Twenty failed runs, each retried twice at the same instant through the server: one 202 each, the other
    409 naming the run that won, and the old run's record links to that one."""
    import threading

    import redis

    from potato_queue.run import RunState
    from potato_queue.store import RunStore

    with started(tmp_path, redis_server_url, executors=0) as svc:
        store = RunStore(svc.project_config, redis.Redis.from_url(redis_server_url))

        def failed_run() -> str:
            run_id = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
            store.paths(run_id).bundle_dir.mkdir()
            (store.paths(run_id).bundle_dir / "manifest.json").write_text("{}")
            store.update(run_id, job={"run_id": run_id})
            assert store.transition(run_id, RunState.FAILED, error="its worker was killed") is not None
            return run_id

        def retried_twice_at_once(old: str) -> list[tuple[int, Any]]:
            replies: list[tuple[int, Any]] = []
            together = threading.Barrier(2)

            def retry() -> None:
                together.wait()
                replies.append(svc.api("POST", f"/runs/{old}/retry"))

            threads = [threading.Thread(target=retry) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            return replies

        for old in [failed_run() for _ in range(20)]:
            replies = retried_twice_at_once(old)
            (won, queued), (lost, refused) = sorted(replies, key=lambda reply: reply[0])
            assert (won, lost) == (202, 409), replies
            assert refused["detail"] == (
                f"Run {old} was retried already, as run {queued['run_id']}; fix: retry run "
                f"{queued['run_id']} if it did not succeed either"
            )
            assert store.read(old)["retried_by"] == queued["run_id"]
        retries = [r for r in svc.api("GET", "/runs?limit=100")[1] if r.get("resume_of")]
        assert len(retries) == 20, retries


def test_a_retry_written_but_not_queued_stays_the_retry(tmp_path: Path, redis_server_url: str) -> None:
    """Its run exists (an executor may take it), so its claim is not given back: a second retry names it."""
    import redis

    from potato_queue.errors import Conflict
    from potato_queue.run import RunState
    from potato_queue.runs.retry import retry_run
    from potato_queue.store import RunStore
    from potato_queue.validate import load_checked
    from tests.lifecycle_helpers import make_project

    config = load_checked(make_project(tmp_path))
    store = RunStore(config, redis.Redis.from_url(redis_server_url))
    old = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="local")["run_id"]
    store.paths(old).bundle_dir.mkdir()
    (store.paths(old).bundle_dir / "manifest.json").write_text("{}")
    store.update(old, job={"run_id": old})
    assert store.transition(old, RunState.FAILED, error="its worker was killed") is not None

    def broken_queue(run_id: str) -> None:
        raise ConnectionError("the broker went away")

    with pytest.raises(ConnectionError):
        retry_run(config, store, broken_queue, store.read(old))
    written = [r for r in store.run_ids() if r != old]
    assert len(written) == 1
    with pytest.raises(Conflict, match=f"Run {old} was retried already, as run {written[0]}"):
        retry_run(config, store, lambda run_id: None, store.read(old))


def test_a_run_again_on_its_bundle_params_and_seed_reproduces_and_the_comparison_says_so(
    tmp_path: Path, redis_server_url: str
) -> None:
    """Re-run and compare: the same bundle, params and seed again (here, where nothing changed, the same
    predictions and the same record); what cannot be run again says why."""
    with started(tmp_path, redis_server_url, grace_seconds=2, retain_runs=2) as svc:
        held = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], params={"hold_s": 60})
        status, refused = svc.api("POST", f"/runs/{held}/rerun", {})
        assert status == 409, refused
        assert re.fullmatch(
            f"Run {held} is (queued|starting|running): only a run that ended can be run again; fix: wait for it to end",
            refused["detail"],
        ), refused
        waiting = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])  # queued behind the held run
        assert svc.api("POST", f"/runs/{waiting}/cancel")[0] == 200
        status, refused = svc.api("POST", f"/runs/{waiting}/rerun", {})
        assert (status, refused["detail"]) == (
            409,
            f"Run {waiting} ended before its bundle was built: there is nothing to run again; fix: start a new run "
            "instead: it trains on the annotations as they are now",
        ), refused
        svc.api("POST", f"/runs/{held}/cancel")
        first = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], params={"max_features": 500})
        original = svc.wait_for(first, TERMINAL, 120)
        assert original["state"] == "succeeded", svc.logs()
        middle = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
        assert svc.wait_for(middle, TERMINAL, 120)["state"] == "succeeded"

        # retain_runs 2: the re-run's own success prunes its original's bundle (the oldest of three kept); the
        # comparison that --follow prints reads the re-run's copy of it.
        env = {"POTATO_QUEUE_REDIS_URL": redis_server_url}
        out = run_cli("training", "rerun", first, svc.config, "--follow", env=env, timeout_s=180)
        assert out.returncode == 0, out.stdout + out.stderr
        again = re.search(r"^queued run (\S+), run " + first + r" again \(sklearn-text on local\)$", out.stdout, re.M)
        assert again, out.stdout
        rerun = svc.api("GET", f"/runs/{again.group(1)}")[1]
        assert (rerun["trigger"], rerun["rerun_of"], rerun["params"]) == ("rerun", first, {"max_features": 500})
        assert f"bundle of run {first} reused" in _run_log(svc, rerun["run_id"])
        assert rerun["reproducibility"]["seeds"] == original["reproducibility"]["seeds"]
        assert "they disagree on 0 items" in out.stdout, out.stdout
        assert "made the same way: code, data, trainer, params, seeds, packages, GPUs, backend and host" in out.stdout
        compared = svc.api("GET", f"/runs/{first}/compare/{rerun['run_id']}")[1]
        assert compared["reproducibility"] == [] and compared["schemas"]["sentiment"]["disagree"] == 0, compared

        # The kept runs hold copies of the pruned bundle (the re-run's, and the middle run's on the same
        # annotations): the rater and the comparison read those.
        wait_until(lambda: not (run_paths(svc, first).bundle_dir / "manifest.json").exists(), 30, "the prune")
        assert svc.api("GET", f"/runs/{first}/compare/{rerun['run_id']}")[0] == 200
        made = run_cli("training", "rater", first, svc.config, env=env)
        items = re.search(r"a machine rater in Potato as \S+, (\d+) items", made.stdout)
        assert made.returncode == 0 and items and int(items.group(1)) > 0, made.stdout + made.stderr
        rater = next(svc.config.parent.glob("annotation_output/potato-queue.*/user_state.json"))
        written = rater.read_bytes()
        # Once no kept run holds a copy (retention went on), each refuses before it changes anything.
        for run_id in (rerun["run_id"], middle):
            shutil.rmtree(run_paths(svc, run_id).bundle_dir)
        status, refused = svc.api("POST", f"/runs/{first}/rerun", {"backend": "local"})
        assert status == 409 and refused["detail"].startswith(
            f"Run {first} cannot be run again: its bundle was removed"
        )
        again = run_cli("training", "rater", first, svc.config, env=env)
        assert again.returncode == 1 and f"Run {first}'s bundle was removed" in again.stderr, again.stderr
        assert "no kept run holds a copy of it" in again.stderr and rater.read_bytes() == written
        status, refused = svc.api("GET", f"/runs/{first}/compare/{rerun['run_id']}")
        assert status == 409 and "so it cannot be compared or scored again" in refused["detail"], refused
