"""How the agent starts a worker: `base.WorkerLauncher` and its two kinds, a local process (process.py)
and a SLURM batch job (slurm.py, its job followed by slurm_monitor.py; wire/sbatch.py and wire/slurm_state.py
are its text in, text out: job.sh, flags, squeue and scontrol parsing)."""
