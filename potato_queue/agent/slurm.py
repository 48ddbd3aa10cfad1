"""SLURM on the login node: the sbatch command line.

Standard library only, Python 3.8+: this module is copied to login nodes.
Which backend keys exist and which sbatch option each becomes is the
config's business (config.SBATCH_FLAGS); the agent receives the options as
data, `{"--partition": "gpu", ...}`, and only renders them. The
submit/poll/cancel logic joins it with the SLURM backend.
"""

from typing import Dict, List

__all__ = ["sbatch_flags"]


def sbatch_flags(options: Dict[str, object]) -> List[str]:
    """`--option=value` for each option that has a value, in the order given."""
    flags = []
    for flag, value in options.items():
        if value is not None and value != "":
            flags.append("{}={}".format(flag, value))
    return flags
