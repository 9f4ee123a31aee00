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

TRL's fused head divides the logits by the one temperature it was given at init (`args.temperature`).
`FusedHeadTemperatures` scores the rows of a turn sampled at another temperature at that one (RLCR's confidence
turn, Absolute Zero's proposer), so their log-probs are those of the distribution they were sampled from.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

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


class FusedHeadTemperatures:
    """The fused LM heads TRL added to `modules` (`(module, outputs)` pairs, as TRL patched them: the policy with
    `("log_probs", "entropy")`, a reference model with `("log_probs",)`), at any temperature.

    `at(t)` scopes every module's forward to a fused head dividing by `t`: TRL's own `add_fused_lm_head`, applied on
    top of TRL's (its unfused path, which generation takes, falls through to it), built once per temperature. At
    `base` (the temperature TRL patched them with) TRL's heads are used as they are.
    """

    def __init__(self, modules: list[tuple[object, tuple[str, ...]]], base: float, cast_lm_head_to_fp32: bool):
        self.base, self.cast_lm_head_to_fp32 = float(base), cast_lm_head_to_fp32
        self._heads = []  # (module, outputs, {temperature: forward})
        for module, outputs in modules:
            if "forward" not in vars(module):
                raise RuntimeError(f"{type(module).__name__} has no fused LM head: TRL patches it at init.")
            self._heads.append((module, outputs, {self.base: vars(module)["forward"]}))

    def at(self, temperature: float | None):
        """Within the block, the fused heads divide the logits by `temperature` (`None`: the base one)."""
        if temperature is None or float(temperature) == self.base:
            return nullcontext()
        return self._scoped(float(temperature))

    @contextmanager
    def _scoped(self, temperature: float):
        saved = [(module, vars(module)["forward"]) for module, _, _ in self._heads]
        for module, outputs, forwards in self._heads:
            if temperature not in forwards:
                module.forward = forwards[self.base]
                trl_utils.add_fused_lm_head(
                    module, temperature=temperature, cast_lm_head_to_fp32=self.cast_lm_head_to_fp32, outputs=outputs
                )
                forwards[temperature] = vars(module)["forward"]
            module.forward = forwards[temperature]
        try:
            yield
        finally:
            for module, forward in saved:
                module.forward = forward
