"""Collapse diagnostics of the confidence turn, against hand-computed values."""

import math

import pytest
import torch

from trl_ext.core.confidence_diagnostics import (
    confidence_correctness_correlation,
    confidence_leak,
    confidence_spread,
)


NAN = math.nan


def test_spread_within_siblings_and_across_answers():
    # answers: [0.2, 0.4] (mean 0.3, std 0.1), [0.9, 0.9] (0.9, 0), [nan, 0.5] (0.5, one sibling), [nan, nan]
    within, across = confidence_spread(torch.tensor([0.2, 0.4, 0.9, 0.9, NAN, 0.5, NAN, NAN]), 2)
    assert within == pytest.approx(0.05)  # mean of 0.1 and 0; one parsed sibling has no spread to measure
    assert across == pytest.approx(math.sqrt(((0.3 - 17 / 30) ** 2 + (0.9 - 17 / 30) ** 2 + (0.5 - 17 / 30) ** 2) / 3))


def test_spread_of_a_constant_confidence_is_zero_and_of_nothing_none():
    assert confidence_spread(torch.full((6,), 0.25), 3) == (0.0, 0.0)
    assert confidence_spread(torch.full((4,), NAN), 2) == (None, None)


def test_correlation_with_correctness():
    corr = confidence_correctness_correlation
    # NaN on either side leaves the pair out: (1, 1) and (0, 0) remain
    assert corr(torch.tensor([1.0, 0.0, NAN, 0.5]), torch.tensor([1.0, 0.0, 1.0, NAN])) == pytest.approx(1.0)
    assert corr(torch.tensor([0.9, 0.1]), torch.tensor([0.0, 1.0])) == pytest.approx(-1.0)
    # centred: confidences (0.2, 0, -0.2), labels (1/3, -2/3, 1/3): orthogonal
    conf = torch.tensor([0.8, 0.6, 0.4], dtype=torch.float64)
    assert corr(conf, torch.tensor([1.0, 0.0, 1.0])) == pytest.approx(0.0, abs=1e-12)


def test_correlation_is_undefined_for_a_constant_side():
    assert confidence_correctness_correlation(torch.tensor([0.3, 0.3]), torch.tensor([1.0, 0.0])) is None
    assert confidence_correctness_correlation(torch.tensor([0.2, 0.9]), torch.tensor([1.0, 1.0])) is None
    assert confidence_correctness_correlation(torch.tensor([0.2]), torch.tensor([1.0])) is None


@pytest.mark.parametrize(
    "text, leaked",
    [
        ("<answer>33</answer>", False),
        ("<answer>10.5</answer>", False),
        ("3.5 apples", False),
        ("<answer>0.8</answer>", True),
        ("<answer>.5</answer>", True),
        ("<answer>80%</answer>", True),
        ("<answer>12</answer><confidence>", True),
        ("</analysis> 12", True),
    ],
)
def test_confidence_leak(text, leaked):
    assert confidence_leak(text, ("confidence", "analysis")) is leaked
