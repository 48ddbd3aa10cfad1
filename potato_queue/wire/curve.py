"""A learning curve's names and its reading: what the worker writes (worker/curve.py fits the points) and
the server reads back from a run's metrics (insight/report.py). Standard library only, Python 3.8+.

A point is a metric event of split ``curve`` named ``<percent>/<schema>/<measure>``; each smaller train set
is the start of one seeded shuffle of the train items, so 25 % is inside 50 %, inside 75 %.
"""

import math
import random
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["CURVE_PARAM", "CURVE_PERCENTS", "CURVE_SPLIT", "curve_train_ids", "curve_metric_name", "read_curve"]

CURVE_PARAM = "learning_curve"
CURVE_PERCENTS = (25, 50, 75, 100)
CURVE_SPLIT = "curve"  # the metric events' split


def curve_train_ids(train_ids: List[str], percent: int, seed: Optional[int]) -> List[str]:
    """The first *percent* of one seeded shuffle of *train_ids* (at least one item): nested across percents."""
    order = sorted(train_ids)
    random.Random(0 if seed is None else seed).shuffle(order)
    return order[: max(1, int(math.ceil(len(order) * percent / 100.0)))]


def curve_metric_name(percent: int, schema: str, measure: str) -> str:
    """A curve point's metric name (split ``curve``): ``<percent>/<schema>/<measure>``."""
    return "%d/%s/%s" % (percent, schema, measure)


def read_curve(metrics: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    """``{schema: [{"percent", measure: value, ...}, ...]}`` by percent, from a run record's metrics
    (``curve/<percent>/<schema>/<measure>``; a schema's name may hold ``/``); empty for a run without a curve."""
    points: Dict[Tuple[str, int], Dict[str, Any]] = {}
    prefix = CURVE_SPLIT + "/"
    for key, value in metrics.items():
        percent, _, rest = key[len(prefix) :].partition("/") if key.startswith(prefix) else ("", "", "")
        schema, _, measure = rest.rpartition("/")
        if not percent.isdigit() or not schema or not measure:
            continue
        point = points.setdefault((schema, int(percent)), {"percent": int(percent)})
        point[measure] = value
    curve: Dict[str, List[Dict[str, Any]]] = {}
    for (schema, _percent), point in sorted(points.items()):
        curve.setdefault(schema, []).append(point)
    return curve
