"""A second confidence column beside the greedy stated one: the mean of k stated confidences sampled for one answer.

The greedy stated confidence is the mode of what the model states. After RL it can be one value per difficulty level
while the confidences the model samples at temperature 1 for the same answer still differ, so the mean of k sampled
confidence-turn replies (the confidence-turn prompt exactly as the greedy confidence turn builds it, on tokens) asks
whether the model's stated-confidence distribution, not its mode, knows which answers are right. It costs k short
replies per question; the cost is reported in generated tokens, as the sampling agreement's is
([`~trl_ext.evaluation.agreement`]).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..rewards import extract_confidence
from .agreement import sampled_parses


def mean_confidence(values: Sequence[float | None]) -> float | None:
    """The mean of the parsed `values` (`None`: an unparsable reply, left out); `None` when none parsed, so that the
    row's mean confidence counts as unparsable, as a greedy one that does not parse."""
    parsed = [value for value in values if value is not None]
    return sum(parsed) / len(parsed) if parsed else None


def sampled_confidences(
    model,
    tokenizer,
    prompts: list[list[int]],
    k: int,
    max_new_tokens: int,
    confidence_tag: str = "confidence",
    lenient: bool = False,
    rows_per_call: int = 128,
    seed: int = 0,
) -> tuple[list[list[float | None]], int]:
    """Per confidence-turn prompt (token ids: question, greedy answer and confidence question), the confidences
    parsed from `k` replies sampled at temperature 1 (`None`: unparsable; `confidence_tag`/`lenient` as training
    parses them), seeded with `seed` (+ the call's first prompt index; about `rows_per_call` rows per call), and the number of tokens the replies generated."""
    return sampled_parses(
        model,
        tokenizer,
        prompts,
        k,
        max_new_tokens,
        lambda text: extract_confidence(text, confidence_tag, lenient),
        rows_per_call=rows_per_call,
        seed=seed,
    )
