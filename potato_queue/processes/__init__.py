"""The long-running processes: the server (server.py), an executor (executor.py), beat (beat.py) and `up`
(up.py, which starts the others, and a private Redis from embedded_redis.py when none answers), with
the checks before they start (startup.py) and the Celery wiring they share (queue.py, tasks.py). Each
takes its settings as arguments; only cli/ reads the command line and the environment (settings.py)."""
