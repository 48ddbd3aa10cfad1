"""The end-to-end tier: real Redis, Celery, sshd, SLURM, Chromium and network namespaces, by area."""
