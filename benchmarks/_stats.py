"""Intervals as the replay and Absolute Zero benchmarks report them, on the project's own pieces: the bootstrap of
`trl_ext.evaluation.calibration`, the question normalisation of the built-in data's splits
(`trl_ext.data.normalise_question`)."""

from __future__ import annotations

from trl_ext.data.graded_arithmetic import normalise_question
from trl_ext.evaluation.calibration import bootstrap_mean_interval


__all__ = ["bootstrap_interval", "normalise_question", "paired_difference_interval"]

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def bootstrap_interval(values, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """Percentile bootstrap 95% interval of the mean of `values` (fixed rng): `{"value", "low", "high", "n"}`.
    `None` values (not judged) are left out."""
    data = [float(v) for v in values if v is not None]
    if not data:
        return {"value": None, "low": None, "high": None, "n": 0}
    low, high = bootstrap_mean_interval(data, n_resamples=resamples, seed=seed)
    return {"value": sum(data) / len(data), "low": low, "high": high, "n": len(data)}


def paired_difference_interval(a, b, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """Bootstrap 95% interval of mean(a) - mean(b) over paired items (the same questions answered by two runs)."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    return bootstrap_interval([x - y for x, y in pairs], resamples=resamples, seed=seed)
