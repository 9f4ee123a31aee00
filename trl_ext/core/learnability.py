"""Learnability of proposed questions, the repropose decision, and the selection of one question per prompt.

Pure functions over tables of per-response reward scores, so the filter can be checked by hand
(docs/design.md#the-pure-core).
A question's responses are `rollout_n` solver completions; each reward function scores each response.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


COUNTS = ("above", "below")
CRITERION_KEYS = {"reward", "threshold", "count", "min_ratio", "max_ratio"}
# Ratios are k / rollout_n; a window bound written as a decimal (0.3, 0.7) must include the ratio it names.
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Criterion:
    """One learnability criterion: the fraction of responses whose `reward` score is strictly `count` ("above" or
    "below") `threshold` must lie in `[min_ratio, max_ratio]` (inclusive)."""

    reward: str
    threshold: float
    count: str
    min_ratio: float
    max_ratio: float


def parse_criteria(specs: Sequence[Mapping]) -> list[Criterion]:
    """Validate `learnability_criteria` dicts and return them as `Criterion`s; errors name the field and the fix."""
    if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Sequence):
        raise ValueError(
            "learnability_criteria must be a list of dicts with keys "
            f"{sorted(CRITERION_KEYS)} (got {type(specs).__name__})."
        )
    criteria = []
    for i, spec in enumerate(specs):
        where = f"learnability_criteria[{i}]"
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where} must be a dict with keys {sorted(CRITERION_KEYS)} (got {spec!r}).")
        missing, unknown = CRITERION_KEYS - set(spec), set(spec) - CRITERION_KEYS
        if missing or unknown:
            raise ValueError(
                f"{where} has missing keys {sorted(missing)} / unknown keys {sorted(unknown)}; a criterion is "
                "{reward: <reward function name>, threshold: float, count: 'above'|'below', min_ratio, max_ratio}."
            )
        if not isinstance(spec["reward"], str) or not spec["reward"]:
            raise ValueError(f"{where}['reward'] must be a reward function name (got {spec['reward']!r}).")
        if spec["count"] not in COUNTS:
            raise ValueError(f"{where}['count'] must be 'above' or 'below' (got {spec['count']!r}).")
        numbers = {}
        for key in ("threshold", "min_ratio", "max_ratio"):
            value = spec[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{where}['{key}'] must be a finite number (got {value!r}).")
            numbers[key] = float(value)
        if not 0.0 <= numbers["min_ratio"] <= numbers["max_ratio"] <= 1.0:
            raise ValueError(
                f"{where} needs 0 <= min_ratio <= max_ratio <= 1 (got min_ratio={numbers['min_ratio']}, "
                f"max_ratio={numbers['max_ratio']})."
            )
        criteria.append(
            Criterion(spec["reward"], numbers["threshold"], spec["count"], numbers["min_ratio"], numbers["max_ratio"])
        )
    if not criteria:
        raise ValueError("learnability_criteria must not be empty; leave it unset for the default criterion.")
    return criteria


def default_criteria(reward_name: str, rollout_n: int) -> list[Criterion]:
    """The default when `learnability_criteria` is unset: the first reward above 0.5 on some but not all responses.

    For ratios k / rollout_n, "strictly inside (0, 1)" is the window [1 / rollout_n, (rollout_n - 1) / rollout_n].
    """
    return [Criterion(reward_name, 0.5, "above", 1 / rollout_n, (rollout_n - 1) / rollout_n)]


def counted_ratio(scores: Sequence[float], criterion: Criterion) -> float:
    """Fraction of `scores` strictly above/below the threshold. NaN scores (reward not applicable) count as neither,
    but stay in the denominator: a response the reward could not judge is not evidence of success."""
    if not scores:
        return 0.0
    if criterion.count == "above":
        hits = sum(1 for s in scores if s > criterion.threshold)
    else:
        hits = sum(1 for s in scores if s < criterion.threshold)
    return hits / len(scores)


def in_window(ratio: float, criterion: Criterion) -> bool:
    return criterion.min_ratio - _TOLERANCE <= ratio <= criterion.max_ratio + _TOLERANCE


def is_learnable(scores: Mapping[str, Sequence[float]], criteria: Sequence[Criterion]) -> bool:
    """`scores[reward_name]` holds that reward's score for each of a question's responses; learnable iff every
    criterion's counted ratio is inside its window."""
    return all(in_window(counted_ratio(scores[c.reward], c), c) for c in criteria)


def needs_repropose(learnable: Sequence[bool | None]) -> bool:
    """A question group (one entry per proposal; `None` = invalid proposal) is reproposed when its valid questions
    are all learnable or all not learnable, or when none is valid: a uniform group gives the proposer no contrast."""
    valid = [x for x in learnable if x is not None]
    return len(set(valid)) != 2


def select_question(learnable: Sequence[bool | None], rng: random.Random) -> int | None:
    """Index of one learnable question drawn uniformly with `rng`, or `None` when the group has none."""
    candidates = [i for i, x in enumerate(learnable) if x]
    return rng.choice(candidates) if candidates else None
