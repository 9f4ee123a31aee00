"""Per-token policy loss of replayed (off-policy) tokens and its combination with GRPOTrainer's loss.
Design: docs/design.md#replaygrpotrainer.

Replayed rows are whole rows: every completion token of a stored trajectory is off-policy. The trainer lets
GRPOTrainer compute the loss of the on-policy tokens (the off-policy rows masked out) and adds the off-policy part
here, normalised so that the sum equals `off * exp_mask + on * (1 - exp_mask)` aggregated over all tokens with the
configured `loss_type`.
"""

from __future__ import annotations

import torch


OFF_POLICY_LOSSES = ("clip", "shaping")
MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: beyond this a ratio carries no information, only overflow risk


def importance_log_ratio(per_token_logps: torch.Tensor, recorded_logps: torch.Tensor | None):
    """`log(pi_current / pi_recorded)` per token, clamped to +-MAX_LOG_RATIO; and how many tokens were clamped.

    `recorded_logps=None` (replay without importance correction, `exp_is_correct=False`) gives log-ratio 0 with the
    gradient of the current log-probs kept.
    """
    if recorded_logps is None:
        return per_token_logps - per_token_logps.detach(), torch.zeros((), dtype=torch.long)
    log_ratio = per_token_logps - recorded_logps
    clamped = (log_ratio.detach().abs() > MAX_LOG_RATIO) | ~torch.isfinite(log_ratio.detach())
    log_ratio = torch.nan_to_num(log_ratio, nan=0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return log_ratio, clamped.sum()


def off_policy_token_loss(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mode: str = "clip",
    epsilon_low: float = 0.2,
    cliprange_high: float = 1.0,
    clip_ratio_c: float = 3.0,
    shaping_beta: float = 0.1,
) -> torch.Tensor:
    """Per-token loss of off-policy tokens.

    `"clip"`: dual-clip PPO, `max(-A r, -A clip(r, 1 - epsilon_low, 1 + cliprange_high))`, and for negative
    advantages at most `-A * clip_ratio_c`. `"shaping"`: `-A * r / (r + shaping_beta)` with `r` unclipped
    (ExGRPO/LUFFY policy shaping). `advantages` is (B,) or broadcastable to `log_ratio`.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    ratio = torch.exp(log_ratio)
    if mode == "clip":
        unclipped = -advantages * ratio
        clipped = -advantages * torch.clamp(ratio, 1 - epsilon_low, 1 + cliprange_high)
        loss = torch.maximum(unclipped, clipped)
        dual = torch.minimum(loss, -advantages * clip_ratio_c)
        return torch.where(advantages < 0, dual, loss)
    if mode == "shaping":
        return -advantages * ratio / (ratio + shaping_beta)
    raise ValueError(f"off_policy_loss must be one of {OFF_POLICY_LOSSES} (got {mode!r}).")


def k3_kl(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate of the policy from the reference, `exp(ref - logp) - (ref - logp) - 1` (Schulman's k3,
    the one GRPOTrainer's loss adds with `beta`): non-negative, 0 where the two log-probs agree. Written as TRL
    writes it, so its value and gradient match TRL's to the bit."""
    return torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1


def add_off_policy_loss(
    on_loss: torch.Tensor,
    off_token_loss: torch.Tensor,
    on_mask: torch.Tensor,
    off_mask: torch.Tensor,
    loss_type: str,
    *,
    accumulation_steps: float = 1.0,
    max_completion_length: int | None = None,
    num_items_in_batch: torch.Tensor | float | None = None,
    num_processes: int = 1,
    steps_per_generation: int = 1,
    training: bool = True,
) -> torch.Tensor:
    """GRPOTrainer's loss of the on-policy tokens plus the off-policy tokens' share, as one aggregation.

    `on_loss` is what `GRPOTrainer._compute_loss` returned with the off-policy rows masked out (already divided by
    `accumulation_steps`, 1 in eval); masks are (B, T) and disjoint. Each branch mirrors the parent's normaliser of
    that loss type, so that the result equals the parent's aggregation of the combined per-token loss.
    """
    accumulation_steps = accumulation_steps if training else 1.0
    off_sum = (off_token_loss * off_mask).sum()
    if loss_type in ("grpo", "sapo"):  # mean over rows of each row's token mean
        rows = off_mask.size(0)
        per_row = (off_token_loss * off_mask).sum(-1) / off_mask.sum(-1).clamp(min=1.0)
        return on_loss + per_row.sum() / rows / accumulation_steps
    if loss_type == "bnpo":  # one token mean over the micro-batch: reweight the on-policy mean
        on_count, off_count = on_mask.sum(), off_mask.sum()
        total = (on_count + off_count).clamp(min=1.0)
        return on_loss * on_count.clamp(min=1.0) / total + off_sum / total / accumulation_steps
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length.")
        return on_loss + off_sum / (off_mask.size(0) * max_completion_length) / accumulation_steps
    if loss_type in ("cispo", "dapo", "vespo"):
        if num_items_in_batch is None:
            raise ValueError(f"{loss_type} needs num_items_in_batch.")
        normalizer = torch.as_tensor(num_items_in_batch, dtype=off_sum.dtype).clamp(min=1.0) / num_processes
        if training:
            normalizer = normalizer * accumulation_steps / steps_per_generation
        return on_loss + off_sum / normalizer
    if loss_type == "luspo":
        return on_loss + (off_token_loss * off_mask).sum(-1).mean() / accumulation_steps
    raise ValueError(f"Unknown loss_type {loss_type!r}.")
