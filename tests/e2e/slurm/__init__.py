"""End to end: slurm."""
