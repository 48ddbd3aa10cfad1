"""The ground floor: what every side shares, in one place, standard library only (Python 3.8+).

The job an agent is handed (job.py), the exit codes (exit_codes.py), atomic files and the one JSON Lines
reader (files.py), one-line text (text.py), the event envelope (events.py), the scores (scoring.py with
scale_scores.py and span_scores.py), a learning curve's names and reading (curve.py), the bundle's
scales.json (scales_file.py), the sbatch text functions (sbatch.py) and what SLURM says back of a job (slurm_state.py), and how our Python starts on a shared host with its allow-listed
environment and thread variables (isolated.py). The core, the executors, the server, the agent, the host
scripts and the worker import it; it imports nothing of potato-queue beyond itself, so that agent/, host/
and worker/ need not import one another for what they share.
"""
