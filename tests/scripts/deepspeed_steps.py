"""Runs under torchrun (one process): a few scripted steps of a trainer, with or without DeepSpeed ZeRO.

Usage: deepspeed_steps.py TRAINER:STAGE [...], TRAINER one of rlcr, replay, absolute_zero and STAGE 0 for no DeepSpeed;
the configurations run one after another in one launch. Reports, per configuration, the per-step loss, entropy and
gradient norm, which depend on the weights each step starts from, so equal reports mean equal updates.

DeepSpeed runs on CPU with the gloo backend, but accelerate sees one process per DeepSpeed run on CPU, so this
checks the ZeRO wrapping of each trainer's forward passes (partitioned parameters, the engine's backward and step),
not sharding across ranks.
"""

import sys
import tempfile

from absolute_zero_ranks import Policy
from datasets import Dataset
from deepspeed_cpu import without_shm_all_reduce
from replay_world import make_trainer as make_replay_trainer
from replay_world import scripted

from trl_ext.self_play import arithmetic_task
from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm, write_rank_result
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer, RLCRMultiTurnConfig, RLCRMultiTurnTrainer


CONFIDENCE_PROMPT = "Confidence? Reply <confidence>p</confidence>."


def rlcr_script(prompt_text, k):
    if CONFIDENCE_PROMPT in prompt_text:
        return f"<confidence>{[0.2, 0.9, 0.5][k % 3]}</confidence>"
    right = "3" if "1+2" in prompt_text else "8"
    return f"<think>t</think><answer>{right if k % 2 == 0 else 0}</answer>"


def rlcr_trainer(output_dir, **deepspeed):
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "What is 1+2?"}], "solution": "3"},
            {"prompt": [{"role": "user", "content": "What is 4+4?"}], "solution": "8"},
        ]
        * 4
    )
    # two micro-batches per generation batch: the packed loss forward on regrouped answer families
    args = cpu_test_args(
        output_dir,
        RLCRMultiTurnConfig,
        max_steps=3,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_generations=4,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        learning_rate=1e-2,
        max_completion_length=24,
        max_confidence_length=12,
        shuffle_dataset=False,
        **deepspeed,
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    return trainer, ScriptedGeneration(trainer, rlcr_script)


def replay_trainer(output_dir, **deepspeed):
    # replay from the start: the collection forward and the off-policy loss both run under the engine
    trainer = make_replay_trainer(output_dir, max_steps=4, learning_rate=1e-2, exp_ratio=0.5, **deepspeed)
    return trainer, scripted(trainer)


def absolute_zero_trainer(output_dir, **deepspeed):
    # seed C is reproposed once, D never resolves: the joint proposer + solver batch with zero-loss rows
    task = arithmetic_task()
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Seed {c}"}]} for c in "ABCD"])
    args = cpu_test_args(
        output_dir,
        AbsoluteZeroConfig,
        max_steps=3,
        per_device_train_batch_size=8,
        num_generations=2,
        num_questions_per_prompt=2,
        max_repropose_attempts=2,
        learning_rate=1e-2,
        shuffle_dataset=False,
        max_completion_length=8,
        max_question_length=8,
        **deepspeed,
    )
    trainer = AbsoluteZeroTrainer(
        model,
        task.reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
    )
    policy = Policy()
    generation = ScriptedGeneration(trainer, policy)
    policy.gen = generation
    return trainer, generation


def run(name, stage):
    deepspeed = {}
    if stage:
        config = {
            "zero_optimization": {"stage": stage},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
        }
        deepspeed = {"deepspeed": config, "use_cpu": False}
    build = {"rlcr": rlcr_trainer, "replay": replay_trainer, "absolute_zero": absolute_zero_trainer}[name]
    trainer, generation = build(tempfile.mkdtemp(), **deepspeed)
    with generation:
        trainer.train()
    logs = [log for log in trainer.state.log_history if "loss" in log]
    return {
        "engine": type(trainer.model_wrapped).__name__,
        "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage if stage else 0,
        **{key: [log[key] for log in logs] for key in ("loss", "entropy", "grad_norm")},
        "replayed": [log.get("replay/offpolicy_token_ratio", 0.0) for log in logs],
    }


def main():
    without_shm_all_reduce()
    # DeepSpeed's configuration outlives its trainer in the process: list the stage-0 runs first
    results = {}
    for config in sys.argv[1:]:
        name, stage = config.split(":")
        results[config] = run(name, int(stage))
    write_rank_result(results)


if __name__ == "__main__":
    main()
