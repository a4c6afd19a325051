"""The figures every harness reports: one definition of a percentile."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def percentiles(values: np.ndarray | Sequence[float]) -> dict | None:
    """p50, p90, p99, p99.9, max, min, mean and count of `values` (None when there are none): the one
    definition every harness reports. Each percentile is a value that occurred (numpy's "higher"
    method: the next value up from the exact rank), never one interpolated between two."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return None
    pct = np.percentile(values, [50, 90, 99, 99.9], method="higher")
    return {"p50": round(float(pct[0]), 3), "p90": round(float(pct[1]), 3), "p99": round(float(pct[2]), 3),
            "p999": round(float(pct[3]), 3), "max": round(float(values.max()), 3),
            "min": round(float(values.min()), 3), "mean": round(float(values.mean()), 3), "count": int(values.size)}
