"""Reward functions: answer accuracy, Brier-score calibration, output format, an LLM judge, and guarded user calls."""

from .functions import (
    RewardFunction,
    accuracy_reward,
    brier_reward,
    format_reward,
    is_missing,
    make_accuracy_reward,
    make_brier_reward,
    make_confidence_format_reward,
    make_format_reward,
)
from .judge import LLMJudge, parse_judge_score
from .parsing import (
    completion_text,
    extract_answer,
    extract_confidence,
    extract_tag,
    normalize_answer,
    parse_confidence,
)
from .verify import verify_answer, verify_answers, verify_answers_counted


__all__ = [
    "LLMJudge",
    "RewardFunction",
    "accuracy_reward",
    "brier_reward",
    "completion_text",
    "extract_answer",
    "extract_confidence",
    "extract_tag",
    "format_reward",
    "is_missing",
    "make_accuracy_reward",
    "make_brier_reward",
    "make_confidence_format_reward",
    "make_format_reward",
    "normalize_answer",
    "parse_confidence",
    "parse_judge_score",
    "verify_answer",
    "verify_answers",
    "verify_answers_counted",
]
