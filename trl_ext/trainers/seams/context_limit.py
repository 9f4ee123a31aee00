"""Prompts longer than vLLM's context (docs/design.md#per-turn-generation-settings).

vLLM rejects a request whose prompt plus `max_tokens` exceeds its context (`--max-model-len`, or
`vllm_max_model_length` in colocate mode); in server mode one such prompt fails the whole batch. The prompts of a
trainer's second turn embed model output (RLCR's confidence prompt holds the answer; a tool round holds the episode so
far), so their length is not a configuration the user controls.

`VLLMContextLimit` checks every generation call before it reaches vLLM. A row that does not fit is sent as a one-token
stand-in (row counts stay the same on every process, as the server-mode collectives need) and comes back as a
completion of one end-of-sequence token: RLCR's Brier reward scores it 0, and its `G_c` siblings, which share the
prompt, all do, so its advantage is 0. `generation/prompts_over_context` counts such rows per generation call (under
the turn's prefix: `confidence/...`). When even a one-token prompt cannot fit the turn's length, the
configuration is wrong, and the call raises, naming the settings.
"""

from __future__ import annotations

import math

import torch
from accelerate.utils import broadcast_object_list


class VLLMContextLimit:
    """Mixin for a `GRPOTrainer` subclass (listed before it, after the other `_generate_single_turn` wrappers but
    `GenerationBackends`): fit each vLLM request into the context."""

    _vllm_context = ()  # unresolved; then the context length in tokens, or None (no limit known)

    def _vllm_context_length(self) -> int | None:
        """vLLM's context: the server's `max_model_len` (server mode), else `vllm_max_model_length` or the engine's."""
        if self._vllm_context == ():
            length = self.args.vllm_max_model_length
            if self.vllm_mode == "server":
                info = [None]
                if self.accelerator.is_main_process:
                    info = [self.vllm_generation.vllm_client.get_server_info()["model_config"].get("max_model_len")]
                broadcast_object_list(info, from_process=0)
                length = info[0]
            elif length is None and getattr(self.vllm_generation, "llm", None) is not None:
                length = self.vllm_generation.llm.llm_engine.model_config.max_model_len
            self._vllm_context = length
        return self._vllm_context

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        context = self._vllm_context_length() if self.use_vllm else None
        if context is None:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        # the turn's length (the configs refuse `max_tokens` in generation kwargs)
        max_tokens = self.vllm_generation.max_completion_length
        if max_tokens + 1 > context:
            raise ValueError(
                f"This turn generates up to {max_tokens} tokens, which leaves no room for a prompt in vLLM's context "
                f"of {context} tokens (vllm_max_model_length, or the server's --max-model-len): lower the turn's "
                "length setting (max_completion_length, max_confidence_length or max_question_length) or raise the "
                "context."
            )
        over = [len(ids) + max_tokens > context for ids in prompt_ids]
        stand_in = [self._tokenizer.eos_token_id]
        sent = [stand_in if too_long else ids for ids, too_long in zip(prompt_ids, over, strict=True)]
        completion_ids, logprobs = super()._generate_single_turn(
            sent, images, multimodal_fields, num_generations, has_tool_images
        )
        # TRL's batch code needs a token per completion: an end-of-sequence token alone, with a NaN log-prob (TRL
        # gives such tokens no sampler correction and leaves them out of its metrics).
        completion_ids = [stand_in if too_long else ids for ids, too_long in zip(completion_ids, over, strict=True)]
        if logprobs is not None:
            logprobs = [[math.nan] if too_long else lps for lps, too_long in zip(logprobs, over, strict=True)]
        count = self.accelerator.gather(torch.tensor([sum(over)], device=self.accelerator.device)).sum().item()
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["generation/prompts_over_context"].append(float(count))
        return completion_ids, logprobs
