"""Reward functions for RLCR (answer correctness + calibrated confidence), in TRL's reward-function signature.

Each factory returns a plain function `f(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]`
whose `__name__` is the metric name TRL logs. Dataset columns arrive as keyword lists with one entry per
completion. Rewards are floats in [0, 1], or `None` for a row that cannot be judged (no gold answer: TRL's "not
applicable"); nothing about the model's output can make them raise.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from collections.abc import Callable, Sequence
from typing import Any

from .parsing import completion_text, extract_answer, extract_confidence, parse_confidence
from .user_calls import UserCallGuard
from .verify import verify_answer, verify_answers_counted


__all__ = [
    "RewardFunction",
    "accuracy_reward",
    "brier_reward",
    "format_reward",
    "is_missing",
    "make_accuracy_reward",
    "make_brier_reward",
    "make_confidence_format_reward",
    "make_format_reward",
]

RewardFunction = Callable[..., list[float | None]]


def _column(kwargs: dict[str, Any], column: str, reward_name: str, num_completions: int) -> Sequence[Any]:
    """The dataset column `column`, checked to be present and to have one entry per completion."""
    if column not in kwargs or kwargs[column] is None:
        available = sorted(key for key in kwargs if not key.startswith("_"))
        raise ValueError(
            f"The {reward_name!r} reward needs the dataset column {column!r}, which is not among the columns passed "
            f"to reward functions: {available}."
        )
    values = kwargs[column]
    if not isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        try:
            values = list(values)  # e.g. a numpy array or a tensor
        except TypeError:
            pass
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
        raise ValueError(
            f"Column {column!r} must be a list with one value per completion, got {type(values).__name__}."
        )
    if len(values) != num_completions:
        raise ValueError(
            f"The {reward_name!r} reward got {len(values)} values in column {column!r} for {num_completions} "
            "completions."
        )
    return values


def _tag_names_ok(*tags: str) -> None:
    for tag in tags:
        if not isinstance(tag, str) or not tag or re.search(r"[<>/\s]", tag):
            raise ValueError(f"Invalid tag name {tag!r}: use a non-empty name without '<', '>', '/' or whitespace.")


def _gold_text(gold: Any) -> str:
    return gold if isinstance(gold, str) else str(gold)


def is_missing(value: Any) -> bool:
    """Whether a dataset value is absent: `None`, NaN, or a string of whitespace only (a blank CSV cell, a null
    JSON field). A missing gold answer makes a row unscorable, never wrong."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and math.isnan(value)


def _log_metric(kwargs: dict[str, Any], name: str, value: float) -> None:
    """Report a scalar through TRL's `log_metric` reward kwarg (averaged over processes and the logging step)."""
    log_metric = kwargs.get("log_metric")
    if callable(log_metric):
        log_metric(name, value)


def make_accuracy_reward(
    answer_tag: str = "answer",
    solution_column: str = "solution",
    accuracy_func: Callable[[str, str], bool] = verify_answer,
    lenient: bool = False,
) -> RewardFunction:
    """Build the `accuracy` reward: 1.0 if the last `<answer_tag>` content matches the gold answer, else 0.0.

    The gold answer is read from the `solution_column` dataset column (non-strings are converted with `str()`)
    and compared with `accuracy_func(gold, answer)`. A missing or empty answer tag (with `lenient`: and no number
    in the text, see `extract_answer`) gives 0.0. A row without a usable gold answer (`None`, NaN, blank, see
    `is_missing`) gives `None` (not applicable: TRL leaves it out of the baselines); so does a row on which
    `accuracy_func` raises (its first traceback is logged once). A missing column raises `ValueError` (a
    configuration error).

    Metrics, through TRL's `log_metric`, as fractions of the call's rows: `accuracy/missing_gold_rate`,
    `errors/accuracy_func_rate` (a custom `accuracy_func` only) and `accuracy/unverified_rate` (pairs math_verify
    had no time left for in the batch, scored `None`; the default `accuracy_func` only).
    """
    _tag_names_ok(answer_tag)
    call_user = UserCallGuard("accuracy_func", "the row is scored None (not applicable)", "errors/accuracy_func_rate")

    @functools.wraps(accuracy_func)  # the guard logs the user's function by name
    def compare(gold: Any, answer: str) -> bool:
        return bool(accuracy_func(_gold_text(gold), answer))

    def accuracy(
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """1.0 per completion whose last `<answer>` matches the row's gold solution, else 0.0; None without gold."""
        golds = _column(kwargs, solution_column, "accuracy", len(completions))
        rewards: list[float | None] = [0.0] * len(completions)
        checked, pairs = [], []  # completions with an answer and a gold answer to compare it with
        missing = 0
        for index, (completion, gold) in enumerate(zip(completions, golds)):
            if is_missing(gold):
                rewards[index] = None
                missing += 1
                continue
            answer = extract_answer(completion_text(completion), answer_tag, lenient)
            if answer:
                checked.append(index)
                pairs.append((gold, answer))
        rows = max(len(completions), 1)
        _log_metric(kwargs, "accuracy/missing_gold_rate", missing / rows)
        if accuracy_func is verify_answer:
            # one round trip to the verifier worker for the whole batch
            verdicts, unverified = verify_answers_counted(pairs)
            _log_metric(kwargs, "accuracy/unverified_rate", unverified / rows)
        else:
            verdicts, errors = [], 0
            for gold, answer in pairs:
                verdict, ok = call_user(compare, gold, answer)
                verdicts.append(verdict if ok else None)
                errors += not ok
            _log_metric(kwargs, "errors/accuracy_func_rate", errors / rows)
        for index, correct in zip(checked, verdicts):
            rewards[index] = None if correct is None else 1.0 if correct else 0.0
        return rewards

    return accuracy


def _label_value(label: Any, column: str) -> float | None:
    """A correctness label as 0.0/1.0 (soft labels in [0, 1] are kept), `None` when missing (see `is_missing`);
    anything else is a data error."""
    if is_missing(label):
        return None
    try:
        value = float(label)
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"Column {column!r} must hold correctness labels in [0, 1] (bool, 0/1), got {label!r}.")
    return value


def make_brier_reward(
    confidence_tag: str = "confidence", label_column: str = "answer_correct", lenient: bool = False
) -> RewardFunction:
    """Build the `brier` reward: `1 - (label - c) ** 2`, with c the confidence in the last `<confidence_tag>`.

    The label (bool or 0/1) comes from the `label_column` column. An unparsable or missing confidence gives 0.0
    (with `lenient`, an untagged number in the reply counts, see `extract_confidence`). A missing label (`None`,
    NaN: e.g. the answer had no gold to be judged against) gives `None`, not applicable. A missing column, or a label
    that is not a number in [0, 1], raises `ValueError` (a data error, not model output).
    """
    _tag_names_ok(confidence_tag)

    def brier(
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """Brier-score reward `1 - (label - confidence) ** 2` per completion; 0.0 without a valid confidence, None
        without a label."""
        column = _column(kwargs, label_column, "brier", len(completions))
        labels = [_label_value(label, label_column) for label in column]
        rewards: list[float | None] = []
        for completion, label in zip(completions, labels):
            if label is None:
                rewards.append(None)
                continue
            confidence = extract_confidence(completion_text(completion), confidence_tag, lenient)
            rewards.append(0.0 if confidence is None else 1.0 - (label - confidence) ** 2)
        return rewards

    return brier


def _counts_ok(text: str, tags: Sequence[str], expected: int) -> bool:
    return all(text.count(f"<{tag}>") == expected and text.count(f"</{tag}>") == expected for tag in tags)


def make_format_reward(think_tag: str = "think", answer_tag: str = "answer") -> RewardFunction:
    """Build the `format` reward: 1.0 iff the completion is exactly `<think>...</think>` then `<answer>...</answer>`.

    Surrounding whitespace and whitespace between the two blocks are allowed; each tag must appear exactly once
    and the answer must be non-empty.
    """
    _tag_names_ok(think_tag, answer_tag)
    think, answer = re.escape(think_tag), re.escape(answer_tag)
    pattern = re.compile(rf"<{think}>.*?</{think}>\s*<{answer}>(.*?)</{answer}>", re.DOTALL)

    def format(  # the metric name TRL logs
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """1.0 per completion shaped exactly `<think>...</think><answer>...</answer>`, else 0.0."""
        rewards = []
        for completion in completions:
            text = completion_text(completion).strip()
            ok = False
            if _counts_ok(text, (think_tag, answer_tag), 1):
                match = pattern.fullmatch(text)
                ok = match is not None and bool(match.group(1).strip())
            rewards.append(1.0 if ok else 0.0)
        return rewards

    return format


def make_confidence_format_reward(
    analysis_tag: str = "analysis", confidence_tag: str = "confidence"
) -> RewardFunction:
    """Build the `confidence_format` reward: 1.0 iff the completion ends with an optional `<analysis>...</analysis>`
    followed by `<confidence>X</confidence>` with a parsable X (see `parse_confidence`).

    The confidence tag must appear exactly once and the analysis tag at most once. Text before the block (e.g. the
    `<think>`/`<answer>` part of an RLCR completion) is not checked here: `format` covers it.
    """
    _tag_names_ok(analysis_tag, confidence_tag)
    analysis, confidence = re.escape(analysis_tag), re.escape(confidence_tag)
    pattern = re.compile(
        rf"(?:<{analysis}>.*?</{analysis}>\s*)?<{confidence}>(.*?)</{confidence}>\Z",
        re.DOTALL,
    )

    def confidence_format(
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """1.0 per completion ending in `[<analysis>...</analysis>] <confidence>X</confidence>`, else 0.0."""
        rewards = []
        for completion in completions:
            text = completion_text(completion).strip()
            ok = False
            if _counts_ok(text, (confidence_tag,), 1):
                analysis_count = text.count(f"<{analysis_tag}>")
                if analysis_count <= 1 and text.count(f"</{analysis_tag}>") == analysis_count:
                    match = pattern.search(text)
                    # With an analysis block present, it must be the one directly before the confidence.
                    if match is not None and (analysis_count == 0 or match.group(0).startswith(f"<{analysis_tag}>")):
                        ok = parse_confidence(match.group(1)) is not None
            rewards.append(1.0 if ok else 0.0)
        return rewards

    return confidence_format


accuracy_reward = make_accuracy_reward()
brier_reward = make_brier_reward()
format_reward = make_format_reward()
