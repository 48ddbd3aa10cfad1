"""potato-queue: the command line, laid out like Celery's celery/bin/: one module per family of commands.

main.py (the tree, `validate`, and `main`, the potato-queue command), options.py (what every command
shares: the config argument, the Redis option, errors printed with their fix, the project's RunService),
processes.py (serve, executor, beat, up), runs.py (training run, runs, cancel, retry, logs, bundle),
backends.py (training check, register, agent), agents.py (an agent backend's token, for its
admin), insight.py (training compare, next, quality), potato.py (Potato's side), output.py (what the
commands print: tables, logs, --follow). Heavy imports (Celery, FastAPI, torch) happen inside the commands
that need them, so `potato-queue validate` starts fast on a small VM.
"""
