"""Runs under torchrun: one training step of each trainer with the model's own `model.generate` (greedy, not
scripted) under each backend; reports the logged figures and, per generation call, this rank's completions and the all-gathers it made.

Usage: sharded_generation.py CONFIG [CONFIG ...], each CONFIG `TRAINER:BACKEND`.
- TRAINER: rlcr (answer and confidence turns), replay, absolute_zero (proposer and solver rounds).
- BACKEND: plain (one process, or DDP), zero3 (DeepSpeed ZeRO-3, `ds3_gather_for_generation`: the parameters
  gathered once per generate call), fsdp2 (FSDP2 as accelerate_configs/fsdp2.yaml: `reshard_after_forward`), fsdp2_kept
  (as accelerate_configs/fsdp2_generation.yaml: `reshard_after_forward=False`).

The checkpoint is the tiny model with a large `initializer_range` (its greedy continuations depend on the prompt)
and three extra end-of-sequence ids that its greedy continuations reach after different numbers of tokens: with two
processes one rank's completions stop while the other's go on decoding, the case where a per-token collective would
hang without `synced_gpus`. Every configuration has the same global batch whatever the number of processes, and
greedy decoding gives the same completions, so one process and two must log the same figures.
"""

import os
import sys
import tempfile
from contextlib import ExitStack
from unittest import mock

import torch
from datasets import Dataset
from deepspeed_cpu import without_shm_all_reduce
from sharded_steps import backend_args
from torch.distributed.fsdp import FSDPModule
from transformers import GenerationConfig

from trl_ext.testing import cpu_test_args, gloo_sharded_training, tiny_checkpoint, tiny_tokenizer, write_rank_result
from trl_ext.trainers import (
    AbsoluteZeroConfig,
    AbsoluteZeroTrainer,
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)
from trl_ext.trainers.seams import generation_backends


WORLD = int(os.environ.get("WORLD_SIZE", "1"))
GREEDY = {"do_sample": False}
STOPS = [42399, 22399, 49019]  # tokens of the greedy continuations (at positions 3 to 10 of the prompts below)
LOGGED = (
    "loss",
    "grad_norm",
    "entropy",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "confidence/completions/mean_length",
    "proposer/completions/mean_length",
)


def parity(prompts, completions, completion_ids, **kwargs):
    return [float(ids[-1] % 2) if ids else 0.0 for ids in completion_ids]


def rlcr_trainer(output_dir, path, **backend):
    questions = [("1+2", "3"), ("4+4", "8")]
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {q}?"}], "solution": s} for q, s in questions]
    )
    args = cpu_test_args(
        output_dir,
        RLCRMultiTurnConfig,
        per_device_train_batch_size=4 // WORLD,
        num_generations=2,
        num_generations_confidence=2,
        max_completion_length=10,
        max_confidence_length=6,
        generation_kwargs=GREEDY,
        confidence_generation_kwargs=GREEDY,
        **backend,
    )
    return RLCRMultiTurnTrainer(model=path, args=args, train_dataset=data, processing_class=tiny_tokenizer())


def replay_trainer(output_dir, path, **backend):
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Say {i}"}], "task_id": f"t{i}"} for i in range(2)]
    )
    args = cpu_test_args(
        output_dir,
        ReplayGRPOConfig,
        per_device_train_batch_size=4 // WORLD,
        num_generations=2,
        max_completion_length=10,
        generation_kwargs=GREEDY,
        **backend,
    )
    return ReplayGRPOTrainer(
        model=path, reward_funcs=parity, args=args, train_dataset=data, processing_class=tiny_tokenizer()
    )


def absolute_zero_trainer(output_dir, path, **backend):
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Seed {c}"}]} for c in "AB"])
    args = cpu_test_args(
        output_dir,
        AbsoluteZeroConfig,
        per_device_train_batch_size=4 // WORLD,
        num_generations=2,
        num_questions_per_prompt=2,
        max_repropose_attempts=0,
        max_completion_length=8,
        max_question_length=10,
        generation_kwargs=GREEDY,
        proposer_generation_kwargs=GREEDY,
        **backend,
    )
    return AbsoluteZeroTrainer(
        path,
        [parity],
        args=args,
        train_dataset=data,
        processing_class=tiny_tokenizer(),
        parse_question=lambda text: {"question": f"Repeat: {text[:12]}"},
    )


def generation_backend(backend):
    if backend == "fsdp2_kept":
        args = backend_args("fsdp2")
        args["fsdp_config"] = {**args["fsdp_config"], "reshard_after_forward": False}
        return args
    return backend_args(backend)


class AllGathers:
    """Counts the all-gather collectives (FSDP2's `all_gather_single`, DeepSpeed's `all_gather_into_tensor`)."""

    def __init__(self):
        self.count = 0

    def patches(self):
        def counted(original):
            def call(*args, **kwargs):
                self.count += 1
                return original(*args, **kwargs)

            return call

        return [
            mock.patch.object(torch.distributed, name, counted(getattr(torch.distributed, name)))
            for name in ("all_gather_single", "all_gather_into_tensor")
        ]


def run(config, path):
    name, backend = config.split(":")
    build = {"rlcr": rlcr_trainer, "replay": replay_trainer, "absolute_zero": absolute_zero_trainer}[name]
    gathers, calls = AllGathers(), []
    with ExitStack() as stack:
        if backend.startswith("fsdp2"):  # as `accelerate launch` sets it
            stack.enter_context(mock.patch.dict(os.environ, {"ACCELERATE_USE_FSDP": "true"}))
        if backend != "plain":
            stack.enter_context(gloo_sharded_training())
        for patch in gathers.patches():
            stack.enter_context(patch)
        warnings = []
        stack.enter_context(mock.patch.object(generation_backends.logger, "warning_once", warnings.append))
        trainer = build(tempfile.mkdtemp(), path, max_steps=1, **generation_backend(backend))
        original = trainer._generate_single_turn

        def generate(prompt_ids, *args, **kwargs):
            before = gathers.count
            output = original(prompt_ids, *args, **kwargs)
            completions = [[int(t) for t in ids] for ids in output[0]]
            calls.append(
                {
                    "rows": len(prompt_ids),
                    "completions": completions,
                    "lengths": [len(ids) for ids in completions],
                    "all_gathers": gathers.count - before,
                }
            )
            return output

        trainer._generate_single_turn = generate
        trainer.train()
    (log,) = [log for log in trainer.state.log_history if "loss" in log]
    units = [m for m in trainer.model.modules() if isinstance(m, FSDPModule)]
    return {
        "world_size": trainer.accelerator.num_processes,
        "engine": "FSDP2" if trainer.is_fsdp_enabled else type(trainer.model_wrapped).__name__,
        "fsdp_units": len(units),
        "warnings": warnings,
        "calls": calls,
        "logged": {key: log[key] for key in LOGGED if key in log},
    }


def main():
    without_shm_all_reduce()
    # saved before any process group exists: once one does, only rank 0 would write the config
    path = tiny_checkpoint(os.path.join(tempfile.mkdtemp(), "model"), initializer_range=0.5)
    generation = GenerationConfig.from_pretrained(path)
    generation.eos_token_id = [tiny_tokenizer().eos_token_id, *STOPS]
    generation.save_pretrained(path)
    write_rank_result({config: run(config, path) for config in sys.argv[1:]})


if __name__ == "__main__":
    main()
