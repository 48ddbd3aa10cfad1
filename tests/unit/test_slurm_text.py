"""The slurm backend's pure functions (wire/sbatch.py, wire/slurm_state.py, executors/slurm.py), on real output.

tests/data/slurm/ holds what Debian's slurm 22.05 printed on the single-node test cluster
(tests/slurm_cluster.py) for each way a job ends: squeue's lines, `scontrol show job -o` and the
job's slurm.out. job.sh is run for real by bash here, with a stand-in worker (no SLURM needed for
what the script itself does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from potato_queue.agent.gpu_watch import GpuWatch
from potato_queue.agent.launchers.slurm_flags import (
    OLDEST_SLURM,
    SLURM_FLAGS,
    SlurmTooOld,
    flags_of,
    unknown_flag,
    version_of,
)
from potato_queue.executors.slurm import default_partition, parse_sinfo
from potato_queue.wire.isolated import allowed_env, python_argv
from potato_queue.wire.job import GpuWatch as GpuWatchSettings
from potato_queue.wire.sbatch import (
    GPU_METER_READY_FILE,
    SBATCH_FLAGS,
    SettingsError,
    SlurmSettings,
    job_script,
    parse_job_id,
    sbatch_argv,
)
from potato_queue.wire.slurm_state import (
    QueueState,
    describe_state,
    end_reason,
    parse_scontrol,
    parse_squeue,
    requeue_line,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
SETTINGS = SlurmSettings.of({"partition": "gpu", "gres": "gpu:1", "time": "00:10:00", "mem": "4G"})


def test_sbatch_gets_the_backends_flags_in_order_and_no_requeue_unless_asked() -> None:
    argv = sbatch_argv(SETTINGS, "r1", "/shared/jobs/r1")
    assert argv == [
        "sbatch",
        "--parsable",
        "--partition=gpu",
        "--gres=gpu:1",
        "--time=00:10:00",
        "--mem=4G",
        "--no-requeue",
        "--job-name=potato-queue-r1",
        "--output=/shared/jobs/r1/slurm.out",
        "--chdir=/shared/jobs/r1/work",
        "/shared/jobs/r1/job.sh",
    ]
    requeued = sbatch_argv(SlurmSettings.of({"requeue": True, "cpus_per_task": 8}), "r1", "/j")
    assert "--no-requeue" not in requeued and "--cpus-per-task=8" in requeued
    # With requeue, SLURM tells the batch shell 120 s (preempt_signal_s) before the time limit.
    assert requeued[3:5] == ["--requeue", "--signal=B:USR1@120"]
    later = sbatch_argv(SlurmSettings.of({"requeue": True, "preempt_signal_s": 300}), "r1", "/j")
    assert "--signal=B:USR1@300" in later


def test_requeue_line_is_said_for_a_resumed_worker_only() -> None:
    assert requeue_line("resumed at step 40 from the checkpoint in /j/checkpoints/step-40") == (
        "preempted, requeued, resumed at step 40"
    )
    assert requeue_line("checkpoint saved at step 40") is None


def test_settings_refuse_a_misspelled_key_and_a_prelude_that_is_not_a_list() -> None:
    with pytest.raises(SettingsError, match="unknown slurm setting partiton; the settings are job_python"):
        SlurmSettings.of({"partiton": "gpu"})
    with pytest.raises(SettingsError, match="prelude must be a list of shell lines"):
        SlurmSettings.of({"prelude": "module load cuda"})
    assert SlurmSettings.of({"type": "slurm"}).job_python == "python3"


def test_the_job_id_from_sbatch_parsable() -> None:
    assert parse_job_id("4242\n") == "4242"
    assert parse_job_id("4242;cluster2\n") == "4242"
    with pytest.raises(ValueError, match="not a job id"):
        parse_job_id("sbatch: error: Batch job submission failed\n")


def test_squeue_lines_and_the_run_log_line_they_become() -> None:
    pending = parse_squeue((DATA / "squeue_pending.txt").read_text())
    running = parse_squeue((DATA / "squeue_running.txt").read_text())
    assert pending == QueueState("PENDING", "Resources", "")
    assert running == QueueState("RUNNING", "None", "node1")
    assert describe_state("7", pending) == "SLURM job 7: PENDING (Resources)"
    assert describe_state("7", running) == "SLURM job 7: RUNNING on node1"
    assert describe_state("7", QueueState("PENDING", "None", "")) == "SLURM job 7: PENDING (not scheduled yet)"
    assert parse_squeue("") is None  # a job SLURM no longer lists


def scontrol(name: str) -> dict[str, str]:
    return parse_scontrol((DATA / f"scontrol_{name}.txt").read_text())


def slurm_out(name: str) -> str:
    return (DATA / f"slurm_out_{name}.txt").read_text()


def test_scontrol_fields() -> None:
    fields = scontrol("timeout")
    assert fields["JobState"] == "TIMEOUT" and fields["NodeList"] == "node1" and fields["BatchFlag"] == "1"
    assert parse_scontrol("") == {}


@pytest.mark.parametrize(
    ("name", "message", "fix"),
    [
        ("timeout", "it reached its time limit", "raise the backend's `time` (now 00:10:00)"),
        ("node_fail", "its node node1 failed", "`exclude`"),
        ("preempted", "it was preempted by a job of higher priority", "not preempted"),
        ("cancelled", "it was cancelled from outside potato-queue (scancel)", "Cancel run"),
        ("out_of_memory", "it ran out of memory", "raise the backend's `mem` (now 4G)"),
    ],
)
def test_each_way_the_scheduler_ends_a_job_has_its_reason_and_fix(name: str, message: str, fix: str) -> None:
    job = scontrol(name)["JobId"]
    code, text, hint = end_reason(job, scontrol(name), slurm_out(name), SETTINGS, stopped_by_us=False) or ("", "", "")
    assert text == f"SLURM job {job} ended before the worker finished: {message}"
    assert code == f"slurm_{scontrol(name)['JobState'].lower()}" and fix in hint


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("timeout", "it reached its time limit"),
        ("node_fail", "its node node1 failed"),
        ("preempted", "it was preempted by a job of higher priority"),
        ("cancelled", "it was cancelled from outside potato-queue (scancel)"),
        ("out_of_memory", "it ran out of memory"),
    ],
)
def test_slurm_out_tells_the_reason_when_scontrol_no_longer_knows_the_job(name: str, message: str) -> None:
    reason = end_reason("7", {}, slurm_out(name), SETTINGS, stopped_by_us=False)
    assert reason is not None and reason[1] == f"SLURM job 7 ended before the worker finished: {message}"


def test_a_job_killed_by_memory_polling_ran_out_of_memory() -> None:
    """jobacct_gather/linux with OverMemoryKill (no cgroups): the job ends FAILED, and slurm.out's CANCELLED
    line has no DUE TO; its "exceeded memory limit" is what says why (files from SlurmCluster(cgroups=False))."""
    for fields in (scontrol("over_mem_polled"), {}):
        reason = end_reason("1", fields, slurm_out("over_mem_polled"), SETTINGS, stopped_by_us=False)
        assert reason is not None and reason[:2] == (
            "slurm_out_of_memory",
            "SLURM job 1 ended before the worker finished: it ran out of memory",
        ), reason


def test_the_scheduler_did_not_end_a_job_that_completed_failed_on_its_own_or_that_we_cancelled() -> None:
    # (out_of_memory's files are from the test cluster in its cgroup mode: SlurmCluster(cgroups=True).)
    assert end_reason("7", scontrol("completed"), slurm_out("completed"), SETTINGS, False) is None
    assert end_reason("7", scontrol("failed"), slurm_out("failed"), SETTINGS, False) is None
    assert end_reason("7", scontrol("cancelled"), slurm_out("cancelled"), SETTINGS, stopped_by_us=True) is None


def test_a_requeued_job_ended_before_it_ran_again_is_not_blamed_on_its_earlier_runs_end() -> None:
    """Real output: a spot job preempted (requeued), then started within the second of its requeue, which
    slurmd refuses ("Killing non-startable batch job: Job credential revoked"). slurm.out's PREEMPTION line
    is the first run's: it is not why the job ended."""
    fields, out = scontrol("not_run_again"), slurm_out("not_run_again")
    assert fields["JobState"] == "FAILED" and "DUE TO PREEMPTION" in out
    reason = end_reason("1", fields, out, SETTINGS, stopped_by_us=False, waiting_again=True)
    assert reason is not None and reason[:2] == (
        "slurm_not_run_again",
        "SLURM job 1 ended before the worker finished: it was requeued, then ended before "
        "it ran again (JobState=FAILED, Reason=NonZeroExitCode, ExitCode=1:0)",
    ), reason
    assert "retry the run: it resumes from its checkpoint" in reason[2]
    # a scheduler's reason of its own still wins (say, scancel from outside while it waited)
    cancelled = end_reason("7", scontrol("cancelled"), out, SETTINGS, stopped_by_us=False, waiting_again=True)
    assert cancelled is not None and cancelled[0] == "slurm_cancelled"


def test_sinfo_nodes_with_their_free_gpus() -> None:
    text = "node1|gpu*|mixed|gpu:2|gpu:1(IDX:0)|\nnode2|gpu*|idle|gpu:a100:4(S:0-1)|gpu:a100:0(IDX:N/A)|\n"
    assert parse_sinfo(text) == [
        {"node": "node1", "partition": "gpu", "state": "mixed", "gpus": 2, "free_gpus": 1},
        {"node": "node2", "partition": "gpu", "state": "idle", "gpus": 4, "free_gpus": 4},
    ]
    assert default_partition(text) == "gpu"
    assert default_partition("node1|urgent|idle|gpu:2|gpu:0|\nnode1|main*|idle|gpu:2|gpu:0|\n") == "main"
    assert default_partition("node1|urgent|idle|gpu:2|gpu:0|\n") is None, "a cluster with no default partition"


# ---------------------------------------------------------------- job.sh, run by bash


def run_job(tmp_path: Path, worker_code: str, **settings: object) -> subprocess.Popen[bytes]:
    job = tmp_path / "job"
    (job / "work").mkdir(parents=True)
    script = job / "job.sh"
    script.write_text(job_script(SlurmSettings.of(settings), "r1", str(job), [sys.executable, "-c", worker_code]))
    script.chmod(0o700)
    return subprocess.Popen(
        [str(script)],
        cwd=job / "work",
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SLURMD_NODENAME": "node7"},
    )


def test_job_sh_writes_events_stderr_and_the_exit_code(tmp_path: Path) -> None:
    worker = (
        'import os, sys; print(\'{"event": "status", "state": "running"}\'); '
        "sys.stderr.write('a line on stderr ' + os.environ['PQ_FROM_ENV'] + ' ' + os.environ['OMP_NUM_THREADS']);"
        " sys.exit(3)"
    )
    job = run_job(tmp_path, worker, env={"PQ_FROM_ENV": "it's set"}, num_threads=2)
    assert job.wait(30) == 3
    folder = tmp_path / "job"
    assert json.loads((folder / "events.jsonl").read_text()) == {"event": "status", "state": "running"}
    assert (folder / "stderr.log").read_text() == "a line on stderr it's set 2"
    assert (folder / "exit_code").read_text() == "3\n" and (folder / "running").read_text() == "node7\n"


def test_job_sh_meters_the_nodes_gpus_beside_the_worker_and_stops_the_meter_before_the_exit_code(
    tmp_path: Path,
) -> None:
    """The real meter (agent/gpu_meter.py) on the node's GPUs (a scripted nvidia-smi: this machine has none)."""
    from tests.fake_gpus import FakeGpus

    gpus = FakeGpus(tmp_path / "bin", "0, NVIDIA A100, 70000, 81920, 0, 8.0\n", "0, 180.0, 95, 22000\n")
    job = tmp_path / "job"
    (job / "work").mkdir(parents=True)
    out = job / "gpu_usage.json"
    spec = job / "spec.json"  # the run's gpu_watch, as the agent writes it into the worker's spec
    spec.write_text(json.dumps({"gpu_watch": {"sample_s": 0.1, "idle_utilization_pct": 5.0}}))
    ready = ["--ready", str(job / GPU_METER_READY_FILE)]
    meter = python_argv(
        sys.executable, "potato_queue.agent.gpu_meter", ["--out", str(out), "--spec", str(spec)] + ready
    )
    # The worker trains 1.5 s from the meter's first figures (on a loaded machine the meter's Python can start
    # well after the worker's).
    wait_then_sleep = (
        f"import os, time\nd = time.time() + 30\nwhile not os.path.exists({str(out)!r}) and time.time() < d:\n"
    )
    worker = [sys.executable, "-c", wait_then_sleep + "    time.sleep(0.02)\ntime.sleep(1.5)"]
    script = job / "job.sh"
    # The backend's env, exported after the login shell's profile: its PATH finds the node's nvidia-smi.
    script.write_text(job_script(SlurmSettings.of({"env": {"PATH": gpus.path}}), "r1", str(job), worker, meter))
    script.chmod(0o700)
    done = subprocess.run([str(script)], cwd=job / "work", env={"HOME": str(tmp_path)}, timeout=60, check=False)
    assert done.returncode == 0, (job / "stderr.log").read_text()
    usage = json.loads(out.read_text())  # whole before exit_code: the agent reads it once it sees that
    assert usage["gpus"] == ["0"] and usage["mean_utilization_pct"] == 95.0 and usage["samples"] >= 3, usage
    assert 1.5 <= usage["gpu_seconds"] < 60  # from the meter's start until job.sh stopped it
    assert usage["energy_wh"] == pytest.approx(180.0 * usage["gpu_seconds"] / 3600, rel=1e-3)
    # A worker that ends before the meter's Python has started: job.sh waits for the meter to be listening
    # before it stops it, so the figures are still there (a SIGTERM before then killed it with none).
    out.unlink()
    (job / "exit_code").unlink()
    quick = job_script(SlurmSettings.of({"env": {"PATH": gpus.path}}), "r1", str(job), ["/bin/true"], meter)
    script.write_text(quick)
    done = subprocess.run([str(script)], cwd=job / "work", env={"HOME": str(tmp_path)}, timeout=60, check=False)
    assert done.returncode == 0, (job / "stderr.log").read_text()
    usage = json.loads(out.read_text())
    assert usage["gpus"] == ["0"] and usage["mean_utilization_pct"] == 95.0 and usage["samples"] >= 2, usage
    # A node without nvidia-smi: no meter, and no file.
    out.unlink()
    (job / "exit_code").unlink()
    # The worker trains as long as the first one did, without waiting for figures that never come (it waited 30 s).
    trains = [sys.executable, "-c", "import time; time.sleep(1.5)"]
    script.write_text(job_script(SlurmSettings.of({"env": {"PATH": "/usr/bin:/bin"}}), "r1", str(job), trains, meter))
    done = subprocess.run([str(script)], cwd=job / "work", env={"HOME": str(tmp_path)}, timeout=60, check=False)
    assert done.returncode == 0 and not out.exists()


def test_two_spells_of_a_requeued_jobs_gpu_use_add_up() -> None:
    from potato_queue.agent.gpu_meter import combine

    first = {
        "gpus": ["0"],
        "gpu_seconds": 100.0,
        "energy_wh": 5.0,
        "mean_utilization_pct": 90.0,
        "peak_memory_mb": 9000.0,
        "samples": 9,
        "sample_s": 10,
    }
    second = {
        "gpus": ["0"],
        "gpu_seconds": 50.0,
        "energy_wh": None,
        "mean_utilization_pct": 60.0,
        "peak_memory_mb": 12000.0,
        "samples": 3,
        "sample_s": 10,
    }
    assert combine(first, second) == {
        "gpus": ["0"],
        "gpu_seconds": 150.0,
        "energy_wh": 5.0,
        "mean_utilization_pct": 82.5,
        "peak_memory_mb": 12000.0,
        "samples": 12,
        "sample_s": 10,
    }
    assert combine(None, second) == second and combine(first, {"gpus": [], "why": "x"}) == first


# The worker leaves at once on USR1 (os._exit): a shell that took wait's 128+n for the worker's status wrote
# exit_code 138 then, nearly every time, and a preempted run failed instead of resuming.
USR1_CHECKPOINTS = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: os._exit(6))\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(6 if not os.path.exists("
    "os.environ['POTATO_QUEUE_PREEMPT_ON_TERM']) else 4))\n"
    'print(\'{"event": "status"}\', flush=True)\n'
    "time.sleep(60)\n"
)


def _started(tmp_path: Path) -> None:
    """Until the worker's first line: it has its signal handlers then (the file exists a moment earlier, from
    job.sh's redirection, before Python has started)."""
    events = tmp_path / "job" / "events.jsonl"
    deadline = time.monotonic() + 30
    while not (events.exists() and events.read_text().endswith("\n")):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_requeueable_job_sh_passes_usr1_to_the_worker_and_a_preempted_worker_leaves_no_exit_code(
    tmp_path: Path,
) -> None:
    """SLURM's --signal=B:USR1 reaches the shell alone: job.sh passes it on; the worker's exit 6 (preempted,
    checkpoint saved) is not the job's end, so no exit_code, and `running` goes for the next start to write.
    scontrol finds no cluster here: its refusal is in stderr.log, and the job still ends cleanly."""
    job = run_job(tmp_path, USR1_CHECKPOINTS, requeue=True)
    _started(tmp_path)
    job.send_signal(signal.SIGUSR1)
    assert job.wait(30) == 0
    folder = tmp_path / "job"
    assert not (folder / "exit_code").exists() and not (folder / "running").exists()
    assert (
        "potato-queue: job.sh got SIGUSR1 (the time limit is near): the worker checkpoints, the job requeues"
        in (folder / "stderr.log").read_text()
    )


def test_a_requeueable_job_sh_keeps_a_cancel_a_cancel(tmp_path: Path) -> None:
    """The agent writes the cancel marker before its scancel: the worker's SIGTERM is then the cancel (exit 4)."""
    job = run_job(tmp_path, USR1_CHECKPOINTS, requeue=True)
    _started(tmp_path)
    (tmp_path / "job" / "cancel").write_text("")
    # SLURM's scancel --full --signal=TERM reaches every process of the job: the worker and the shell.
    subprocess.run(["pkill", "-TERM", "-P", str(job.pid)], check=True)
    job.send_signal(signal.SIGTERM)
    assert job.wait(30) == 4
    assert (tmp_path / "job" / "exit_code").read_text() == "4\n"


def test_a_failing_prelude_line_ends_the_job_saying_which(tmp_path: Path) -> None:
    job = run_job(tmp_path, "print('never')", prelude=["true # a comment", "module load cuda/99"])
    assert job.wait(30) == 2
    folder = tmp_path / "job"
    assert "potato-queue: the prelude line failed: module load cuda/99" in (folder / "stderr.log").read_text()
    assert (folder / "exit_code").read_text() == "2\n" and not (folder / "events.jsonl").exists()


def test_job_sh_outlives_sigterm_and_records_how_the_worker_stopped(tmp_path: Path) -> None:
    # SLURM's scancel --full --signal=TERM reaches every process of the job: the shell and the worker.
    worker = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(4))\n"
        'print(\'{"event": "status"}\', flush=True)\n'
        "time.sleep(60)\n"
    )
    job = run_job(tmp_path, worker)
    events = tmp_path / "job" / "events.jsonl"
    deadline = time.monotonic() + 30
    while not (events.exists() and events.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for pid in [job.pid, *child_pids(job.pid)]:
        os.kill(pid, signal.SIGTERM)
    assert job.wait(30) == 4
    assert (tmp_path / "job" / "exit_code").read_text() == "4\n"


def child_pids(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.unit
def test_a_job_monitor_that_fails_unexpectedly_still_concludes_and_cancels_the_job(tmp_path: Path) -> None:
    """A SLURM command answering something unexpected (here: squeue raising) once ended the monitor thread
    without concluding: the runner then waited forever, and a login-node agent outlived everything."""
    from potato_queue.agent.launchers.slurm import SlurmJob, SlurmLauncher
    from potato_queue.wire.exit_codes import EXIT_UNEXPECTED

    lines: list[str] = []
    cancelled: list[list[str]] = []

    class Broken(SlurmLauncher):
        def command(self, argv: list[str]) -> str | None:
            if argv[0] == "squeue":
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
            cancelled.append(argv)
            return ""

    class Relay:
        def emit(self, kind: str, **fields: object) -> None: ...
        def put(self, text: str | None) -> None: ...

    launcher = Broken(SlurmSettings.of({"poll_interval_s": 0.05}), lines.append, host="login-1")
    job = SlurmJob("4242", str(tmp_path), [], launcher)
    job.relay_output(Relay())  # type: ignore[arg-type]
    assert job.wait(10) == EXIT_UNEXPECTED, lines
    ended = job.ended()
    assert ended is not None and ended.code == "monitor_failed"
    assert (
        ended.message.startswith("the SLURM job monitor failed (UnicodeDecodeError: ")
        and "4242 was cancelled" in ended.message
    )
    assert cancelled == [["scancel", "4242"]], "the job it lost track of is cancelled, not left holding its GPU"


@pytest.mark.unit
def test_a_job_gone_without_its_exit_code_says_in_run_log_what_scontrol_knew(tmp_path: Path) -> None:
    """job.sh ended without writing exit_code, and SLURM names no reason of its own: the run's log (a warning
    the relay carries) is the one place that says how the job ended. Scripted squeue and scontrol answers."""
    from potato_queue.agent.launchers.slurm import SlurmJob, SlurmLauncher
    from potato_queue.wire.exit_codes import EXIT_UNEXPECTED

    said: list[str] = []

    class Gone(SlurmLauncher):
        def command(self, argv: list[str]) -> str | None:
            if argv[0] == "scontrol":
                return "JobId=4242 JobName=pq-x UserId=u(1) JobState=COMPLETED Reason=None Dependency=(null) ExitCode=0:0\n"
            return ""  # squeue no longer lists it

    class Relay:
        def emit(self, kind: str, **fields: object) -> None:
            said.append(str(fields.get("msg", "")))

        def put(self, text: str | None) -> None: ...

    job = SlurmJob("4242", str(tmp_path), [], Gone(SlurmSettings.of({"poll_interval_s": 0.05}), lambda _: None))
    job.relay_output(Relay())  # type: ignore[arg-type]
    assert job.wait(10) == EXIT_UNEXPECTED
    assert (
        "SLURM job 4242 left the queue without writing exit_code (scontrol: JobState=COMPLETED Reason=None "
        "ExitCode=0:0)"
    ) in said


@pytest.mark.unit
def test_a_job_that_ends_while_waiting_to_run_again_says_so(tmp_path: Path) -> None:
    """The agent follows a requeueable job through its preemption (RUNNING, then PENDING again) until SLURM
    ends it before it ran again. Scripted squeue answers; scontrol's and slurm.out's are the real ones."""
    from potato_queue.agent.launchers.slurm import SlurmJob, SlurmLauncher
    from potato_queue.wire.exit_codes import EXIT_UNEXPECTED

    queue = ["RUNNING|None|node1", "PENDING|BeginTime|", ""]
    (tmp_path / "slurm.out").write_text(slurm_out("not_run_again"))

    class Requeued(SlurmLauncher):
        def command(self, argv: list[str]) -> str | None:
            if argv[0] == "scontrol":
                return (DATA / "scontrol_not_run_again.txt").read_text()
            return queue.pop(0) + "\n" if len(queue) > 1 else queue[0]

    class Relay:
        def emit(self, kind: str, **fields: object) -> None: ...
        def put(self, text: str | None) -> None: ...

    lines: list[str] = []
    job = SlurmJob(
        "1", str(tmp_path), [], Requeued(SlurmSettings.of({"poll_interval_s": 0.05, "requeue": True}), lines.append)
    )
    job.relay_output(Relay())  # type: ignore[arg-type]
    assert job.wait(10) == EXIT_UNEXPECTED, lines
    ended = job.ended()
    assert ended is not None and ended.code == "slurm_not_run_again", (ended, lines)
    assert "it was requeued, then ended before it ran again (JobState=FAILED" in ended.message
    assert "squeue no longer lists SLURM job 1; scontrol says FAILED (Reason=NonZeroExitCode)" in lines


@pytest.mark.unit
def test_a_worker_that_never_says_it_ended_after_its_kill_does_not_keep_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every wait after a stop has a bound (runner.KILL_WAIT_S, shortened here): a job whose end is never
    seen (a scheduler that stopped answering) no longer keeps its agent running forever."""
    from types import SimpleNamespace

    from potato_queue.agent import runner as runner_module
    from potato_queue.wire.exit_codes import EXIT_UNEXPECTED

    monkeypatch.setattr(runner_module, "KILL_WAIT_S", 0.3)
    lines: list[str] = []

    class Endless:
        stop_target = "the SLURM job"
        killed = 0

        def poll(self) -> None: ...
        def wait(self, timeout_s: float) -> None:
            time.sleep(timeout_s)

        def terminate(self) -> None: ...
        def kill(self) -> None:
            self.killed += 1

        def cleanup(self) -> None: ...
        def ended(self) -> None: ...
        def rss_mb(self) -> None: ...
        def describe(self) -> str:
            return "SLURM job 4242"

    client = SimpleNamespace(run_id="r1", silence_s=lambda: 0.0)
    runner = runner_module.Runner(client, str(tmp_path), launcher=None, log=lines.append)  # type: ignore[arg-type]
    runner.request_stop("cancel requested")
    worker = Endless()
    job = SimpleNamespace(grace_seconds=0.1, limits=SimpleNamespace(max_ram_mb=None))
    started = time.monotonic()
    no_gpu = GpuWatch([], "no GPU here", GpuWatchSettings())
    code, _, _, _ = runner._supervise(worker, job, no_gpu)  # type: ignore[arg-type]
    assert code == EXIT_UNEXPECTED and worker.killed == 1
    assert time.monotonic() - started < 10
    assert "SLURM job 4242 did not end 0.3 s after it was killed; the agent gives up on it" in lines, lines


def test_job_sh_exports_a_secret_named_env_only_when_secret_env_lists_it() -> None:
    settings = {
        "env": {"HF_HOME": "/shared/hf", "WANDB_API_KEY": "k-123", "HF_TOKEN": "t-456"},
        "secret_env": ["HF_TOKEN"],
    }
    script = job_script(SlurmSettings.of(settings), "r1", "/shared/jobs/r1", ["python", "-m", "w"])
    assert "export HF_HOME=/shared/hf" in script and "export HF_TOKEN=t-456" in script
    assert "k-123" not in script and "WANDB_API_KEY" not in script
    assert "\numask 077" in script, "what the job writes on shared storage is the account's alone"


def test_the_trainer_environment_rule_holds_through_every_process_that_filters_it_again() -> None:
    """allowed_env runs in the executor, on the host before the agent, and in the agent before the worker:
    what a backend passed must survive each, and nothing else that looks like a secret."""
    executor = {
        "PATH": "/usr/bin",
        "POTATO_QUEUE_ADMIN_KEY": "admin",
        "HF_TOKEN": "from-the-executor",
        "GITHUB_TOKEN": "gh",
    }
    agent = allowed_env(executor, {"PQ_PLAIN": "p", "MY_API_KEY": "no", "HF_TOKEN": "listed"}, ["HF_TOKEN"])
    worker = allowed_env(agent)
    assert worker["PQ_PLAIN"] == "p" and worker["HF_TOKEN"] == "listed" and worker["PATH"] == "/usr/bin"
    assert not {"MY_API_KEY", "POTATO_QUEUE_ADMIN_KEY", "GITHUB_TOKEN"} & worker.keys()
    assert "HF_TOKEN" not in allowed_env(allowed_env(executor, {"PQ_PLAIN": "p"})), "unlisted: dropped"
    from_host = allowed_env({"PATH": "/bin", "HF_TOKEN": "on-the-host"}, {}, ["HF_TOKEN"])
    assert allowed_env(from_host)["HF_TOKEN"] == "on-the-host", "a listed secret may come from the host's own env"


# -- the SLURM versions potato-queue needs (slurm_flags.py) ----------------------------------------------------
# What getopt prints for a flag the command does not know: glibc's texts (posix/getopt.c: "%s: unrecognized
# option '%s%s'", "%s: invalid option -- '%c'"), then SLURM's own line (src/sbatch/opt.c in 20.11).
SBATCH_UNKNOWN_LONG = "sbatch: unrecognized option '--mem-per-gpu=8G'\nTry \"sbatch --help\" for more information\n"
SQUEUE_UNKNOWN_SHORT = "squeue: invalid option -- 'h'\nTry \"squeue --help\" for more information\n"


def newer_than_oldest(table: dict[str, str]) -> list[str]:
    """The table's rows that a cluster with the oldest SLURM potato-queue supports would not know."""
    return sorted(key for key, since in table.items() if version_of(since) > version_of(OLDEST_SLURM))


def not_in_slurm_20_11(used: set[str]) -> list[str]:
    """The flags of `used` the table does not list, or lists as newer than OLDEST_SLURM."""
    return sorted(used - SLURM_FLAGS.keys()) + newer_than_oldest(
        {key: SLURM_FLAGS[key] for key in used if key in SLURM_FLAGS}
    )


@pytest.mark.unit
def test_the_flag_table_holds_only_what_slurm_20_11_has_and_would_catch_a_newer_flag() -> None:
    assert OLDEST_SLURM == "20.11"
    assert newer_than_oldest(SLURM_FLAGS) == []
    assert version_of("<= 1.3") == (1, 3) and version_of("19.05") == (19, 5)
    assert newer_than_oldest({**SLURM_FLAGS, "sbatch --gpus-per-task-x": "21.08"}) == ["sbatch --gpus-per-task-x"]
    assert not_in_slurm_20_11({"sbatch --parsable", "sbatch --not-in-table"}) == ["sbatch --not-in-table"]
    with pytest.raises(ValueError, match="not a SLURM version"):
        version_of("someday")


@pytest.mark.unit
def test_every_flag_sbatch_is_given_is_in_slurm_20_11() -> None:
    """Every backend sbatch setting at once, requeue or not: the flags come from the command lines built."""
    every = SlurmSettings.of({**{key: "1" for key in SBATCH_FLAGS}, "requeue": True})
    argvs = [sbatch_argv(every, "r1", "/j"), sbatch_argv(SlurmSettings.of({}), "r1", "/j")]
    used = {flag for argv in argvs for flag in flags_of(argv)}
    assert {"sbatch --parsable", "sbatch --mem-per-gpu", "sbatch --no-requeue", "sbatch --chdir"} <= used
    assert "--signal=B:USR1@120" in argvs[0] and "scontrol requeue" in job_script(every, "r1", "/j", ["w"])
    assert not_in_slurm_20_11(used | {"sbatch --signal=B:", "scontrol requeue"}) == []


@pytest.mark.unit
def test_every_flag_squeue_scontrol_and_scancel_are_given_is_in_slurm_20_11(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commands a job's agent runs, recorded: the polls, the stops, and the cancel of a job whose id
    sbatch did not print."""
    from potato_queue.agent.launchers import slurm as slurm_module
    from potato_queue.agent.launchers.slurm import SlurmJob, SlurmLauncher

    ran: list[list[str]] = []

    def fake_run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "not a job id\n" if argv[0] == "sbatch" else "", "")

    monkeypatch.setattr(slurm_module.subprocess, "run", fake_run)
    monkeypatch.setattr(slurm_module, "shared_code_root", lambda _: "/code")
    launcher = SlurmLauncher(SlurmSettings.of({}), lambda _: None, host="login-1")
    job = SlurmJob("4242", str(tmp_path), [], launcher)
    job.monitor.squeue()
    job.monitor.scontrol()
    job.monitor.state = QueueState("RUNNING", "None", "node1")
    job.terminate()
    job.kill()
    (tmp_path / "r1").mkdir()
    with pytest.raises(slurm_module.LaunchError, match="not a job id"):
        launcher.start(str(tmp_path / "r1" / "spec.json"), str(tmp_path / "r1" / "work"))
    used = {flag for argv in ran for flag in flags_of(argv)}
    assert {"squeue -o", "scontrol -o", "scancel --full", "scancel --signal", "scancel --name"} <= used
    assert not_in_slurm_20_11(used | {"scontrol show job"}) == []


@pytest.mark.unit
def test_every_flag_and_field_sinfo_is_given_by_training_check_is_in_slurm_20_11(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from potato_queue.host import check

    ran: list[list[str]] = []

    def fake_run(argv: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    monkeypatch.setattr(check.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(check.subprocess, "run", fake_run)
    check.slurm_facts({"remote_dir": str(tmp_path), "job_python": "python3", "partition": "gpu"})
    [argv] = ran
    fields = argv[argv.index("-O") + 1].split(",")
    used = set(flags_of(argv)) | {"sinfo -O " + field.split(":")[0] for field in fields}
    used |= {"sinfo -O type:suffix" for field in fields if ":" in field}
    assert {"sinfo -O", "sinfo -O GresUsed", "sinfo -O type:suffix"} <= used
    assert not_in_slurm_20_11(used) == []


@pytest.mark.unit
def test_a_flag_slurm_does_not_know_is_named_with_the_release_that_brought_it_and_the_fix() -> None:
    problem = unknown_flag("sbatch", SBATCH_UNKNOWN_LONG)
    assert problem is not None and problem.flag == "--mem-per-gpu"
    assert problem.message == (
        "sbatch on this cluster does not know the flag --mem-per-gpu (sbatch: unrecognized option "
        "'--mem-per-gpu=8G'): SLURM 19.05 brought it; potato-queue needs SLURM 20.11 or newer"
    )
    assert problem.fix.startswith(
        "remove mem_per_gpu from the backend's settings (potato-queue passes it as "
        "sbatch --mem-per-gpu), or ask the cluster's admins to upgrade SLURM to 20.11"
    )
    short = unknown_flag("squeue", SQUEUE_UNKNOWN_SHORT)
    assert short is not None and short.flag == "-h" and "SLURM has had it since 1.3 or earlier" in short.message
    assert (
        short.fix
        == "ask the cluster's admins to upgrade SLURM to 20.11 or newer (`squeue --version` says which this is)"
    )
    full = unknown_flag("scancel", "scancel: unrecognized option `--full'\n")  # glibc before 2.26 quoted so
    assert full is not None and "SLURM 16.05 brought it" in full.message
    assert (
        unknown_flag("sbatch", "sbatch: error: Batch job submission failed: Invalid partition name specified\n") is None
    )


@pytest.mark.unit
def test_sbatch_refusing_a_flag_fails_the_run_saying_so_and_other_refusals_stay_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from potato_queue.agent.launchers import slurm as slurm_module
    from potato_queue.agent.launchers.slurm import SlurmLauncher

    stderr = SBATCH_UNKNOWN_LONG
    monkeypatch.setattr(
        slurm_module.subprocess, "run", lambda argv, **_: subprocess.CompletedProcess(argv, 1, "", stderr)
    )
    monkeypatch.setattr(slurm_module, "shared_code_root", lambda _: "/code")
    (tmp_path / "r1").mkdir()
    launcher = SlurmLauncher(SlurmSettings.of({"mem_per_gpu": "8G"}), lambda _: None, host="login-1")
    with pytest.raises(SlurmTooOld) as too_old:
        launcher.start(str(tmp_path / "r1" / "spec.json"), str(tmp_path / "r1" / "work"))
    assert too_old.value.error_code == "slurm_too_old" and "SLURM 19.05 brought it" in str(too_old.value)
    assert (too_old.value.install_hint or "").startswith("remove mem_per_gpu from the backend's settings")
    stderr = "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    with pytest.raises(slurm_module.LaunchError) as refused:
        launcher.start(str(tmp_path / "r1" / "spec.json"), str(tmp_path / "r1" / "work"))
    assert refused.value.error_code == "sbatch_refused"


@pytest.mark.unit
def test_squeue_refusing_a_flag_ends_the_job_saying_so_not_as_a_job_that_vanished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from potato_queue.agent.launchers import slurm as slurm_module
    from potato_queue.agent.launchers.slurm import SlurmJob, SlurmLauncher
    from potato_queue.wire.exit_codes import EXIT_UNEXPECTED

    ran: list[list[str]] = []

    def fake_run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        failed = argv[0] == "squeue"
        return subprocess.CompletedProcess(argv, 1 if failed else 0, "", SQUEUE_UNKNOWN_SHORT if failed else "")

    class Relay:
        def emit(self, kind: str, **fields: object) -> None: ...
        def put(self, text: str | None) -> None: ...

    monkeypatch.setattr(slurm_module.subprocess, "run", fake_run)
    lines: list[str] = []
    job = SlurmJob(
        "4242",
        str(tmp_path),
        [],
        SlurmLauncher(SlurmSettings.of({"poll_interval_s": 0.05}), lines.append, host="login-1"),
    )
    job.relay_output(Relay())  # type: ignore[arg-type]
    assert job.wait(10) == EXIT_UNEXPECTED, lines
    ended = job.ended()
    assert ended is not None and ended.code == "slurm_too_old", (ended, lines)
    assert ended.message.startswith("squeue on this cluster does not know the flag -h (squeue: invalid option -- 'h')")
    assert ["scancel", "4242"] in ran, "the job it cannot follow is cancelled, not left holding its GPU"
    assert [argv[0] for argv in ran].count("squeue") == 1, "one answer says it all: no retries"
