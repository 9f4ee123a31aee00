"""TRL's fused log-prob computation on devices without Triton (CPU): only the scored positions, in small tiles.

TRL's fused LM head (`add_fused_lm_head`, used by every `GRPOTrainer` forward that scores tokens) projects the hidden
states onto the vocabulary in tiles of `TOKEN_CHUNK_SIZE` (4096) tokens by 32768 vocabulary columns. With Triton
(CUDA, XPU) only the positions that carry a label (the completions) are scored and a kernel folds each tile in place.
Without it, two things cost CPU users:

- every position of every row is scored, prompts and padding included (TRL keeps the tile shapes fixed for graph
  compilers such as Neuron's). In RLCR's confidence turn or a tool episode the prompt is most of the row, so most of
  the LM head's work, forward and backward, is thrown away;
- the torch fallback of the backward holds about eight float32 copies of a tile at once: about 4 GB, whatever the
  model's size. Measured on the Absolute Zero code family's CPU run (SmolLM2-135M): a peak of 15.6 GB resident, in
  `chunked_logprob._backward_tile` during the loss backward.

`cpu_logprob_tiles` scores only the labelled positions on CPU (TRL's own Triton-path selection, `labels != -100`) in
tiles of at most `cpu_logprob_tile_tokens` tokens: the same values from fewer and smaller matrix products.
`CPULogprobTiles` applies it to each training step and evaluation, and restores TRL's settings after.
"""

from __future__ import annotations

from contextlib import contextmanager

import trl.kernels.chunked_logprob as chunked_logprob
import trl.trainer.utils as trl_utils


@contextmanager
def cpu_logprob_tiles(tile_tokens: int | None, device, compact: bool = True):
    """Within the block, on CPU: TRL's fused LM head scores only the labelled positions (with `compact`), in tiles of
    at most `tile_tokens` tokens (`None`: TRL's size). Unchanged on other devices."""
    if device.type != "cpu":
        yield
        return
    saved_tile, saved_selector = chunked_logprob.TOKEN_CHUNK_SIZE, trl_utils._use_triton
    if tile_tokens is not None:
        chunked_logprob.TOKEN_CHUNK_SIZE = min(saved_tile, tile_tokens)
    if compact:
        # TRL's fused forward selects the labelled positions where this says True; it is read nowhere else in
        # `trl.trainer.utils` (the kernel module keeps its own binding, so the torch fallback still runs on CPU).
        trl_utils._use_triton = lambda target: target.type == "cpu" or saved_selector(target)
    try:
        yield
    finally:
        chunked_logprob.TOKEN_CHUNK_SIZE, trl_utils._use_triton = saved_tile, saved_selector


class CPULogprobTiles:
    """Mixin for a `GRPOTrainer` subclass (listed before it): each training step (old/reference log-probs, the loss
    forward and its backward) and each evaluation scores only the labelled positions on CPU, in
    `args.cpu_logprob_tile_tokens`-token tiles (not under `torch_compile`, whose graphs want fixed shapes)."""

    def _cpu_logprob_tiles(self):
        return cpu_logprob_tiles(
            self.args.cpu_logprob_tile_tokens, self.accelerator.device, compact=not self.args.torch_compile
        )

    def training_step(self, *args, **kwargs):
        with self._cpu_logprob_tiles():
            return super().training_step(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        with self._cpu_logprob_tiles():
            return super().evaluate(*args, **kwargs)
