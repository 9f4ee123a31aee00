"""Which parameters a training run changed."""

from __future__ import annotations

import torch


def snapshot_parameters(model) -> dict[str, torch.Tensor]:
    """A detached copy of every named parameter, to compare against after training."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def changed_parameters(before: dict[str, torch.Tensor], model) -> set[str]:
    """Names of the parameters of `model` that differ from `before` (a [`snapshot_parameters`])."""
    return {name for name, p in model.named_parameters() if not torch.equal(before[name], p.detach())}
