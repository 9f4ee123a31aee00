"""Advantage post-processing for rows whose groups nest (RLCR: confidence samples within answers within prompts)."""

from __future__ import annotations

import torch


def prompt_level_normalize(values: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """Standardise `values` within consecutive groups of `group_size`: `(x - mean) / (std + eps)`.

    Used as the second level of RLCR's `answer_then_prompt` confidence normalisation: the `G_a * G_c` first-level
    (within-answer) advantages of one prompt are put on a common scale, so prompts with small Brier spreads weigh as
    much as prompts with large ones. The std is the unbiased one, as in TRL's group scaling; a constant group gets 0.
    """
    if values.numel() % group_size != 0:
        raise ValueError(f"{values.numel()} values do not split into groups of {group_size}.")
    if group_size < 2:
        return torch.zeros_like(values)
    grouped = values.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    out = (grouped - mean) / (std + eps)
    out = torch.where(std > 0, out, torch.zeros_like(out))
    return out.reshape(values.shape)
