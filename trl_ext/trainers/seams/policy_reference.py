"""The policy as its own reference on chosen entries of a micro-batch: a KL term of exactly 0 there, with a zero
gradient, and TRL's loss unchanged elsewhere.

TRL's k3 KL is `exp(ref - logp) - (ref - logp) - 1`, which is 0 where `ref == logp`. The loss's own forward computes
`logp`, so the reference can only be completed during it: `in_loss` gives the loss a copy of the reference log-probs,
and `fill`, called with the loss forward's log-probs, writes them (detached) at the chosen entries.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class PolicyReference:
    """Fills a micro-batch's reference log-probs from the loss forward at a mask: rows `(B,)` or tokens `(B, T)`."""

    def __init__(self):
        self._fill: tuple[torch.Tensor, torch.Tensor] | None = None  # (reference (B, T), mask) inside `in_loss`

    @contextmanager
    def in_loss(self, inputs: dict, mask: torch.Tensor | None):
        """For the block, `inputs` with a copy of the reference log-probs that `fill` completes at `mask` (`None`:
        nothing to fill). A copy: the micro-batch is reused by later iterations (`num_iterations > 1`), each filling
        its own."""
        if mask is None:
            yield inputs
            return
        reference = inputs["ref_per_token_logps"].clone()
        self._fill = (reference, mask)
        try:
            yield {**inputs, "ref_per_token_logps": reference}
        finally:
            self._fill = None

    def fill(self, logps: torch.Tensor) -> None:
        """Inside `in_loss`: put the loss forward's log-probs `(B, T)` (detached) at the mask it named."""
        if self._fill is not None:
            reference, mask = self._fill
            mask = mask.to(reference.device)
            reference[mask] = logps.detach()[mask].to(reference.dtype)
