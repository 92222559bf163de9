"""The noise flag that step times alone justify: high_cv, the same rule in a setup's process
(its own steps) and in the report (the spread between processes).

The 5% threshold follows the spread seen between identical eager processes on an H200
(docs/report.md). Other flags come from NVML (measure/telemetry.py) and torch.compile
(measure/step.py).
"""

from __future__ import annotations

import statistics
from typing import Sequence

CV_THRESHOLD = 0.05


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Sample standard deviation over mean; None for fewer than 2 values or a zero mean."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def noise_flags_for(step_times_ms: Sequence[float], cv_threshold: float = CV_THRESHOLD) -> list[str]:
    """["high_cv"] when the coefficient of variation is above `cv_threshold`; fewer than 2 values
    give no flag, since there is no spread to judge."""
    cv = coefficient_of_variation(step_times_ms)
    return ["high_cv"] if cv is not None and cv > cv_threshold else []
