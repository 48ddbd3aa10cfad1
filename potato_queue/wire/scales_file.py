"""scales.json, ours beside Potato's bundle files: each scale scheme's scale as the project's config draws it
(an ordinal scheme's ``points`` in order, numbers or a labelled likert's label names; a continuous scheme's
``min``, ``max``, ``step`` where the config gives them). Potato's manifest names no scale, and a labelled
likert's answers are label names whose order nothing else says. A bundle Potato built has none.

Written by the server (bundle/write.py), read by the worker (worker/bundle.py) and by the server again
when it scores a run (runs/finalize.py, insight/). Standard library only, Python 3.8+.
"""

import os
from typing import Any, Dict

from potato_queue.wire.files import read_json

__all__ = ["SCALES_FILE", "ScalesError", "read_scales"]

SCALES_FILE = "scales.json"


class ScalesError(ValueError):
    """The bundle's scales.json cannot be read, or is not an object {schema: {scale}}."""


def read_scales(root: str) -> Dict[str, Dict[str, Any]]:
    """The bundle folder *root*'s scales.json (``{}`` when it has none: a bundle Potato built)."""
    path = os.path.join(root, SCALES_FILE)
    if not os.path.isfile(path):
        return {}
    scales = read_json(path, "the bundle's " + SCALES_FILE, ScalesError)
    if not isinstance(scales, dict) or not all(isinstance(v, dict) for v in scales.values()):
        raise ScalesError("The bundle's %s must be an object {schema: {scale}}" % SCALES_FILE)
    return {str(k): v for k, v in scales.items()}
