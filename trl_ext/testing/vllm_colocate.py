"""vLLM colocate mode without vLLM: a stand-in for `vllm.LLM` under TRL's real `VLLMGeneration`.

`vllm_colocate_mode(model, tokenizer)` lets a trainer with `use_vllm=True, vllm_mode="colocate"` build TRL's own
`VLLMGeneration`, whose `LLM(...)` is then a `ColocatedLLM`: it samples from a copy of `model` (the
`LoopbackVLLMServer` sampler, so `script=` works as there, its sample index being the prompt's index among the
call's copies of it), takes the weights TRL pushes through
`llm_engine.model_executor.driver_worker.model_runner.model.load_weights`, and keeps vLLM's sleep-mode contract
strictly: `sleep(level=2)` discards the weights (they become NaN), loading weights or generating while asleep raises,
and generating after a discard raises until every parameter was pushed again. It counts the pushes (TRL ends each
with `reset_prefix_cache`) and records every call in order, so tests can assert how often the weights travel.
"""

from __future__ import annotations

import copy
import os
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from unittest import mock

import torch

from .vllm_server import LoopbackVLLMServer


class _Params(dict):
    """Stands in for `vllm.SamplingParams` / `StructuredOutputsParams`: the keyword arguments, as a dict."""

    def __init__(self, **kwargs):
        super().__init__(kwargs)


class ColocatedLLM:
    """A colocated engine: generation from a copy of the model, pushes counted, sleep mode enforced.

    Attributes:
        engine_args: the keyword arguments TRL built the engine with (`max_num_seqs`, `enable_sleep_mode`, ...).
        pushes: completed weight pushes (every parameter loaded, then the prefix cache reset).
        events: `"push"`, `("generate", rows)`, `("sleep", level)` and `("wake_up", tags)`, in order.
        generations: per `generate` call, the number of prompts and the sampling parameters.
    """

    def __init__(self, sampler: LoopbackVLLMServer, **engine_args):
        self.sampler = sampler
        self.engine_args = engine_args
        self.pushes = 0
        self.events: list = []
        self.generations: list[tuple[int, dict]] = []
        self._params = dict(sampler.model.named_parameters())
        self._loaded: set[str] = set()
        self._asleep: set[str] = set()
        self._weights_valid = True
        max_model_len = engine_args.get("max_model_len") or sampler.max_model_len
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._load_weights))
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=max_model_len),
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner)),
        )

    @property
    def model(self):
        """The engine's copy of the model (the weights last pushed)."""
        return self.sampler.model

    def sleep(self, level: int = 1) -> None:
        if not self.engine_args.get("enable_sleep_mode"):
            raise RuntimeError("sleep() needs enable_sleep_mode=True")
        if self._asleep:
            raise RuntimeError("sleep() while asleep")
        self.events.append(("sleep", level))
        self._asleep = {"weights", "kv_cache"}
        if level == 2:  # the weights are discarded
            with torch.no_grad():
                for param in self._params.values():
                    param.fill_(float("nan"))
            self._weights_valid = False

    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = ["weights", "kv_cache"] if tags is None else tags
        for tag in tags:
            if tag not in self._asleep:
                raise RuntimeError(f"wake_up({tag!r}) while awake")
            self._asleep.discard(tag)
        self.events.append(("wake_up", tuple(tags)))

    def _load_weights(self, weights) -> None:
        if "weights" in self._asleep:
            raise RuntimeError("load_weights while the weights sleep (their memory is unmapped)")
        with torch.no_grad():
            for name, tensor in weights:
                self._params[name].copy_(tensor.to(self._params[name].dtype))
                self._loaded.add(name)

    def reset_prefix_cache(self) -> None:
        """TRL's last call of a push."""
        if self._loaded != set(self._params):
            raise RuntimeError(f"a push loaded {len(self._loaded)} of {len(self._params)} parameters")
        self._loaded = set()
        self._weights_valid = True
        self.pushes += 1
        self.events.append("push")

    def generate(self, prompts, sampling_params, use_tqdm=False):
        if self._asleep:
            raise RuntimeError(f"generate() while {sorted(self._asleep)} sleep")
        if not self._weights_valid:
            raise RuntimeError("generate() with discarded weights: sleep(level=2) needs a push before generating")
        body = dict(sampling_params)
        body.pop("structured_outputs", None)  # recorded, not enforced (as the server)
        self.generations.append((len(prompts), body))
        self.events.append(("generate", len(prompts)))
        outputs, seen = [], {}
        for prompt in prompts:
            prompt_ids = prompt["prompt_token_ids"]
            # TRL sends a group's prompt once per sample (n=1): a script sees its index among the call's copies
            k = seen[tuple(prompt_ids)] = seen.get(tuple(prompt_ids), -1) + 1
            n = int(body.get("n", 1))
            if self.sampler.script is not None:
                drawn = self.sampler._sample(prompt_ids, k + n, body)[k:]
            else:
                drawn = self.sampler._sample(prompt_ids, n, body)
            samples = []
            for completion_ids, logps in drawn:
                logprobs = [{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(completion_ids, logps)]
                samples.append(SimpleNamespace(token_ids=completion_ids, logprobs=logprobs))
            outputs.append(SimpleNamespace(prompt_token_ids=prompt_ids, outputs=samples))
        return outputs


@contextmanager
def vllm_colocate_mode(model, tokenizer, script=None):
    """Patch TRL's `VLLMGeneration` so colocate mode builds a `ColocatedLLM` backed by a copy of `model`.

    Build the trainer inside the context with `use_vllm=True, vllm_mode="colocate"`; the context yields the list of
    engines built (one per trainer). TRL's environment variables for vLLM (`RANK`, `MASTER_PORT`, ...) are restored
    on exit.
    """
    import trl.generation.vllm_generation as vllm_generation

    engines: list[ColocatedLLM] = []
    model = copy.deepcopy(model)  # as it is now: building a trainer with a peft_config adds LoRA layers to it

    def build(**engine_args):
        engines.append(ColocatedLLM(LoopbackVLLMServer(model, tokenizer, script=script), **engine_args))
        return engines[-1]

    with ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ))
        stack.enter_context(mock.patch.object(vllm_generation, "is_vllm_available", lambda *a, **k: True))
        stack.enter_context(mock.patch.object(vllm_generation, "LLM", build, create=True))
        stack.enter_context(mock.patch.object(vllm_generation, "SamplingParams", _Params, create=True))
        stack.enter_context(mock.patch.object(vllm_generation, "StructuredOutputsParams", _Params, create=True))
        yield engines
