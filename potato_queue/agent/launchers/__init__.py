"""How the agent starts a worker: `base.WorkerLauncher` and its two kinds, a local process (process.py)
and a SLURM batch job (slurm.py; sbatch.py is its text in, text out: job.sh, flags, squeue parsing)."""
