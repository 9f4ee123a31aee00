"""What tells a confidence turn that learns from one that collapses to a constant: pure functions over one batch.

A confidence equal to the base rate everywhere is calibrated and useless. These numbers show the difference: the
spread of stated confidences among the `G_c` siblings of one answer (no spread, no Brier difference, no gradient)
and across answers (no spread, no discrimination), and how stated confidence moves with correctness.
"""

from __future__ import annotations

import math
import re

import torch


def confidence_spread(confidences: torch.Tensor, group_size: int) -> tuple[float | None, float | None]:
    """`(within, across)` for confidences laid out as consecutive groups of `group_size` siblings (NaN: unparsed).

    `within` is the mean, over groups with at least two parsed siblings, of their population standard deviation;
    `across` is the population standard deviation of the per-group means, over groups with a parsed sibling.
    `None` where no group qualifies.
    """
    groups = confidences.double().view(-1, group_size)
    parsed = ~torch.isnan(groups)
    counts = parsed.sum(dim=1)
    filled = torch.where(parsed, groups, torch.zeros_like(groups))
    means = filled.sum(dim=1) / counts.clamp(min=1)
    squares = torch.where(parsed, (groups - means[:, None]) ** 2, torch.zeros_like(groups)).sum(dim=1)
    several = counts >= 2
    within = (squares[several] / counts[several]).sqrt().mean().item() if several.any() else None
    any_parsed = counts >= 1
    across = means[any_parsed].std(unbiased=False).item() if any_parsed.any() else None
    return within, across


def confidence_correctness_correlation(confidences: torch.Tensor, correct: torch.Tensor) -> float | None:
    """Pearson correlation between stated confidence and correctness (0/1) over the pairs where both are known;
    `None` when fewer than two pairs remain or either side is constant (undefined)."""
    conf, label = confidences.double(), correct.double()
    known = ~torch.isnan(conf) & ~torch.isnan(label)
    conf, label = conf[known], label[known]
    if conf.numel() < 2:
        return None
    conf, label = conf - conf.mean(), label - label.mean()
    norm = math.sqrt((conf**2).sum().item() * (label**2).sum().item())
    return None if norm == 0 else (conf * label).sum().item() / norm


# A number written the way a confidence is (0.7, .7, 70%): never the answer to an integer-valued question, so in
# the answer turn it shows the confidence turn's habits leaking into answers.
_CONFIDENCE_NUMBER = re.compile(r"(?<![\d.])(?:0?\.\d+|\d+(?:\.\d+)?\s*%)")


def confidence_leak(answer_text: str, tags: tuple[str, ...]) -> bool:
    """Whether an answer-turn completion carries the confidence turn's writing: one of its `tags` (e.g.
    `("confidence", "analysis")`) opened or closed, or a number written as a confidence (`0.7`, `.7`, `70%`)."""
    if any(f"<{tag}>" in answer_text or f"</{tag}>" in answer_text for tag in tags):
        return True
    return _CONFIDENCE_NUMBER.search(answer_text) is not None
