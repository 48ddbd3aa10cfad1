"""The long-running processes: the server, an executor, beat and `up` (which starts the others), with
the Celery wiring they share (queue.py, tasks.py). Each takes its settings as arguments; only cli/
reads the command line and the environment."""
