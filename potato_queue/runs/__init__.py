"""A run's life, in one package: everything the executor process and the server do with runs.

- submit: check a run request and queue it (the API, the CLI, the beat);
- lease: the run slot (one run at a time, across executors);
- dispatch: a wake-up takes the slot and starts the oldest queued run;
- lifecycle: prepare (bundle, job, token), launch, supervise, finish;
- supervise: the clocks (heartbeat, wall, a waiting run's deadline) and the stop policy;
- recovery: runs a dead executor left in flight; a Redis that came back empty;
- ingest: the agent's events into the run's record;
- finalize: held-out scores and write-back of the predictions;
- job: the job an agent receives.

Celery tasks (potato_queue.tasks) are a few lines around dispatch; nothing here imports Celery.
"""
