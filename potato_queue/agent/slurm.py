"""SLURM on the login node: sbatch settings and their flags.

Standard library only, Python 3.8+: this module is copied to login nodes.
The submit/poll/cancel logic joins it with the SLURM backend.
"""

from typing import Dict, List

__all__ = ["SBATCH_FLAGS", "sbatch_flags"]

# Backend key -> sbatch long option. One table, read by the config model
# (which keys a slurm backend accepts) and by the agent (the flags it passes).
SBATCH_FLAGS: Dict[str, str] = {
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


def sbatch_flags(settings: Dict[str, object]) -> List[str]:
    """The sbatch flags for the settings that are set, in the table's order."""
    flags = []
    for key, flag in SBATCH_FLAGS.items():
        value = settings.get(key)
        if value is not None and value != "":
            flags.append("{}={}".format(flag, value))
    return flags
