"""Off-policy token loss of replayed rows against hand-computed values."""

import math

import pytest
import torch

from trl_ext.core.offpolicy_loss import (
    MAX_LOG_RATIO,
    add_off_policy_loss,
    importance_log_ratio,
    k3_kl,
    off_policy_token_loss,
)


def loss_at(ratio, advantage, **kwargs):
    log_ratio = torch.tensor([[math.log(ratio)]])
    return off_policy_token_loss(log_ratio, torch.tensor([advantage]), **kwargs).item()


def test_ratio_uses_the_recorded_log_probs():
    current = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    recorded = torch.tensor([[-1.5, -1.0]])
    log_ratio, clamped = importance_log_ratio(current, recorded)
    assert torch.allclose(log_ratio, torch.tensor([[0.5, -1.0]])) and clamped.item() == 0
    log_ratio.sum().backward()
    assert current.grad.tolist() == [[1.0, 1.0]]


def test_without_importance_correction_the_ratio_is_one_with_the_policy_gradient():
    current = torch.tensor([[-1.0, -3.0]], requires_grad=True)
    log_ratio, _ = importance_log_ratio(current, None)
    assert log_ratio.tolist() == [[0.0, 0.0]]
    loss = off_policy_token_loss(log_ratio, torch.tensor([2.0]))
    assert loss.tolist() == [[-2.0, -2.0]]
    loss.sum().backward()
    assert current.grad.tolist() == [[-2.0, -2.0]]  # d(-A r)/dlogp at r = 1


@pytest.mark.parametrize(
    "ratio, advantage, expected",
    [
        (1.5, 1.0, -1.5),  # inside [0.8, 2.0]: plain -A r
        (3.0, 1.0, -2.0),  # above 1 + off_cliprange_high: clipped at 2
        (0.5, 1.0, -0.5),  # below 1 - epsilon_low with A > 0: the unclipped (larger loss) term wins
        (0.5, -1.0, 0.8),  # A < 0: clipped at 0.8
        (2.5, -1.0, 2.5),  # A < 0 inside the dual-clip bound c = 3
        (5.0, -1.0, 3.0),  # A < 0 beyond c: dual clip caps the loss at -A c
    ],
)
def test_dual_clip(ratio, advantage, expected):
    got = loss_at(ratio, advantage, epsilon_low=0.2, cliprange_high=1.0, clip_ratio_c=3.0)
    assert got == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("ratio, advantage", [(1.0, 2.0), (4.0, 1.0), (0.2, -1.5)])
def test_shaping(ratio, advantage):
    got = loss_at(ratio, advantage, mode="shaping", shaping_beta=0.1)
    assert got == pytest.approx(-advantage * ratio / (ratio + 0.1), rel=1e-6)


def test_shaping_gradient_is_damped_for_likely_tokens():
    # d/dlogp [w / (w + b)] = b w / (w + b)^2: small for w >> b, so confident replayed tokens barely move.
    for ratio in (0.05, 1.0, 10.0):
        logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
        off_policy_token_loss(logp, torch.tensor([-1.0]), mode="shaping", shaping_beta=0.1).sum().backward()
        assert logp.grad.item() == pytest.approx(0.1 * ratio / (ratio + 0.1) ** 2, rel=1e-5)


def test_extreme_log_ratios_are_clamped_and_counted():
    current = torch.tensor([[-1.0, -1.0, -1.0]])
    recorded = torch.tensor([[-100.0, float("-inf"), -1.0]])
    log_ratio, clamped = importance_log_ratio(current, recorded)
    assert clamped.item() == 2
    assert log_ratio.tolist() == [[MAX_LOG_RATIO, MAX_LOG_RATIO, 0.0]]
    assert torch.isfinite(off_policy_token_loss(log_ratio, torch.tensor([1.0]))).all()


def test_k3_kl_against_hand_computed_values():
    # policy 0.5 vs reference 0.25: exp(ln 0.5) - ln 0.5 - 1 = 0.5 + 0.693147 - 1; the other way round:
    # exp(ln 2) - ln 2 - 1 = 2 - 0.693147 - 1; equal log-probs: 0
    logps = torch.log(torch.tensor([[0.5, 0.25, 0.3]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.3]]))
    expected = torch.tensor([[0.5 + math.log(2) - 1, 2 - math.log(2) - 1, 0.0]])
    torch.testing.assert_close(k3_kl(logps, ref), expected, atol=1e-6, rtol=0)


def test_k3_kl_gradient_is_zero_where_policy_and_reference_agree():
    logps = torch.log(torch.tensor([0.2, 0.6])).requires_grad_()
    k3_kl(logps, torch.log(torch.tensor([0.2, 0.3]))).sum().backward()
    # d/dlogp = 1 - exp(ref - logp): 0 at agreement, 1 - 0.5 where the reference is half as likely
    torch.testing.assert_close(logps.grad, torch.tensor([0.0, 0.5]))


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="off_policy_loss"):
        off_policy_token_loss(torch.zeros(1, 1), torch.ones(1), mode="ppo")


# Two rows: row 0 on-policy (3 tokens), row 1 off-policy (2 tokens); per-token losses by hand.
ON = torch.tensor([[1.0, 2.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
OFF = torch.tensor([[0.0, 0.0, 0.0, 0.0], [4.0, 8.0, 0.0, 0.0]])
ON_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
OFF_MASK = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


def parent_on_loss(loss_type, accumulation=2.0):
    """What GRPOTrainer returns for the on-policy tokens alone (rows of the off-policy part masked out)."""
    if loss_type == "grpo":
        return ((ON * ON_MASK).sum(-1) / ON_MASK.sum(-1).clamp(min=1)).mean() / accumulation
    if loss_type == "bnpo":
        return (ON * ON_MASK).sum() / ON_MASK.sum() / accumulation
    if loss_type == "dr_grpo":
        return (ON * ON_MASK).sum() / (2 * 4) / accumulation
    if loss_type == "dapo":
        return (ON * ON_MASK).sum() / (10 / 1 * accumulation / 1)
    return (ON * ON_MASK).sum(-1).mean() / accumulation  # luspo


@pytest.mark.parametrize(
    "loss_type, expected",
    [
        ("grpo", (2.0 + 6.0) / 2 / 2),  # mean of row means (2 and 6), / accumulation
        ("bnpo", (6.0 + 12.0) / 5 / 2),  # one token mean over all 5 tokens
        ("dr_grpo", 18.0 / (2 * 4) / 2),  # B * max_completion_length
        ("dapo", 18.0 / (10 * 2)),  # num_items_in_batch 10, one process, accumulation 2, one step per generation
        ("luspo", (6.0 + 12.0) / 2 / 2),  # mean of row sums
    ],
)
def test_combination_equals_one_aggregation_over_all_tokens(loss_type, expected):
    combined = add_off_policy_loss(
        parent_on_loss(loss_type),
        OFF,
        ON_MASK,
        OFF_MASK,
        loss_type,
        accumulation_steps=2.0,
        max_completion_length=4,
        num_items_in_batch=torch.tensor(10.0),
    )
    assert combined.item() == pytest.approx(expected, rel=1e-6)


def test_eval_combination_is_not_divided_by_accumulation():
    on = parent_on_loss("grpo", accumulation=1.0)
    combined = add_off_policy_loss(on, OFF, ON_MASK, OFF_MASK, "grpo", accumulation_steps=4.0, training=False)
    assert combined.item() == pytest.approx(4.0)
