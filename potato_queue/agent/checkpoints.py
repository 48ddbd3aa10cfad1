"""Where a run's checkpoints live on the training machine, and how long a failed run's stay.

Standard library only, Python 3.8+. The checkpoints sit outside the run's job
folder (which the ssh executor removes when the run ends, and the agent may
too), in ``<the agent's workdir>/checkpoints/<run_id>/``: a run whose worker
was killed leaves them there, and a retry of it (its job's ``resume_of``)
resumes from them instead of starting over. The worker removes the folder when
a run succeeds; a run never retried leaves its folder behind, so the agent
removes folders untouched for ``MAX_AGE_S`` when it starts a run.
"""

import os
import shutil
import socket
import time
from typing import Optional

from potato_queue.wire.checkpoint import Checkpoints
from potato_queue.wire.job import Job

__all__ = ["CHECKPOINTS_FOLDER", "MAX_AGE_S", "checkpoint_root", "checkpoint_dir_for", "prune_stale", "resume_note"]

CHECKPOINTS_FOLDER = "checkpoints"
# A failed run's checkpoints wait this long for a retry (docs/operations.md): a week covers a weekend,
# and a fine-tune's checkpoints are gigabytes, so they must not wait forever.
MAX_AGE_S = 7 * 24 * 3600.0


def checkpoint_root(base_dir: str) -> str:
    """`<the agent's workdir>/checkpoints`: beside the runs' job folders, not inside one."""
    return os.path.join(os.path.abspath(base_dir), CHECKPOINTS_FOLDER)


def checkpoint_dir_for(root: str, job: Job) -> str:
    """The run's checkpoint folder (made, 0700): a retry's is the run's it resumes (Job.from_dict checked
    that resume_of is a run id, not a path)."""
    folder = os.path.join(root, job.resume_of or job.run_id)
    for _ in range(3):
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            break
        except FileNotFoundError:
            continue  # another run's end removed the root while it was empty (the runs share it): again
    os.chmod(root, 0o700)  # os.makedirs gives the mode to the leaf only; checkpoints hold the training data
    return folder


def prune_stale(root: str, keep: str, now_s: Optional[float] = None) -> None:
    """Remove the checkpoint folders no run has written to for MAX_AGE_S (but `keep`, the one about to be used)."""
    try:
        names = os.listdir(root)
    except OSError:
        return  # none yet
    limit = (time.time() if now_s is None else now_s) - MAX_AGE_S
    for name in names:
        path = os.path.join(root, name)
        try:
            stale = os.path.isdir(path) and name != os.path.basename(keep) and os.stat(path).st_mtime < limit
        except OSError:
            continue  # removed meanwhile by another agent sharing the folder
        if stale:
            shutil.rmtree(path, ignore_errors=True)


def resume_note(job: Job, folder: str) -> Optional[str]:
    """What the run's log says of a retry: where it resumes, or that this machine has nothing to resume."""
    if job.resume_of is None:
        return None
    found = Checkpoints(folder).latest()
    if found is None:
        return "no checkpoint of run {} on this machine ({}): starting from the beginning".format(
            job.resume_of, socket.gethostname()
        )
    return "resuming run {} from its checkpoint at step {}".format(job.resume_of, found.step)
