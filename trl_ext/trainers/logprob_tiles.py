"""The size of TRL's log-prob tiles on devices without Triton (CPU), where TRL's default costs gigabytes.

TRL's fused LM head (`trl.kernels.chunked_logprob`, used by every `GRPOTrainer` forward that scores tokens) projects
the hidden states onto the vocabulary in tiles of `TOKEN_CHUNK_SIZE` (4096) tokens by 32768 vocabulary columns. With
Triton (CUDA, XPU) only the completion positions are scored and a kernel folds each tile in place. Without it, every
position of every row is scored (prompts included: TRL keeps the tile shapes fixed for compilers) and the torch
fallback of the backward holds about eight float32 copies of a tile at once: about 4 GB, whatever the model's size.
Measured on the Absolute Zero code family's CPU run (SmolLM2-135M): a peak of 15.6 GB resident, in
`chunked_logprob._backward_tile` during the loss backward. Fewer tokens per tile compute the same values in more,
smaller matrix products; `CPULogprobTiles` sets the tile for each training step and evaluation, and restores TRL's value.
"""

from __future__ import annotations

from contextlib import contextmanager

import trl.kernels.chunked_logprob as chunked_logprob


@contextmanager
def logprob_tile_tokens(tokens: int | None, device):
    """Within the block, TRL's log-prob tiles hold at most `tokens` tokens on a device without Triton (unchanged on
    CUDA/XPU, or with `tokens` None)."""
    if tokens is None or chunked_logprob._use_triton(device):
        yield
        return
    saved = chunked_logprob.TOKEN_CHUNK_SIZE
    chunked_logprob.TOKEN_CHUNK_SIZE = min(saved, tokens)
    try:
        yield
    finally:
        chunked_logprob.TOKEN_CHUNK_SIZE = saved


class CPULogprobTiles:
    """Mixin for a `GRPOTrainer` subclass (listed before it): each training step (old/reference log-probs, the loss
    forward and its backward) and each evaluation runs with `args.cpu_logprob_tile_tokens`-token tiles."""

    def training_step(self, *args, **kwargs):
        with logprob_tile_tokens(self.args.cpu_logprob_tile_tokens, self.accelerator.device):
            return super().training_step(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        with logprob_tile_tokens(self.args.cpu_logprob_tile_tokens, self.accelerator.device):
            return super().evaluate(*args, **kwargs)
