"""The training worker (standard library at import time, Python 3.8+).

Trainers import their own dependencies lazily, so a missing package is a
clear exit 3 with an install hint, not an import crash.
"""

from typing import List

__all__: List[str] = []
