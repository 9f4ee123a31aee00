"""Runs under torchrun: a scripted AbsoluteZero step where only some prompts need reproposing, then a real step.

Usage: absolute_zero_ranks.py PER_DEVICE_BATCH. Seed prompts A, B, C, D with rollout_n = 2: with 2 ranks and 4 rows
each, rank 0 holds A and B (mixed groups at once) and rank 1 holds C (reproposed once) and D (never resolved).
"""

import re
import sys
import tempfile

from datasets import Dataset

import trl_ext
from trl_ext.self_play import arithmetic_task
from trl_ext.testing import (
    BatchRecorder,
    ScriptedGeneration,
    cpu_test_args,
    tiny_causal_lm,
    weights_digest,
    write_rank_result,
)
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


PLAN = {  # seed -> proposals per proposer round (the last repeats)
    "A": [["<question>1+1</question>", "<question>2+2</question>"]],
    "B": [["<question>3*3</question>", "<question>5-1</question>"]],
    "C": [["junk", "junk"], ["<question>6+1</question>", "<question>8-8</question>"]],
    "D": [["nope", "<question>2+2</question>"]],
}
ANSWERS = {
    "1+1": ["2", "3"],
    "2+2": ["4", "4"],
    "3*3": ["9", "1"],
    "5-1": ["0", "0"],
    "6+1": ["7", "0"],
    "8-8": ["0", "0"],
}


class Policy:
    """Stateless per row: the proposer round is the number of proposer calls so far, the same on every rank."""

    gen = None

    def __call__(self, text, k):
        seed = re.search(r"Seed (\w)", text)
        if seed:
            rounds = sum("Seed" in self.gen.tokenizer.decode(c.prompt_ids[0]) for c in self.gen.calls)
            plan = PLAN[seed.group(1)]
            return plan[min(rounds, len(plan) - 1)][k]
        return f"<answer>{ANSWERS[re.search(r'What is (.*)[?]', text).group(1)][k]}</answer>"


def main():
    per_device = int(sys.argv[1])
    task = arithmetic_task()
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Seed {c}"}]} for c in "ABCD"])
    args = cpu_test_args(
        tempfile.mkdtemp(),
        AbsoluteZeroConfig,
        max_steps=1,
        per_device_train_batch_size=per_device,
        num_generations=2,
        num_questions_per_prompt=2,
        max_repropose_attempts=2,
        shuffle_dataset=False,
        max_completion_length=8,
        max_question_length=8,
    )
    kwargs = dict(
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
    )
    trainer = AbsoluteZeroTrainer(model, task.reward_funcs, **kwargs)
    policy = Policy()
    with ScriptedGeneration(trainer, policy) as gen, BatchRecorder(trainer) as rec:
        policy.gen = gen
        trainer.train()
    batch = rec.batches[0]

    # A real step (transformers generation; the random model's proposals are all invalid, so every prompt is
    # reproposed to the limit): no deadlock, identical metrics and weights on every rank.
    real = AbsoluteZeroTrainer(trainer.accelerator.unwrap_model(trainer.model), task.reward_funcs, **kwargs)
    real.train()
    write_rank_result(
        {
            "advantages": batch["advantages"].tolist(),
            "row_kind": batch["row_kind"].tolist(),
            "trained": (batch["tool_mask"] * batch["completion_mask"]).sum(dim=1).gt(0).tolist(),
            "calls": [(c.num_generations, len(c.prompt_ids)) for c in gen.calls],
            "scripted_log": {k: v for k, v in trainer.state.log_history[0].items() if "/" in k},
            "real_log": {k: v for k, v in real.state.log_history[0].items() if "/" in k},
            "digest": weights_digest(real.accelerator.unwrap_model(real.model)),
            "world_size": real.accelerator.num_processes,
            "package": trl_ext.__file__,
        }
    )


if __name__ == "__main__":
    main()
