"""Advantage normalisation over groups of rows, the pieces TRL's own scaling does not expose as functions.

RLCR standardises confidence advantages over a prompt's rows (`answer_then_prompt`); Absolute Zero normalises
proposer rewards within a prompt's proposals or against a batch-level baseline.
"""

from __future__ import annotations

import torch


SCALES = ("group", "batch", "none")
_EPS = 1e-4  # as TRL's advantage scaling


def _scaled(centered: torch.Tensor, std: torch.Tensor, scale: str) -> torch.Tensor:
    if scale == "none":
        return centered
    out = centered / (std + _EPS)
    return torch.where(std > 0, out, torch.zeros_like(out))  # a constant set of rewards carries no contrast


def batch_baseline_advantages(rewards: torch.Tensor, scale: str = "group") -> torch.Tensor:
    """`proposer_rows="selected"`: one row per prompt, so the baseline is the batch mean of the proposer rewards
    (TRR++-style, per role); divided by the batch std unless `scale == "none"`."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES} (got {scale!r}).")
    if rewards.numel() < 2:
        return torch.zeros_like(rewards)
    return _scaled(rewards - rewards.mean(), rewards.std(), scale)


def _unbiased_std(centered: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased std of the non-NaN entries of already-centred values; 0 with fewer than two."""
    valid = ~torch.isnan(centered)
    count = valid.sum() if dim is None else valid.sum(dim=dim, keepdim=True)
    squares = torch.where(valid, centered, torch.zeros_like(centered)).square()
    total = squares.sum() if dim is None else squares.sum(dim=dim, keepdim=True)
    return torch.where(count > 1, total / (count - 1).clamp(min=1), torch.zeros_like(total)).sqrt()


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """Standardise within consecutive groups of `group_size` (GRPO): `(x - group mean) / (std + eps)`, with the
    unbiased std of the group (`"group"`) or of the whole batch (`"batch"`), or the mean only (`"none"`). A constant
    group gets 0, not NaN. NaN rewards (not applicable, as TRL's `None`) stay out of the means and stds and get 0.
    RLCR's `answer_then_prompt` level and Absolute Zero's `proposer_rows="all"` use it."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES} (got {scale!r}).")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}.")
    grouped = rewards.view(-1, group_size)
    centered = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    if scale == "batch":
        std = _unbiased_std(rewards - torch.nanmean(rewards))
    else:
        std = _unbiased_std(centered, dim=1)
    scaled = _scaled(centered, std.expand_as(grouped), scale)
    return torch.nan_to_num(scaled, nan=0.0).reshape(rewards.shape)
