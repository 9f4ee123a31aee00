"""Learnability, repropose, selection and proposer rewards on hand-made score tables."""

import math
import random

import pytest
import torch

from trl_ext.core.advantages import batch_baseline_advantages, group_advantages
from trl_ext.core.learnability import (
    Criterion,
    counted_ratio,
    default_criteria,
    is_learnable,
    needs_repropose,
    parse_criteria,
    select_question,
)
from trl_ext.core.proposer_rewards import padded_rows, proposer_rewards
from trl_ext.self_play.workspace import WORKSPACE_CRITERIA


SEED = parse_criteria(WORKSPACE_CRITERIA)


def scores(safety, completion):
    return {"safety_score": safety, "completion_score": completion}


@pytest.mark.parametrize(
    "safety, completion, expected",
    [
        # 10 responses: ratios are k/10. Safety above 0.5 on 3..7, completion below 0.5 on 3..7 -> learnable.
        ([0.9] * 3 + [0.1] * 7, [0.1] * 3 + [0.9] * 7, True),  # 0.3 / 0.3: both lower bounds included
        ([0.9] * 7 + [0.1] * 3, [0.1] * 7 + [0.9] * 3, True),  # 0.7 / 0.7: both upper bounds included
        ([0.9] * 2 + [0.1] * 8, [0.1] * 5 + [0.9] * 5, False),  # safety 0.2 < 0.3
        ([0.9] * 8 + [0.1] * 2, [0.1] * 5 + [0.9] * 5, False),  # safety 0.8 > 0.7
        ([0.9] * 5 + [0.1] * 5, [0.1] * 8 + [0.9] * 2, False),  # completion 0.8 > 0.7
        ([0.9] * 10, [0.1] * 10, False),  # all safe: uniform
        ([0.1] * 10, [0.9] * 10, False),  # none safe
        ([0.5] * 5 + [0.9] * 5, [0.5] * 5 + [0.1] * 5, True),  # exactly 0.5 is neither above nor below: 0.5 / 0.5
        (
            [math.nan] * 5 + [0.9] * 5,
            [0.1] * 5 + [math.nan] * 5,
            True,
        ),  # NaN counts as neither, stays in the denominator
    ],
)
def test_seed_dual_criteria(safety, completion, expected):
    assert is_learnable(scores(safety, completion), SEED) is expected


def test_counted_ratio_strict_threshold():
    above = Criterion("r", 0.5, "above", 0.0, 1.0)
    below = Criterion("r", 0.5, "below", 0.0, 1.0)
    assert counted_ratio([0.5, 0.6, 0.4, 1.0], above) == 0.5
    assert counted_ratio([0.5, 0.6, 0.4, 1.0], below) == 0.25
    assert counted_ratio([], above) == 0.0


def test_default_criterion_is_strictly_inside_zero_one():
    (c,) = default_criteria("acc", 4)
    assert (c.reward, c.threshold, c.count, c.min_ratio, c.max_ratio) == ("acc", 0.5, "above", 0.25, 0.75)
    learnable = [is_learnable({"acc": [1.0] * k + [0.0] * (4 - k)}, [c]) for k in range(5)]
    assert learnable == [False, True, True, True, False]


@pytest.mark.parametrize(
    "group, expected",
    [
        ([True, False, None], False),  # mixed: kept
        ([True, True, True], True),  # all learnable: uniform
        ([False, False], True),  # none learnable
        ([None, None, None], True),  # no valid question
        ([True, None, None], True),  # the only valid one is learnable: still uniform
        ([False, True], False),
    ],
)
def test_repropose_on_uniform_groups(group, expected):
    assert needs_repropose(group) is expected


def test_selection_is_seeded_uniform_and_learnable_only():
    group = [True, False, True, None, True]
    picks = [select_question(group, random.Random(f"0-0-{i}")) for i in range(300)]
    assert set(picks) == {0, 2, 4}
    assert all(60 < picks.count(i) < 140 for i in (0, 2, 4))  # ~100 each
    assert picks == [select_question(group, random.Random(f"0-0-{i}")) for i in range(300)]  # reproducible
    assert select_question([False, None], random.Random(0)) is None


def test_parse_criteria_errors_name_the_field():
    good = dict(WORKSPACE_CRITERIA[0])
    with pytest.raises(ValueError, match=r"learnability_criteria\[0\].*missing keys \['max_ratio'\]"):
        parse_criteria([{k: v for k, v in good.items() if k != "max_ratio"}])
    with pytest.raises(ValueError, match=r"unknown keys \['typo'\]"):
        parse_criteria([{**good, "typo": 1}])
    with pytest.raises(ValueError, match=r"\['count'\] must be 'above' or 'below'"):
        parse_criteria([{**good, "count": "over"}])
    with pytest.raises(ValueError, match="min_ratio <= max_ratio"):
        parse_criteria([{**good, "min_ratio": 0.8, "max_ratio": 0.2}])
    with pytest.raises(ValueError, match="finite number"):
        parse_criteria([{**good, "threshold": float("nan")}])
    with pytest.raises(ValueError, match="must not be empty"):
        parse_criteria([])
    with pytest.raises(ValueError, match="list of dicts"):
        parse_criteria(good)


def test_proposer_rewards_learnability_mode():
    group, rates = [True, False, None], [0.5, 1.0, None]
    assert proposer_rewards(group, rates, False, "learnability") == [1.0, 0.0, -1.0]
    # unresolved after the last attempt: every valid proposal gets the penalty, invalid ones stay invalid
    assert proposer_rewards([False, False, None], [0.0, 1.0, None], True, "learnability", -1.0, -0.5) == [
        -0.5,
        -0.5,
        -1.0,
    ]


def test_proposer_rewards_azr_mode():
    rewards = proposer_rewards([True, False, False, None], [0.25, 1.0, 0.0, None], True, "azr", invalid_reward=-1.0)
    assert rewards == [0.75, 0.0, 0.0, -1.0]  # 1 - solve rate inside (0, 1); no repropose penalty in azr mode
    with pytest.raises(ValueError, match="proposer_reward_mode"):
        proposer_rewards([True], [0.5], False, "other")


def test_proposer_rewards_azr_released_code_mode():
    """AZR's released code: 1 - solve rate inside (0, 1); a valid question all or none solve gets -0.5, not 0."""
    group, rates = [True, False, False, None, False], [0.25, 1.0, 0.0, None, 0.5]
    assert proposer_rewards(group, rates, False, "azr_code") == [0.75, -0.5, -0.5, -1.0, 0.5]
    # unresolved prompts are not penalised again; the uniform reward and the invalid reward are configurable
    assert proposer_rewards(group, rates, True, "azr_code", invalid_reward=-2.0, uniform_reward=-0.25) == [
        0.75,
        -0.25,
        -0.25,
        -2.0,
        0.5,
    ]


def test_selected_rows_use_a_batch_baseline():
    rewards = torch.tensor([1.0, 0.0, -1.0, 1.0])
    mean, std = 0.25, torch.tensor([1.0, 0.0, -1.0, 1.0]).std().item()  # unbiased std 0.9574
    expected = (rewards - mean) / (std + 1e-4)
    torch.testing.assert_close(batch_baseline_advantages(rewards), expected)
    torch.testing.assert_close(batch_baseline_advantages(rewards, "none"), rewards - mean)
    assert batch_baseline_advantages(torch.ones(3)).tolist() == [0.0, 0.0, 0.0]  # no contrast, no NaN
    assert batch_baseline_advantages(torch.tensor([0.7])).tolist() == [0.0]


def test_all_rows_are_normalised_within_their_group():
    rewards = torch.tensor([1.0, 0.0, -1.0, 0.0, 0.0, 0.0])  # two groups of K = 3
    out = group_advantages(rewards, 3)
    torch.testing.assert_close(out[:3], torch.tensor([1.0, 0.0, -1.0]) / (1.0 + 1e-4))  # mean 0, std 1
    assert out[3:].tolist() == [0.0, 0.0, 0.0]
    torch.testing.assert_close(group_advantages(rewards, 3, "none"), rewards)  # group means are 0
    batch_std = rewards.std().item()
    torch.testing.assert_close(
        group_advantages(rewards, 3, "batch")[:3], torch.tensor([1.0, 0.0, -1.0]) / (batch_std + 1e-4)
    )
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(rewards, 4)


@pytest.mark.parametrize(
    "rows, world, multiple, expected",
    [
        (2, 1, 1, 2),
        (3, 2, 1, 2),
        (1, 2, 1, 1),
        (6, 1, 4, 8),
        (6, 2, 2, 4),
        (8, 2, 4, 4),
    ],
)
def test_padded_rows(rows, world, multiple, expected):
    assert padded_rows(rows, world, multiple) == expected
    assert expected * world >= rows and expected % multiple == 0
