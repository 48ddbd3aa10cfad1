"""The SLURM release that brought each flag potato-queue gives SLURM's commands, and what a user is told
when a cluster's SLURM does not know one.

Standard library only, Python 3.8+: it runs on login nodes with the launcher. potato-queue needs SLURM
OLDEST_SLURM or newer, so every flag in SLURM_FLAGS must be at least that old: tests/unit/test_slurm_text.py
checks the command lines the code builds against this table, and the table against OLDEST_SLURM.

Where the versions come from: SchedMD's own sources (github.com/SchedMD/slurm, the release tags
slurm-X-Y-0-1), each flag's first appearance in the command's getopt table (src/<command>/opt.c,
src/common/slurm_opt.c) and man page, cross-checked with NEWS and RELEASE_NOTES where they name it.
"<= 1.3" means the flag is already in 1.3, the oldest release looked at.
"""

import os
import re
from typing import List, NamedTuple, Optional, Sequence, Tuple

from potato_queue.agent.launchers.base import LaunchError
from potato_queue.wire.sbatch import SBATCH_FLAGS

__all__ = [
    "OLDEST_SLURM",
    "SLURM_FLAGS",
    "FlagProblem",
    "SlurmTooOld",
    "version_of",
    "flags_of",
    "unknown_flag",
    "refuse_unknown_flag",
]

OLDEST_SLURM = "20.11"
# "<command> <flag>" as the code writes it -> the SLURM release that brought it.
SLURM_FLAGS = {
    # sbatch_argv (wire/sbatch.py); the backend's sbatch settings are SBATCH_FLAGS' flags.
    "sbatch --parsable": "14.03",  # NEWS 14.03.0: "Added sbatch '--parsable' option"
    "sbatch --partition": "<= 1.3",
    "sbatch --gres": "2.2",
    "sbatch --time": "<= 1.3",
    "sbatch --account": "<= 1.3",
    "sbatch --qos": "2.1",
    "sbatch --cpus-per-task": "<= 1.3",
    "sbatch --mem": "<= 1.3",
    "sbatch --mem-per-cpu": "2.0",  # NEWS 2.0: replaces --task-mem
    "sbatch --mem-per-gpu": "19.05",  # RELEASE_NOTES 19.05 (select/cons_tres); in 18.08's parser, undocumented
    "sbatch --constraint": "<= 1.3",
    "sbatch --nodes": "<= 1.3",
    "sbatch --ntasks": "<= 1.3",
    "sbatch --reservation": "2.0",
    "sbatch --exclude": "<= 1.3",
    "sbatch --nodelist": "<= 1.3",
    "sbatch --gpus-per-node": "19.05",  # as --mem-per-gpu
    "sbatch --comment": "<= 1.3",
    "sbatch --requeue": "<= 1.3",
    "sbatch --no-requeue": "<= 1.3",
    "sbatch --signal": "2.1",
    "sbatch --signal=B:": "14.03",  # RELEASE_NOTES 14.03: the "B:" option signals the batch shell only
    "sbatch --job-name": "<= 1.3",
    "sbatch --output": "<= 1.3",
    "sbatch --chdir": "17.11",  # NEWS 17.11: sbatch's --workdir became --chdir
    # SlurmJob (launchers/slurm.py), its JobMonitor (launchers/slurm_monitor.py) and job.sh's requeue.
    "squeue -h": "<= 1.3",
    "squeue -j": "<= 1.3",
    "squeue -o": "<= 1.3",
    "scontrol -o": "<= 1.3",
    "scontrol show job": "<= 1.3",
    "scontrol requeue": "<= 1.3",
    "scancel --full": "16.05",  # NEWS 16.05: "Add scancel -f/--full option"
    "scancel --signal": "<= 1.3",
    "scancel --name": "<= 1.3",
    "scancel --user": "<= 1.3",
    # `training check` on a login node (host/check.py's SINFO_FIELDS).
    "sinfo -h": "<= 1.3",
    "sinfo -N": "<= 1.3",
    "sinfo -p": "<= 1.3",
    "sinfo -O": "15.08",
    "sinfo -O NodeList": "15.08",
    "sinfo -O Partition": "15.08",
    "sinfo -O StateLong": "15.08",
    "sinfo -O Gres": "15.08",
    "sinfo -O GresUsed": "19.05",
    "sinfo -O type:suffix": "20.02",  # `NodeList:|`: commit 9ea6c94, "add suffix support between fields"
}
# getopt's complaints (glibc: `sbatch: unrecognized option '--foo=1'`, `sbatch: invalid option -- 'x'`; older
# glibc quotes with a backtick, musl says `unrecognized option: foo`). The flag stops at its `=value`.
_UNKNOWN = re.compile(r"(?:unrecognized|unknown|invalid) option\b[: ]*(?:-- )?[`'\"]?(-*[A-Za-z][\w-]*)")


class FlagProblem(NamedTuple):
    """A flag a SLURM command did not know: the run's error message and its fix."""

    flag: str
    message: str
    fix: str


class SlurmTooOld(LaunchError):
    """A SLURM command refused a flag it does not know: the cluster's SLURM is older than potato-queue needs."""

    def __init__(self, problem: FlagProblem) -> None:
        super().__init__("slurm_too_old", problem.message, problem.fix)


def version_of(since: str) -> Tuple[int, int]:
    """`19.05` as (19, 5); `<= 1.3` as (1, 3). ValueError for anything else."""
    found = re.fullmatch(r"(?:<= )?(\d+)\.(\d+)", since)
    if found is None:
        raise ValueError("{!r} is not a SLURM version like 20.11".format(since))
    return int(found.group(1)), int(found.group(2))


def flags_of(argv: Sequence[str]) -> List[str]:
    """SLURM_FLAGS' keys for a command line: `sbatch --time=1:00 job.sh` -> [`sbatch --time`]."""
    tool = os.path.basename(argv[0])
    return ["{} {}".format(tool, part.split("=", 1)[0]) for part in argv[1:] if part.startswith("-")]


def _dashed(name: str) -> str:
    """musl names the flag without its dashes: one letter is a short flag, more a long one."""
    if name.startswith("-"):
        return name
    return "-" + name if len(name) == 1 else "--" + name


def unknown_flag(tool: str, stderr: str) -> Optional[FlagProblem]:
    """What to tell the user when `tool` (sbatch, squeue, scontrol, scancel) refused a flag it does not
    know, from its stderr; None for any other error (a partition that does not exist is not this)."""
    found = _UNKNOWN.search(stderr)
    if found is None:
        return None
    flag = _dashed(found.group(1))
    said = next((line.strip() for line in stderr.splitlines() if found.group(0) in line), found.group(0))
    since = SLURM_FLAGS.get("{} {}".format(tool, flag))
    brought = (
        "SLURM {} brought it".format(since)
        if since and not since.startswith("<=")
        else "SLURM has had it since {} or earlier".format(since[3:])
        if since
        else "it is not one potato-queue gives {}".format(tool)
    )
    message = "{} on this cluster does not know the flag {} ({}): {}; potato-queue needs SLURM {} or newer".format(
        tool, flag, said, brought, OLDEST_SLURM
    )
    upgrade = "ask the cluster's admins to upgrade SLURM to {} or newer (`{} --version` says which this is)".format(
        OLDEST_SLURM, tool
    )
    setting = {option: key for key, option in SBATCH_FLAGS.items()}.get(flag) if tool == "sbatch" else None
    fix = (
        "remove {} from the backend's settings (potato-queue passes it as sbatch {}), or {}".format(
            setting, flag, upgrade
        )
        if setting
        else upgrade
    )
    return FlagProblem(flag, message, fix)


def refuse_unknown_flag(tool: str, stderr: str) -> None:
    """SlurmTooOld when `tool`'s stderr says it did not know a flag: the run's error says so, not a
    parse failure or a job that seems to have vanished."""
    problem = unknown_flag(os.path.basename(tool), stderr)
    if problem is not None:
        raise SlurmTooOld(problem)
