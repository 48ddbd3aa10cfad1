"""A run's checkpoints on the training machine: where they are, when one is due, saving one whole.

Standard library only, Python 3.8+. A trainer that runs long enough to be
preempted saves its state every ``checkpoint_every_steps`` steps (and at once
when the run is preempted, stop.py's SIGUSR1), and on start resumes from the
newest whole checkpoint. The folder outlives the worker: a SLURM job
requeued after a preemption runs the same spec again and finds it. The agent
names it in spec.json (outside the job folder, so that a retry of a failed run
finds it too: agent/checkpoints.py); without that, it sits beside the workdir.

Layout: ``<checkpoint_dir>/step-<N>/`` holds what the trainer wrote, then
``DONE`` (written last, after the files are flushed): a folder without it is
a save cut short, never resumed from. Older whole checkpoints are removed once
a newer one is whole, so at most one (plus one being written) takes disk.
"""

import os
import re
import shutil
from typing import Callable, List, NamedTuple, Optional

__all__ = ["Checkpoints", "Checkpoint", "DONE_FILE", "CHECKPOINT_DIR_NAME", "default_checkpoint_dir"]

CHECKPOINT_DIR_NAME = "checkpoints"
DONE_FILE = "DONE"
_STEP_FOLDER = re.compile(r"^step-(\d+)$")


class Checkpoint(NamedTuple):
    step: int
    path: str


def default_checkpoint_dir(workdir: str) -> str:
    """Beside the workdir, for a spec that names no checkpoint_dir: it outlives one worker (a requeued job)."""
    return os.path.join(os.path.dirname(os.path.abspath(workdir)), CHECKPOINT_DIR_NAME)


def _fsync_tree(folder: str) -> None:
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            with open(os.path.join(parent, name), "rb") as fh:
                os.fsync(fh.fileno())


class Checkpoints:
    """One run's checkpoint folder: ``latest()``, ``due(step)``, ``save(step, write)``."""

    def __init__(self, folder: str, every_steps: int = 0) -> None:
        self.folder = folder
        self.every_steps = max(0, int(every_steps))  # 0: only when preempted
        self.saved_step: Optional[int] = None

    def _whole(self) -> List[Checkpoint]:
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        found = []
        for name in names:
            match = _STEP_FOLDER.fullmatch(name)
            path = os.path.join(self.folder, name)
            if match and os.path.isfile(os.path.join(path, DONE_FILE)):
                found.append(Checkpoint(int(match.group(1)), path))
        return sorted(found)

    def remove_all(self) -> None:
        """Once the run has its result: the folder and everything in it."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def latest(self) -> Optional[Checkpoint]:
        """The newest whole checkpoint, or None."""
        whole = self._whole()
        return whole[-1] if whole else None

    def due(self, step: int) -> bool:
        """Whether `step` (steps done so far) is one to save at."""
        return self.every_steps > 0 and step > 0 and step % self.every_steps == 0 and step != self.saved_step

    def save(self, step: int, write: Callable[[str], None]) -> Checkpoint:
        """`write(folder)` puts the trainer's state into a fresh folder; it counts once DONE is on disk."""
        path = os.path.join(self.folder, "step-{}".format(step))
        shutil.rmtree(path, ignore_errors=True)  # a save of this step cut short before
        os.makedirs(path, mode=0o700)
        write(path)
        _fsync_tree(path)
        with open(os.path.join(path, DONE_FILE), "w", encoding="utf-8") as fh:
            fh.write("{}\n".format(step))
            fh.flush()
            os.fsync(fh.fileno())
        for name in os.listdir(self.folder):  # older ones, whole or cut short
            if _STEP_FOLDER.fullmatch(name) and os.path.join(self.folder, name) != path:
                shutil.rmtree(os.path.join(self.folder, name), ignore_errors=True)
        self.saved_step = step
        return Checkpoint(step, path)
