"""Runs under torchrun: a few scripted training steps of each trainer under each backend, one after another.

Usage: sharded_steps.py CONFIG [CONFIG ...], each CONFIG `TRAINER:BACKEND[:nosync][:eval]`.
- TRAINER: rlcr (`share_prefix=False`), rlcr_packed (the default `share_prefix=True`), rlcr_kl_answers (packed, `beta`
  0.1 on the answers, `confidence_beta` 0), replay, absolute_zero.
- BACKEND: plain (one process, or DDP with several), zero3 (DeepSpeed ZeRO-3, the model loaded from a path into
  partitioned parameters: `zero3_init_flag`), fsdp2 (FSDP2 with `cpu_ram_efficient_loading`: rank 0's weights are
  broadcast as FSDP wraps the model; the other ranks' are perturbed first, so they must not matter).
- nosync: switches off the gradient reduce-scatter of zero3 and fsdp2 (each rank keeps its own gradient shard), a
  negative control: the figures must move.
- eval (RLCR): after training, `trainer.evaluate()` on three questions: TRL's evaluation loss and the held-out
  evaluation with the model's own greedy answers (not scripted), a share of two per rank, rank 1's padded; reports its
  metrics (timings left out).

Every configuration has the same global batch whatever the number of processes: `per_device_train_batch_size` is
the global figure divided by the number of processes, so one process and two make the same steps. Each rank holds
other rows, and the ranks cut their rows into micro-batches differently (rank 0 keeps TRL's generation order, rank 1
regroups or reverses it): with RLCR and `share_prefix=False`, rank 0's second micro-batch holds confidence rows only,
while rank 1's hold both row kinds. Reports, per configuration, the per-step loss and gradient norm, how the weights
were loaded, the row kinds of each RLCR micro-batch and a digest of the rows this rank trained.
"""

import hashlib
import os
import sys
import tempfile
from contextlib import ExitStack
from functools import partial
from unittest import mock

import torch
import trl.trainer.grpo_trainer as grpo_module
from absolute_zero_ranks import Policy
from datasets import Dataset
from deepspeed_cpu import without_shm_all_reduce
from replay_world import make_trainer as make_replay_trainer
from replay_world import scripted
from safetensors.torch import load_file

from trl_ext.self_play import arithmetic_task
from trl_ext.testing import (
    ScriptedGeneration,
    cpu_test_args,
    gloo_sharded_training,
    tiny_checkpoint,
    tiny_tokenizer,
    write_rank_result,
)
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer, RLCRMultiTurnConfig, RLCRMultiTurnTrainer


CONFIDENCE_PROMPT = "Confidence? Reply <confidence>p</confidence>."
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
RANK = int(os.environ.get("RANK", "0"))


def rlcr_script(prompt_text, k):
    if CONFIDENCE_PROMPT in prompt_text:
        return f"<confidence>{[0.2, 0.9, 0.5][k % 3]}</confidence>"
    right = "3" if "1+2" in prompt_text else "8"
    return f"<think>t</think><answer>{right if k % 2 == 0 else 0}</answer>" + " x" * k


def rlcr_trainer(output_dir, model, share_prefix=False, **backend):
    # 2 prompts x G_a = 2 answers x (1 + G_c = 2) rows per generation batch, 2 micro-batches per process
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "What is 1+2?"}], "solution": "3"},
            {"prompt": [{"role": "user", "content": "What is 4+4?"}], "solution": "8"},
        ]
        * 2
    )
    args = cpu_test_args(
        output_dir,
        RLCRMultiTurnConfig,
        max_steps=2,
        per_device_train_batch_size=2 // WORLD,
        gradient_accumulation_steps=2,
        num_generations=2,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        learning_rate=1e-2,
        max_completion_length=16,
        max_confidence_length=8,
        shuffle_dataset=False,
        share_prefix=share_prefix,
        **backend,
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tiny_tokenizer())
    return trainer, ScriptedGeneration(trainer, rlcr_script)


EVAL_QUESTIONS = Dataset.from_list(
    [
        {"prompt": [{"role": "user", "content": f"What is {q}?"}], "solution": s}
        for q, s in [("1+2", "3"), ("4+4", "8"), ("2+5", "7")]
    ]
)
# evaluate()'s timings differ between processes; every other metric must agree
TIMES = ("_seconds", "_runtime", "_per_second", "_preparation_time")


def replay_trainer(output_dir, model, **backend):
    # replay from the start: stored rows (collected on the rank that generated them) replayed on either rank
    trainer = make_replay_trainer(
        output_dir,
        model=model,
        max_steps=3,
        learning_rate=1e-2,
        exp_ratio=0.5,
        per_device_train_batch_size=8 // WORLD,
        **backend,
    )
    return trainer, scripted(trainer)


def absolute_zero_trainer(output_dir, model, **backend):
    task = arithmetic_task()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Seed {c}"}]} for c in "ABCD"])
    args = cpu_test_args(
        output_dir,
        AbsoluteZeroConfig,
        max_steps=2,
        per_device_train_batch_size=8 // WORLD,
        num_generations=2,
        num_questions_per_prompt=2,
        max_repropose_attempts=2,
        learning_rate=1e-2,
        shuffle_dataset=False,
        max_completion_length=8,
        max_question_length=8,
        **backend,
    )
    trainer = AbsoluteZeroTrainer(
        model,
        task.reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer(),
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
    )
    policy = Policy()
    generation = ScriptedGeneration(trainer, policy)
    policy.gen = generation
    return trainer, generation


def backend_args(backend):
    if backend == "plain":
        return {}
    if backend == "zero3":
        config = {
            "zero_optimization": {"stage": 3},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
        }
        return {"deepspeed": config, "use_cpu": False}
    if backend == "fsdp2":
        config = {
            "version": 2,
            "cpu_ram_efficient_loading": True,
            "reshard_after_forward": True,
            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            "state_dict_type": "FULL_STATE_DICT",
        }
        return {"fsdp": "full_shard auto_wrap", "fsdp_config": config, "use_cpu": False}
    raise ValueError(backend)


def rank_order(batch):
    """The row order of this rank's micro-batches (TRL shuffles them at random, alike on every rank)."""
    n = len(next(v for v in batch.values() if v is not None))
    if RANK == 0:
        return torch.arange(n)
    if "family" in batch:  # RLCR: each answer with its confidences, so every micro-batch mixes the kinds
        return torch.sort(batch["family"].cpu(), stable=True).indices
    return torch.arange(n).flip(0)


def ordered_shuffle(batch, original=grpo_module.shuffle_sequence_dict):
    order = rank_order(batch)
    with mock.patch.object(torch, "randperm", lambda n, *a, **k: order):
        return original(batch)


def no_gradient_sync(backend):
    """Switch off the gradient reduce-scatter: each rank keeps its own gradient's shard (averaged as if reduced)."""
    if backend == "zero3":
        from deepspeed.runtime.comm import coalesced_collectives

        # the flat buffer already holds this rank's chunk, divided by the world size: skip the collective
        return mock.patch.object(coalesced_collectives, "_torch_reduce_scatter_fn", lambda *a, **k: None)

    def local(output, input, group=None, op=None, async_op=False):
        output.copy_(input.view(-1)[RANK * output.numel() : (RANK + 1) * output.numel()].view_as(output))

    return mock.patch.object(torch.distributed, "reduce_scatter_single", local)


def run(config, path):
    name, backend, *flags = config.split(":")
    output_dir = tempfile.mkdtemp()
    build = {
        "rlcr": rlcr_trainer,
        "rlcr_packed": partial(rlcr_trainer, share_prefix=True),
        # a KL anchor on the answers only: the confidence turn skips its reference pass on every rank
        "rlcr_kl_answers": partial(rlcr_trainer, share_prefix=True, beta=0.1, confidence_beta=0.0),
        # the confidence turn at its own temperature: each kind packed and scored at its temperature on every rank
        "rlcr_temperatures": partial(rlcr_trainer, share_prefix=True, temperature=0.7, confidence_temperature=1.3),
        "replay": replay_trainer,
        "absolute_zero": absolute_zero_trainer,
    }[name]
    rows, kinds = hashlib.sha256(), []
    with ExitStack() as stack:
        if backend == "fsdp2":  # as `accelerate launch` sets it: transformers loads the weights on rank 0 only
            stack.enter_context(mock.patch.dict(os.environ, {"ACCELERATE_USE_FSDP": "true"}))
        if backend != "plain":
            stack.enter_context(gloo_sharded_training())
        if "nosync" in flags:
            stack.enter_context(no_gradient_sync(backend))
        stack.enter_context(mock.patch.object(grpo_module, "shuffle_sequence_dict", ordered_shuffle))
        trainer, generation = build(output_dir, path, **backend_args(backend))
        # before training wraps it: FSDP's cpu_ram_efficient_loading leaves ranks other than 0 on the meta device,
        # ZeRO-3's zero.Init partitions the parameters as they load (an empty local tensor, the shape in ds_shape)
        first = next(trainer.model.parameters())
        if first.numel() == 0 and hasattr(first, "ds_shape"):
            loaded = "partitioned"
        elif first.device.type == "meta":
            loaded = "meta"
        else:  # the checkpoint's values, or placeholders to be overwritten by rank 0's
            saved = load_file(os.path.join(path, "model.safetensors"))
            state = trainer.model.state_dict()
            assert set(saved) <= set(state), sorted(set(saved) - set(state))
            loaded = "checkpoint" if all(torch.equal(state[k], saved[k]) for k in saved) else "other"
        if backend == "fsdp2" and RANK != 0:
            # cpu_ram_efficient_loading: rank 0's weights are broadcast when FSDP wraps the model (transformers 5
            # loads the checkpoint on every rank all the same): what the other ranks hold must not matter
            with torch.no_grad():
                for parameter in trainer.model.parameters():
                    parameter.add_(1.0)
        original = trainer._compute_loss

        def compute_loss(model, inputs):
            rows.update(inputs["completion_ids"].cpu().numpy().tobytes())
            if "row_kind" in inputs:  # RLCR: the row kinds of each micro-batch
                kinds.append(sorted(set(inputs["row_kind"].tolist())))
            return original(model, inputs)

        stack.enter_context(mock.patch.object(trainer, "_compute_loss", compute_loss))
        with generation:
            trainer.train()
        evaluation = trainer.evaluate(EVAL_QUESTIONS) if "eval" in flags else None
    logs = [log for log in trainer.state.log_history if "loss" in log]
    engine = type(trainer.model_wrapped).__name__
    if trainer.is_fsdp_enabled:
        engine = "FSDP2" if trainer.accelerator.is_fsdp2 else "FSDP1"
    return {
        "engine": engine,
        "world_size": trainer.accelerator.num_processes,
        "loaded": loaded,
        "rows": rows.hexdigest(),
        "kinds": kinds,
        "eval": evaluation and {key: value for key, value in evaluation.items() if not key.endswith(TIMES)},
        **{key: [log[key] for log in logs] for key in ("loss", "grad_norm")},
    }


def main():
    without_shm_all_reduce()
    # saved before any process group exists: once one does, only rank 0 would write the config
    path = tiny_checkpoint(os.path.join(tempfile.mkdtemp(), "model"))
    write_rank_result({config: run(config, path) for config in sys.argv[1:]})


if __name__ == "__main__":
    main()
