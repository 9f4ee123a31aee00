"""Metric names carry one prefix per row kind whatever `logging_steps`, gradient accumulation or mode: the metrics a
second kind's call moves under `confidence/` or `proposer/` are never moved again, though with `logging_steps > 1`
the earlier steps' values wait in `_metrics` until the next log."""

import re
from collections import defaultdict

import pytest
from datasets import Dataset

from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer, RLCRMultiTurnConfig, RLCRMultiTurnTrainer
from trl_ext.trainers.seams.scoping import scoped_call


def rlcr_policy(prompt_text, k):
    if "confidence" in prompt_text.split("<|im_start|>user")[-1]:
        return ["<confidence>0.9</confidence>", "<confidence>0.2</confidence>"][k % 2]
    gold = int(prompt_text.split("What is ")[1].split("+")[0]) * 2
    return f"<think>sum</think><answer>{gold if k % 2 == 0 else gold + 1}</answer>"


def azr_policy(prompt_text, k):
    if "Seed" in prompt_text:
        return ["<question>1+1</question>", "<question>2+2</question>"][k % 2]
    return ["<answer>2</answer>", "<answer>5</answer>"][k % 2]  # 1+1: learnable; 2+2: never solved


def rlcr(tmp_path, **overrides):
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "solution": str(2 * i)} for i in range(4)]
    )
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        **{
            **dict(
                per_device_train_batch_size=4,
                num_generations=2,
                num_generations_confidence=2,
                max_completion_length=16,
                max_confidence_length=12,
            ),
            **overrides,
        },
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    return trainer, rlcr_policy


def absolute_zero(tmp_path, **overrides):
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Seed {c}"}]} for c in "ABCD"])

    def right(prompts, completions, completion_ids, **kwargs):
        return [float("<answer>2</answer>" in str(c)) for c in completions]

    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        **{
            **dict(
                per_device_train_batch_size=4,
                num_generations=2,
                num_questions_per_prompt=2,
                max_repropose_attempts=0,
                max_completion_length=12,
                max_question_length=12,
            ),
            **overrides,
        },
    )
    trainer = AbsoluteZeroTrainer(model, [right], args=args, train_dataset=dataset, processing_class=tokenizer)
    return trainer, azr_policy


def logged_keys(make, tmp_path, **overrides):
    """The metric keys of each training log (the end-of-training summary left out)."""
    trainer, policy = make(tmp_path, **overrides)
    with ScriptedGeneration(trainer, policy):
        trainer.train()
    return [set(log) for log in trainer.state.log_history if "loss" in log]


def assert_one_prefix(keys, prefix):
    nested = [key for key in keys if re.search(rf"(^|/){prefix}/(.*/)?{prefix}/", key)]
    assert not nested, nested
    assert any(key.startswith(f"{prefix}/") for key in keys)


@pytest.mark.parametrize(
    "make, prefix",
    [(rlcr, "confidence"), (absolute_zero, "proposer")],
    ids=["rlcr", "absolute_zero"],
)
@pytest.mark.parametrize(
    "logging_steps, accumulation, steps",
    [(10, 1, 10), (4, 2, 4)],
    ids=["trl-default-logging", "accumulation"],
)
def test_keys_at_any_logging_interval_are_those_of_every_step(
    tmp_path, make, prefix, logging_steps, accumulation, steps
):
    # The scripted policy gives the same metrics every step: logging every step shows the exact key set.
    every_step = logged_keys(make, tmp_path / "every", max_steps=2, gradient_accumulation_steps=accumulation)
    assert len(every_step) == 2 and every_step[0] == every_step[1]
    expected = every_step[0]
    assert_one_prefix(expected, prefix)

    logs = logged_keys(
        make,
        tmp_path / "interval",
        max_steps=steps,
        logging_steps=logging_steps,
        gradient_accumulation_steps=accumulation,
    )
    assert len(logs) == 1
    assert logs[0] == expected


def test_moved_metrics_are_not_moved_again():
    """Earlier steps' `confidence/` values waiting for the log stay where they are; only this call's move."""

    class Holder:
        _metrics = {"train": defaultdict(list)}

    holder = Holder()
    metrics = holder._metrics["train"]
    metrics["completions/mean_length"] = [7.0]  # the answer turn's, this step
    metrics["confidence/completions/mean_length"] = [3.0]  # the confidence turn's, an earlier step
    metrics["num_tokens"] = [10.0]
    with scoped_call(holder, mode="train", prefix="confidence"):
        metrics["completions/mean_length"].append(4.0)
        metrics["reward"].append(0.5)
        metrics["num_tokens"].append(20.0)
    assert dict(metrics) == {
        "completions/mean_length": [7.0],
        "confidence/completions/mean_length": [3.0, 4.0],
        "confidence/reward": [0.5],
        "num_tokens": [10.0, 20.0],
    }
