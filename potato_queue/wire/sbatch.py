"""SLURM on the login node, what is submitted: the slurm settings, job.sh, sbatch's flags, the job id it prints.

Standard library only, Python 3.8+: this module is copied to login nodes. The
functions here run nothing; the launcher (launchers/slurm.py) runs the commands
and hands their output to them, so each is tested on real command output.
What SLURM says of the job afterwards (squeue, scontrol, why it ended) is
slurm_state.py's. The slurm settings are one JSON object, the same whether the
executor sends them with a run or an admin writes them to slurm.json for a
hand-started agent (SLURM-8): the backend's keys, as the config names them.
"""

import re
import shlex
from typing import Any, Dict, List, NamedTuple, Optional

from potato_queue.wire.isolated import THREAD_ENV_VARS, passed_env

__all__ = [
    "SBATCH_FLAGS",
    "JOB_KEYS",
    "SlurmSettings",
    "SettingsError",
    "sbatch_argv",
    "job_script",
    "job_name",
    "parse_job_id",
    "DEFAULT_JOB_PYTHON",
    "DEFAULT_POLL_INTERVAL_S",
    "DEFAULT_PREEMPT_SIGNAL_S",
    "CANCEL_MARKER",
    "GPU_USAGE_FILE",
    "GPU_METER_READY_FILE",
    "PREEMPT_ON_TERM_VAR",
    "hard_stop_s",
    "no_sbatch",
    "NO_SBATCH_FIX",
]

# Backend key -> sbatch long option (CFG-4). The config takes its slurm keys from this table.
SBATCH_FLAGS = {
    "partition": "--partition",
    "gres": "--gres",
    "time": "--time",
    "account": "--account",
    "qos": "--qos",
    "cpus_per_task": "--cpus-per-task",
    "mem": "--mem",
    "mem_per_cpu": "--mem-per-cpu",
    "mem_per_gpu": "--mem-per-gpu",
    "constraint": "--constraint",
    "nodes": "--nodes",
    "ntasks": "--ntasks",
    "reservation": "--reservation",
    "exclude": "--exclude",
    "nodelist": "--nodelist",
    "gpus_per_node": "--gpus-per-node",
    "comment": "--comment",
}
NO_SBATCH_FIX = (
    "potato-queue must reach the cluster's login node, and find sbatch on its PATH: when PATH is set only "
    "by a login shell, set PATH in the backend's env"
)
# The other keys the job needs; the rest of a backend (host, python, remote_dir...) is the executor's.
JOB_KEYS = (
    "job_python",
    "prelude",
    "poll_interval_s",
    "requeue",
    "preempt_signal_s",
    "env",
    "secret_env",
    "num_threads",
)
# The job settings' defaults (config.py's SlurmBackend takes them from here).
DEFAULT_JOB_PYTHON = "python3"
DEFAULT_POLL_INTERVAL_S = 10.0
# With requeue: how long before the job's time limit SLURM signals it (USR1) so that it checkpoints and requeues.
DEFAULT_PREEMPT_SIGNAL_S = 120
CANCEL_MARKER = "cancel"  # in the job folder
# Set (by a requeueable SLURM job's job.sh) to the path of the agent's cancel marker: a SIGTERM is then a
# preemption (SLURM ends the job to requeue it), unless the marker exists (the agent's own cancel).
PREEMPT_ON_TERM_VAR = "POTATO_QUEUE_PREEMPT_ON_TERM"
# SLURM's default KillWait: a job's SIGKILL comes this long after the SIGTERM of its cancel (a site may set more).
DEFAULT_KILL_WAIT_S = 30.0


class SettingsError(ValueError):
    """slurm settings that cannot be used; the message names the key and the fix."""


class SlurmSettings(NamedTuple):
    job_python: str
    prelude: List[str]
    poll_interval_s: float
    requeue: bool
    env: Dict[str, str]
    num_threads: Optional[int]
    sbatch: Dict[str, str]  # {"--partition": "gpu", ...}, in SBATCH_FLAGS' order
    secret_env: List[str] = []  # names that look like secrets and still pass (wire/isolated.py)
    preempt_signal_s: int = DEFAULT_PREEMPT_SIGNAL_S

    @classmethod
    def of(cls, data: Dict[str, Any]) -> "SlurmSettings":
        """From the settings object; SettingsError for a key SLURM jobs do not take."""
        if not isinstance(data, dict):
            raise SettingsError('the slurm settings must be a JSON object like {"partition": "gpu"}')
        unknown = sorted(set(data) - set(SBATCH_FLAGS) - set(JOB_KEYS) - {"type"})
        if unknown:
            raise SettingsError(
                "unknown slurm setting {}; the settings are {} and the sbatch settings {}".format(
                    ", ".join(unknown), ", ".join(JOB_KEYS), ", ".join(SBATCH_FLAGS)
                )
            )
        prelude = data.get("prelude") or []
        if not isinstance(prelude, list) or not all(isinstance(line, str) for line in prelude):
            raise SettingsError('prelude must be a list of shell lines, like ["module load cuda/12.4"]')
        sbatch = {
            flag: str(data[key])
            for key, flag in SBATCH_FLAGS.items()
            if data.get(key) is not None and str(data[key]) != ""
        }
        threads = data.get("num_threads")
        return cls(
            str(data.get("job_python") or DEFAULT_JOB_PYTHON),
            list(prelude),
            float(data.get("poll_interval_s") or DEFAULT_POLL_INTERVAL_S),
            bool(data.get("requeue")),
            {str(k): str(v) for k, v in (data.get("env") or {}).items()},
            int(threads) if threads else None,
            sbatch,
            [str(name) for name in data.get("secret_env") or []],
            int(data.get("preempt_signal_s") or DEFAULT_PREEMPT_SIGNAL_S),
        )


def no_sbatch(host: str) -> str:
    """ERR-8."""
    return "{} has no sbatch on PATH, so it cannot submit jobs".format(host)


def hard_stop_s(poll_interval_s: float) -> float:
    """How long a job's hard stop (a plain scancel) may take until its agent sees it end: SLURM's KillWait
    for a worker deaf to SIGTERM, and the polls that see the job go (each squeue may be slow on a busy
    login node)."""
    return DEFAULT_KILL_WAIT_S + 2 * poll_interval_s


def job_name(run_id: str) -> str:
    """The job's name in squeue: whoever must end a run's job can find it by this name alone."""
    return "potato-queue-{}".format(run_id)


def sbatch_argv(settings: SlurmSettings, run_id: str, job_dir: str) -> List[str]:
    """`sbatch --parsable` with the backend's flags, the job's name, its output file and folder."""
    flags = ["{}={}".format(flag, value) for flag, value in settings.sbatch.items()]
    # With requeue, SLURM signals the batch shell (B:) USR1 that long before the time limit: job.sh passes it
    # to the worker, which checkpoints, and requeues the job, which resumes from the checkpoint.
    requeue = (
        ["--requeue", "--signal=B:USR1@{}".format(settings.preempt_signal_s)] if settings.requeue else ["--no-requeue"]
    )
    return (
        ["sbatch", "--parsable"]
        + flags
        + requeue
        + [
            "--job-name={}".format(job_name(run_id)),
            "--output={}/slurm.out".format(job_dir),
            "--chdir={}/work".format(job_dir),
            "{}/job.sh".format(job_dir),
        ]
    )


# In the job folder: what the GPU meter measured on the compute node (agent/gpu_watch.py's `usage`).
GPU_USAGE_FILE = "gpu_usage.json"
# Created by the meter once it would hear job.sh's SIGTERM; job.sh waits for it before stopping the meter.
GPU_METER_READY_FILE = "gpu_meter.ready"


def job_script(
    settings: SlurmSettings, run_id: str, job_dir: str, worker_argv: List[str], meter_argv: Optional[List[str]] = None
) -> str:
    """job.sh: the environment, the prelude, then the worker; it writes events.jsonl, stderr.log, exit_code.
    `meter_argv`: the GPU meter, beside the worker where the node has nvidia-smi (gpu_usage.json), stopped
    before exit_code is written.

    A login shell (`bash -l`), because that is where clusters define `module`;
    the backend's `env` is exported after the profile so that it wins. The
    shell survives SIGTERM (a trap) so that it still writes exit_code after the
    worker, which SLURM signals itself, has stopped.
    """
    q = shlex.quote
    stderr_log, exit_code = q(job_dir + "/stderr.log"), q(job_dir + "/exit_code")
    meter_ready = q(job_dir + "/" + GPU_METER_READY_FILE)
    # The one rule (isolated.passed_env): a name that looks like a secret is exported only when listed.
    env = passed_env(settings.env, settings.secret_env)
    if settings.num_threads:
        env.update({name: str(settings.num_threads) for name in THREAD_ENV_VARS})
    lines = [
        "#!/bin/bash -l",
        "# potato-queue run {}: written by its agent; SLURM runs it on a compute node.".format(run_id),
    ]
    lines.append("umask 077  # the job folder is on storage other accounts share")
    lines.append("trap 'echo \"potato-queue: job.sh got SIGTERM; the worker stops\" >&2' TERM")
    lines += ["export {}={}".format(name, q(value)) for name, value in sorted(env.items())]
    running = q(job_dir + "/running")
    # The agent sees the job start from this file within a tenth of a second; squeue only once per poll.
    lines.append(
        "printf '%s\\n' \"${SLURMD_NODENAME:-$(hostname)}\" > "
        + running
        + ".partial && mv -f "
        + running
        + ".partial "
        + running
    )
    lines += _meter_stop_lines(meter_ready)
    lines.append(
        "finish() { stop_meter; printf '%s\\n' \"$1\" > "
        + exit_code
        + ".partial && mv -f "
        + exit_code
        + ".partial "
        + exit_code
        + '; exit "$1"; }'
    )
    for line in settings.prelude:
        message = q("potato-queue: the prelude line failed: " + line)
        lines += ["{", line, "}} 2>> {} || {{ echo {} >> {}; finish 2; }}".format(stderr_log, message, stderr_log)]
    if meter_argv:
        meter = " ".join(q(part) for part in meter_argv) + " < /dev/null 2>> {}".format(stderr_log)
        lines.append(
            "if command -v nvidia-smi > /dev/null 2>&1; then rm -f {}; {} & meter=$!; fi".format(meter_ready, meter)
        )
    worker = " ".join(q(part) for part in worker_argv) + " < /dev/null >> {} 2>> {}".format(
        q(job_dir + "/events.jsonl"), stderr_log
    )
    lines += _requeuing_worker(worker, job_dir) if settings.requeue else [worker, 'finish "$?"']
    return "\n".join(lines) + "\n"


def _meter_stop_lines(ready: str) -> List[str]:
    """The GPU meter's stop: SIGTERM once the meter would hear it (`ready`, its file, shell-quoted), and its
    last figures written, before the job's end is (the agent reads gpu_usage.json once it sees exit_code)."""
    return [
        'meter=""',
        # At most 10 s for the meter's start (a worker can end first) and 15 s for its last figures: a meter
        # stuck behind a hung nvidia-smi must not keep the job.
        'stop_meter() { if [ -n "$meter" ]; then n=0; '
        "while [ ! -e " + ready + ' ] && kill -0 "$meter" 2>/dev/null && [ "$n" -lt 100 ]; do sleep 0.1; '
        'n=$((n + 1)); done; kill -TERM "$meter" 2>/dev/null; n=0; '
        'while kill -0 "$meter" 2>/dev/null && [ "$n" -lt 150 ]; do sleep 0.1; n=$((n + 1)); done; '
        'kill -KILL "$meter" 2>/dev/null; wait "$meter" 2>/dev/null; meter=""; fi; }',
    ]


def _requeuing_worker(worker: str, job_dir: str) -> List[str]:
    """The worker in the background, so that the shell can pass it USR1 (the time limit is near: SLURM's
    --signal=B:USR1), with a SIGTERM that is not the agent's cancel being a preemption too. A worker that was
    preempted (exit 6) has saved a checkpoint: the job is not finished, so no exit_code; after a USR1 the job
    requeues itself (a preemption's SLURM requeues), and the worker it runs again resumes from the checkpoint."""
    q = shlex.quote
    said = q("potato-queue: job.sh got SIGUSR1 (the time limit is near): the worker checkpoints, the job requeues")
    return [
        "export {}={}".format(PREEMPT_ON_TERM_VAR, q(job_dir + "/" + CANCEL_MARKER)),
        "usr1=0",
        "trap {} USR1".format(
            q('usr1=1; echo {} >> {}; kill -USR1 "$worker" 2>/dev/null'.format(said, q(job_dir + "/stderr.log")))
        ),
        worker + " &",
        "worker=$!",
        "# SIGTERM (scancel --full) reaches the worker and this shell at once: ignored here from now on (the worker",
        "# has its own), it never cuts a wait short, whose status bash could then lose (seen as -1 under load)",
        "trap '' TERM",
        "# wait returns 128+n for each trapped signal, which is the shell's status, not the worker's: wait until",
        "# the worker is gone, then once more for its own (bash keeps a reaped child's status)",
        'while kill -0 "$worker" 2>/dev/null; do wait "$worker"; done',
        'wait "$worker"; code=$?',
        'if [ "$code" = 6 ]; then',
        "  rm -f {}".format(q(job_dir + "/running")),
        "  stop_meter",
        '  if [ "$usr1" = 1 ]; then scontrol requeue "$SLURM_JOB_ID" 2>> {}; fi'.format(q(job_dir + "/stderr.log")),
        "  exit 0",
        "fi",
        'finish "$code"',
    ]


def parse_job_id(stdout: str) -> str:
    """The id from `sbatch --parsable`'s `<id>` or `<id>;<cluster>`; ValueError for anything else."""
    text = stdout.strip().splitlines()[-1].split(";")[0].strip() if stdout.strip() else ""
    if not re.fullmatch(r"\d+(_\d+)?", text):
        raise ValueError("sbatch printed {!r}, not a job id".format(stdout.strip()[:200]))
    return text
