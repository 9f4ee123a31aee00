"""Seams of TRL's generation backends that multi-call trainers need (docs/gpu.md).

Colocated vLLM in sleep mode. TRL pushes the training weights to vLLM when `state.global_step` moved since the last
push (`_last_loaded_step`). With `vllm_enable_sleep_mode=True` its `VLLMGeneration.generate` also puts the engine to
sleep at level 2 after every call, which discards the weights, so the next call pushes them again: under ZeRO-3 or
FSDP each push gathers every parameter. Our trainers make several generate calls per step (RLCR's answer and
confidence turns, Absolute Zero's proposer and solver rounds, the held-out evaluation's chunks and turns), hence
several pushes of the same weights. `GenerationBackends` keeps the engine awake from the first generate call of a
batch to the end of `_prepare_inputs` (the batch is built: every turn generated and scored), then puts it to sleep
before the loss and the optimizer step. A held-out evaluation leaves the engine awake, so the next training batch at
the same step generates with the weights the evaluation pushed. Every decision depends only on the step and on calls
that every process makes, so the pushes (collectives under ZeRO-3/FSDP) stay in step across processes.

FSDP2 without vLLM. With `reshard_after_forward` (accelerate_configs/fsdp2.yaml) every forward all-gathers each
decoder layer and frees it again, so `model.generate` all-gathers every layer once per decoded token. TRL gathers
ZeRO-3 parameters once per generate call (`ds3_gather_for_generation`) but has no counterpart for FSDP2; the first
generate call warns and names accelerate_configs/fsdp2_generation.yaml (`fsdp_reshard_after_forward: false`).

Transformers generation, shared prefill (`shared_prefill`). TRL calls `generate` on the unwrapped model; for the
duration of TRL's `_generate_single_turn` that model's `generate` prefills the prompt positions the call's rows share
once (`trl_ext/models/shared_prefill.py`). It adds up to two forwards per call, as many as the batch calls for, so
it stays off where a forward is a collective that every process must make alike (FSDP, ZeRO-3 without gathering).
"""

from __future__ import annotations

import functools

from transformers.utils import logging
from trl.extras.profiling import profiling_context

from ...models.shared_prefill import shared_prefill_generate
from .scoping import scoped_call


logger = logging.get_logger(__name__)


class GenerationBackends:
    """Mixin for a `GRPOTrainer` subclass (listed just before it): with colocated vLLM in sleep mode, the engine stays
    awake across the generate calls of one batch or evaluation, so the weights are pushed once per optimizer step;
    with FSDP2 resharding after forward and transformers generation, a warning."""

    _vllm_awake = False  # the colocated engine holds the weights of `_last_loaded_step` and its KV cache

    def _sleeps_between_calls(self) -> bool:
        return self.use_vllm and self.vllm_mode == "colocate" and self.args.vllm_enable_sleep_mode

    def _shares_prefill(self) -> bool:
        """Transformers generation with `shared_prefill`, where the model's forward is no collective."""
        args = self.args
        if self.use_vllm or args.use_transformers_paged or not args.shared_prefill or self.is_fsdp_enabled:
            return False
        zero3 = self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3
        return not zero3 or args.ds3_gather_for_generation

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self._sleeps_between_calls():
            fsdp2 = self.is_fsdp_enabled and self.accelerator.is_fsdp2
            if fsdp2 and not self.use_vllm and self.accelerator.state.fsdp_plugin.reshard_after_forward:
                logger.warning_once(
                    "FSDP2 with reshard_after_forward all-gathers every layer for each decoded token when generating "
                    "without vLLM. For generation-heavy runs launch with accelerate_configs/fsdp2_generation.yaml "
                    "(fsdp_reshard_after_forward: false: one all-gather per layer per step), or use vLLM (docs/gpu.md)."
                )
            # train() wraps the model's forward in accelerate's mixed-precision autocast: generating under it here
            # too measures an evaluation made before train() (the "before" of a report) as the ones made after.
            with self.accelerator.autocast():
                if not self._shares_prefill():
                    return super()._generate_single_turn(
                        prompt_ids, images, multimodal_fields, num_generations, has_tool_images
                    )
                model = self.accelerator.unwrap_model(self.model_wrapped)
                with scoped_call(model, generate=functools.partial(shared_prefill_generate, model, model.generate)):
                    return super()._generate_single_turn(
                        prompt_ids, images, multimodal_fields, num_generations, has_tool_images
                    )
        vllm = self.vllm_generation
        if not self._vllm_awake:
            # Asleep at level 2, the engine holds no weights: push them (sync_weights wakes the weights first), then
            # wake the KV cache, as TRL's own first call of a step does.
            with profiling_context(self, "sync_weights"):
                vllm.sync_weights()
            self._last_loaded_step = self.state.global_step
            vllm.llm.wake_up(tags=["kv_cache"])
            self._vllm_awake = True
        # TRL's call skips its re-push, wake-up and sleep when sleep mode is off: the engine stays awake
        with scoped_call(vllm, enable_sleep_mode=False):
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        # A training batch is built: free the engine's memory for the loss and the optimizer step. TRL's evaluation
        # loop (`prediction_step`, model in eval mode) builds batches too; it has no backward, so the engine stays
        # awake and its next batches reuse the weights pushed at this step.
        if self._vllm_awake and self.model.training:
            self.vllm_generation.llm.sleep(level=2)
            self.vllm_generation._llm_weights_sleeping = True  # TRL's own flag: a later TRL call re-pushes
            self._vllm_awake = False
        return inputs
