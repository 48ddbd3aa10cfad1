"""A run's life and the use cases: everything the executor process and the server do with runs.

The use cases (what an edge asks): service.py's RunService over submit.py (check a request, queue the
run), retry.py (a failed run again, from its checkpoints), check.py (could a run start on a backend now),
publish.py (the model to the Hugging Face Hub, with model_card.py's README) and retrain.py (auto-retrain's
tick: enough new annotations, then a run).

A run's life (the executor's): dispatch.py (a wake-up takes the run slot and starts the oldest queued
run), lifecycle.py (prepare: bundle, job, token; launch; supervise; finish), supervise.py (the clocks:
heartbeat, wall, a waiting run's deadline; the stop policy), recovery.py (runs a dead executor left in
flight; a Redis that came back empty), job.py (the job an agent receives), kinds.py (which trainer takes
which scheme), ingest.py (the agent's events into the run's record), finalize.py and gate.py (held-out
scores; which predictions count and become prelabels, by Potato's rules), retention.py (retain_runs).

The Celery tasks (processes/tasks.py) are a few lines around dispatch; nothing here imports Celery,
FastAPI or an HTTP status (the caller hands in `enqueue`; refusals are errors.py's).
"""
