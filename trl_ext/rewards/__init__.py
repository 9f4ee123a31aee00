"""Reward functions for RLCR-style training (answer accuracy, Brier-score calibration, output format)."""

from .functions import (
    RewardFunction,
    accuracy_reward,
    brier_reward,
    format_reward,
    make_accuracy_reward,
    make_brier_reward,
    make_confidence_format_reward,
    make_format_reward,
)
from .parsing import (
    completion_text,
    extract_answer,
    extract_confidence,
    extract_tag,
    normalize_answer,
    parse_confidence,
)
from .verify import verify_answer, verify_answers


__all__ = [
    "RewardFunction",
    "accuracy_reward",
    "brier_reward",
    "completion_text",
    "extract_answer",
    "extract_confidence",
    "extract_tag",
    "format_reward",
    "make_accuracy_reward",
    "make_brier_reward",
    "make_confidence_format_reward",
    "make_format_reward",
    "normalize_answer",
    "parse_confidence",
    "verify_answer",
    "verify_answers",
]
