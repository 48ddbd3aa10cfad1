"""The plug-in boundary: one module per backend type (local, ssh, slurm, agent).

Each module implements the contract of executors.base and imports no other
executor, nor Celery or FastAPI.
"""

BACKEND_TYPES = ("local", "ssh", "slurm", "agent")
