"""`evaluate()` keeps `GRPOTrainer.evaluate`'s contract for every trainer: its loss and metrics (`eval_loss`,
`eval_<name>_loss` for a dict of datasets), datasets passed to `evaluate()` directly; the held-out metrics are added
to the same log.

`test_evaluate_with_eval_dataset` is TRL's own test (tests/test_grpo_trainer.py in TRL's repository), ported offline:
the six dataset kinds, each passed to `evaluate()` with only a training set given at init. TRL's tiny Hub model and
reward model become the tiny local model and a reward function; its `zen` prompts become local rows in each trainer's
shape: conversational prompts with a gold answer for ReplayGRPOTrainer (replay off) and RLCRMultiTurnTrainer (whose
accuracy reward reads the gold answer), and for AbsoluteZeroTrainer seed prompts to train on and held-out solver
questions (a proposal's fields, gold included) to evaluate, the only evaluation set it accepts: its evaluation loss is
the solver's GRPO loss on them.
"""

import math

import pytest
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict

from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import (
    AbsoluteZeroConfig,
    AbsoluteZeroTrainer,
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)


def exact(completions, solution, **kwargs):
    return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution, strict=True)]


def questions(n=6, offset=0):
    return [
        {"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "solution": str(2 * i)}
        for i in range(offset, offset + n)
    ]


def solver_questions(n=6):
    return [{"question": f"What is {i}+{i}?", "solution": str(2 * i)} for i in range(n)]


# TRL's GRPOConfig settings in the test, as far as each trainer's batch shape allows
SETTINGS = dict(
    per_device_train_batch_size=3, per_device_eval_batch_size=3, num_generations=3, max_completion_length=8
)


def replay(tmp_path):
    args = cpu_test_args(tmp_path, ReplayGRPOConfig, replay_start_ratio=1.0, **SETTINGS)  # replay off
    model, tokenizer = tiny_causal_lm()
    trainer = ReplayGRPOTrainer(
        model=model,
        reward_funcs=exact,
        args=args,
        train_dataset=Dataset.from_list(questions()),
        processing_class=tokenizer,
    )
    return trainer, Dataset.from_list(questions(offset=10))


def rlcr(tmp_path):
    args = cpu_test_args(
        tmp_path, RLCRMultiTurnConfig, num_generations_confidence=2, max_confidence_length=8, **SETTINGS
    )
    model, tokenizer = tiny_causal_lm()
    trainer = RLCRMultiTurnTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(questions()), processing_class=tokenizer
    )
    return trainer, Dataset.from_list(questions(offset=10))


def absolute_zero(tmp_path):
    args = cpu_test_args(tmp_path, AbsoluteZeroConfig, num_questions_per_prompt=2, max_question_length=8, **SETTINGS)
    model, tokenizer = tiny_causal_lm()
    seeds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Propose task {i}"}]} for i in range(6)])
    trainer = AbsoluteZeroTrainer(model, [exact], args=args, train_dataset=seeds, processing_class=tokenizer)
    return trainer, Dataset.from_list(solver_questions())


TRAINERS = {"replay": replay, "rlcr": rlcr, "absolute_zero": absolute_zero}
HELDOUT = {"replay": "accuracy", "rlcr": "answer/accuracy", "absolute_zero": "accuracy"}  # one held-out metric each


def as_kind(split: Dataset, kind: str):
    streaming = "iterable" in kind
    split = split.to_iterable_dataset() if streaming else split
    if kind in ("dataset", "iterable_dataset"):
        return split
    if kind in ("dataset_dict", "iterable_dataset_dict"):
        return (IterableDatasetDict if streaming else DatasetDict)({"data1": split, "data2": split})
    return {"data1": split, "data2": split}  # "dict_of_dataset" or "dict_of_iterable_dataset"


@pytest.mark.parametrize("trainer_name", list(TRAINERS))
@pytest.mark.parametrize(
    "eval_dataset_type",
    [
        "dataset",
        "iterable_dataset",
        "dataset_dict",
        "iterable_dataset_dict",
        "dict_of_dataset",
        "dict_of_iterable_dataset",
    ],
)
def test_evaluate_with_eval_dataset(tmp_path, trainer_name, eval_dataset_type):
    trainer, split = TRAINERS[trainer_name](tmp_path)
    eval_dataset = as_kind(split, eval_dataset_type)
    if isinstance(eval_dataset, IterableDataset):
        assert not isinstance(split, IterableDataset)  # the conversion happened

    metrics = trainer.evaluate(eval_dataset=eval_dataset)

    heldout = HELDOUT[trainer_name]
    prefixes = ["eval"] if eval_dataset_type in ("dataset", "iterable_dataset") else ["eval_data1", "eval_data2"]
    for prefix in prefixes:
        assert metrics[f"{prefix}_loss"] is not None and math.isfinite(metrics[f"{prefix}_loss"])
        assert f"{prefix}_runtime" in metrics  # TRL's speed metrics
        assert f"{prefix}_{heldout}" in metrics  # the held-out metrics, added
    # One log entry per evaluated split, holding both
    logged = [log for log in trainer.state.log_history if any(key.endswith("_loss") for key in log)]
    assert len(logged) == len(prefixes)
    for prefix, log in zip(prefixes, logged, strict=True):
        assert f"{prefix}_loss" in log and f"{prefix}_{heldout}" in log


@pytest.mark.parametrize("trainer_name", list(TRAINERS))
def test_the_trainers_eval_dataset_and_trl_loop_metrics_are_kept(tmp_path, trainer_name):
    """The eval set given at init, as `eval_steps` evaluates it: TRL's loop metrics (`eval_reward`, ...) are in the
    log beside the held-out ones; where a name is taken by a held-out metric, TRL's moves under `eval_rollout/`."""
    trainer, split = TRAINERS[trainer_name](tmp_path)
    trainer.eval_dataset = split
    metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_loss"]) and "eval_reward" in metrics
    assert f"eval_{HELDOUT[trainer_name]}" in metrics
    # two evaluation batches, one log: the second turn's metrics keep one prefix
    assert not [key for key in metrics if "confidence/confidence" in key or "proposer/proposer" in key]
    if trainer_name == "rlcr":  # the sampled rollouts' accuracy, kept under its own name
        assert "eval_rollout/answer/accuracy" in metrics and "eval_confidence/reward" in metrics


@pytest.mark.parametrize("trainer_name", list(TRAINERS))
def test_a_list_of_rows(tmp_path, trainer_name):
    """The recipes pass lists of rows (Absolute Zero's `heldout_questions` become one)."""
    trainer, split = TRAINERS[trainer_name](tmp_path)
    metrics = trainer.evaluate([dict(row) for row in split])
    assert math.isfinite(metrics["eval_loss"]) and f"eval_{HELDOUT[trainer_name]}" in metrics


def test_the_heldout_metric_is_the_heldout_evaluations(tmp_path):
    """Scripted: the held-out evaluation's answers are right, those of TRL's loop wrong; the log keeps each under its
    own name."""
    trainer, split = rlcr(tmp_path)
    in_heldout = [False]
    heldout = trainer._heldout_evaluation

    def flagged(*args, **kwargs):
        in_heldout[0] = True
        try:
            return heldout(*args, **kwargs)
        finally:
            in_heldout[0] = False

    def script(prompt_text, k):
        if "confidence" in prompt_text.split("<|im_start|>user")[-1]:
            return "<confidence>0.5</confidence>"
        gold = int(prompt_text.split("What is ")[1].split("+")[0]) * 2
        return f"<answer>{gold if in_heldout[0] else -1}</answer>"

    trainer._heldout_evaluation = flagged
    with ScriptedGeneration(trainer, script):
        metrics = trainer.evaluate(split.select(range(3)))
    assert metrics["eval_answer/accuracy"] == 1.0
    assert metrics["eval_rollout/answer/accuracy"] == 0.0
