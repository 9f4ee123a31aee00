"""Proposer rewards and advantages (SPEC §4 steps 7-8), pure functions over one generation batch.

A question group is the `K` proposals of one seed prompt. Each proposal is invalid (`learnable is None`), or valid
with a learnability verdict and a solve rate (fraction of its solver responses counted as solved).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


MODES = ("learnability", "azr")
SCALES = ("group", "batch", "none")
_EPS = 1e-4  # as TRL's advantage scaling


def proposer_rewards(
    learnable: Sequence[bool | None],
    solve_rates: Sequence[float | None],
    unresolved: bool,
    mode: str,
    invalid_reward: float = -1.0,
    repropose_penalty: float = -0.5,
) -> list[float]:
    """Rewards of one question group's proposals.

    - `"learnability"` (seeds): 1.0 if learnable, 0.0 if not; `repropose_penalty` for every valid proposal of a prompt
      still unresolved after the last repropose attempt.
    - `"azr"` (Absolute Zero): `1 - solve_rate` when `0 < solve_rate < 1`, else 0.
    Invalid proposals get `invalid_reward` in both modes.
    """
    if mode not in MODES:
        raise ValueError(f"proposer_reward_mode must be one of {MODES} (got {mode!r}).")
    rewards = []
    for ok, rate in zip(learnable, solve_rates, strict=True):
        if ok is None:
            rewards.append(float(invalid_reward))
        elif mode == "learnability":
            rewards.append(float(repropose_penalty) if unresolved else float(ok))
        else:
            rewards.append(1.0 - rate if 0.0 < rate < 1.0 else 0.0)
    return rewards


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


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """`proposer_rows="all"`: the K proposals of a prompt are normalised within their group (GRPO); `"batch"` divides
    by the std of the whole batch instead of the group's, `"none"` only subtracts the group mean."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES} (got {scale!r}).")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}.")
    grouped = rewards.view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "batch":
        std = rewards.std() if rewards.numel() > 1 else torch.zeros(())
        std = std.expand_as(grouped)
    else:
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped[:, :1])
        std = std.expand_as(grouped)
    return _scaled(centered, std, scale).reshape(rewards.shape)


def padded_rows(num_rows: int, num_processes: int, multiple: int) -> int:
    """Rows per process when `num_rows` rows are spread over `num_processes` processes, each holding a multiple of
    `multiple` rows (TRL's `split_tensor_dict` drops a remainder); the extra rows are zero-loss padding."""
    per_process = -(-num_rows // num_processes)
    return -(-per_process // multiple) * multiple
