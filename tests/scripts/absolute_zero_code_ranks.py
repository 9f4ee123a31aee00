"""Code reasoning self-play with scripted generation: one seed prompt per task type, K = 2 proposals, rollout_n = 2.

Usage (under torchrun): absolute_zero_code_ranks.py PER_DEVICE_BATCH EXECUTOR STEPS, EXECUTOR "fake" (programs
answered by Python functions, nothing runs) or "sandbox" (trl_ext.sandbox). Each rank reports its buffer, how many
snippets it executed, and the logged metrics. Importable: the in-process tests use `make_trainer` and `script`.
"""

import re
import sys
import tempfile

from datasets import Dataset

from trl_ext.self_play import code_reasoning_task
from trl_ext.self_play.code_reasoning import ZERO_TRIPLET
from trl_ext.testing import BatchRecorder, FakeExecutor, ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


SORT = "def f(xs, k):\n    return sorted(xs)[:k]"
DOUBLE = "def f(n):\n    return n * 2"
CLOCK = "import time\n\ndef f(n):\n    return time.perf_counter_ns() + n"  # not deterministic
IDENTITY_GUESS = "def f(y):\n    return y"
ZERO_GUESS = "def f(y):\n    return 0"


def block(label, text):
    return f"```{label}\n{text}\n```\n"


PROPOSALS = {  # proposer prompt marker -> the K proposals
    "work out the output": ["Plan: sort.\n" + block("python", SORT) + block("input", "[3, 1, 2], 2"), "no code"],
    "hard to invert": [block("python", DOUBLE) + block("input", "21"), block("python", CLOCK) + block("input", "1")],
    "different inputs": [block("input", "7") + block("input", "'ab'") + block("message", "look closely"), "hmm"],
}
ANSWERS = {  # solver prompt marker -> the rollout_n responses (one right, one wrong: every valid question learnable)
    "What does this Python function return": [block("output", "[1, 2]"), block("output", "[3]")],
    "Find an input for which": [block("input", "21"), block("input", "5")],
    "Write a Python function `f` that maps": [block("python", IDENTITY_GUESS), block("python", ZERO_GUESS)],
}


def script(text, k):
    for table in (PROPOSALS, ANSWERS):
        for marker, replies in table.items():
            if marker in text:
                return replies[k]
    raise AssertionError(f"unscripted prompt: {text[-300:]!r}")


def fake_executor():
    return FakeExecutor(
        {
            SORT: lambda xs, k: sorted(xs)[:k],
            DOUBLE: lambda n: n * 2,
            ZERO_TRIPLET["program"]: lambda x: x,
            CLOCK: _clock(),
            IDENTITY_GUESS: lambda y: y,
            ZERO_GUESS: lambda y: 0,
        }
    )


def _clock():
    ticks = iter(range(10**6))
    return lambda n: next(ticks) + n


def make_trainer(output_dir, executor="fake", model=None, tokenizer=None, **overrides):
    execute_many = fake_executor() if executor == "fake" else None
    task = code_reasoning_task(execute_many=execute_many, timeout_s=5.0)
    if model is None:
        model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"Propose a {t} task."}], "task_type": t}
            for t in ("deduction", "abduction", "induction")
        ]
    )
    args = cpu_test_args(
        output_dir,
        AbsoluteZeroConfig,
        **{
            **dict(
                max_steps=1,
                per_device_train_batch_size=6,
                num_generations=2,
                num_questions_per_prompt=2,
                max_repropose_attempts=0,
                shuffle_dataset=False,
                max_completion_length=8,
                max_question_length=8,
                reward_weights=list(task.reward_weights),
            ),
            **overrides,
        },
    )
    trainer = AbsoluteZeroTrainer(
        model,
        task.reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
        task_state=task.state,
    )
    return trainer, task


def proposer_prompts(gen, tokenizer):
    """The decoded proposer prompts of each proposer generation call."""
    calls = [[tokenizer.decode(ids) for ids in call.prompt_ids] for call in gen.calls]
    return [call for call in calls if "Python puzzles" in call[0] or "different inputs" in call[0]]


def main():
    from trl_ext.testing import write_rank_result

    per_device, executor, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    trainer, task = make_trainer(tempfile.mkdtemp(), executor, per_device_train_batch_size=per_device, max_steps=steps)
    with ScriptedGeneration(trainer, script), BatchRecorder(trainer) as rec:
        trainer.train()
    write_rank_result(
        {
            "world_size": trainer.accelerator.num_processes,
            "buffer": task.state.state_dict(),
            "executions": task.state.executions,
            "logs": [
                {k: v for k, v in log.items() if re.match(r"(task|proposer|unified_filter|solver)/", k)}
                for log in trainer.state.log_history
                if "loss" in log
            ],
            "advantages": [batch["advantages"].tolist() for batch in rec.batches],
            "row_kind": [batch["row_kind"].tolist() for batch in rec.batches],
        }
    )


if __name__ == "__main__":
    main()
