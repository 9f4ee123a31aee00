"""ReplayGRPOTrainer's held-out evaluation (`trainer.evaluate()`, trainers/seams/heldout.py): mean@k and pass@k of k
sampled answers per question, scored by the trainer's reward functions, at the configured steps; sampling seeded."""

import pytest
from datasets import Dataset

from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import ReplayGRPOConfig, ReplayGRPOTrainer


SOLUTIONS = {"A": "7", "B": "8", "C": None}  # C has no gold answer
EVAL_REPLIES = {"A": ["7", "not 7"], "B": ["8", "8"], "C": ["9", "9"]}  # per task, sample k


def exact(completions, solution, **kwargs):
    return [
        None if s is None else float(c[0]["content"].strip() == s) for c, s in zip(completions, solution, strict=True)
    ]


def rows(tasks):
    return [
        {"prompt": [{"role": "user", "content": f"Task {t}: what is it?"}], "solution": SOLUTIONS[t]} for t in tasks
    ]


def task_of(prompt_text):
    return next(t for t in SOLUTIONS if f"Task {t}:" in prompt_text)


def make_trainer(tmp_path, **overrides):
    model, tokenizer = tiny_causal_lm()
    settings = dict(
        max_steps=1,
        replay_start_ratio=0.0,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        eval_strategy="steps",
        eval_steps=1,
        eval_temperature=1.0,
        eval_num_samples=2,
        per_device_eval_batch_size=2,
    )
    args = cpu_test_args(tmp_path, ReplayGRPOConfig, **{**settings, **overrides})
    return ReplayGRPOTrainer(
        model=model,
        reward_funcs=exact,
        args=args,
        train_dataset=Dataset.from_list(rows("AB")),
        eval_dataset=Dataset.from_list(rows("ABC")),
        processing_class=tokenizer,
    )


def test_mean_and_pass_at_k_at_the_eval_step(tmp_path):
    trainer = make_trainer(tmp_path)
    sampling = []

    def script(prompt_text, k):
        if not trainer.model.training:
            sampling.append((trainer.generation_config.do_sample, trainer.generation_config.temperature))
            return EVAL_REPLIES[task_of(prompt_text)][k]
        return SOLUTIONS[task_of(prompt_text)]

    spans = []  # the generation calls of the held-out evaluation (evaluate() also runs TRL's evaluation loop)
    heldout = trainer._heldout_evaluation

    def tracked(*args, **kwargs):
        start = len(gen.calls)
        try:
            return heldout(*args, **kwargs)
        finally:
            spans.append((start, len(gen.calls)))

    trainer._heldout_evaluation = tracked
    with ScriptedGeneration(trainer, script) as gen:
        trainer.train()
    (log,) = [log for log in trainer.state.log_history if "eval_accuracy" in log]
    # successes by hand: A [1, 0], B [1, 1], C [None, None] (no gold: counted, not scored)
    assert log["step"] == 1
    assert log["eval_accuracy"] == 0.75 and log["eval_mean@2"] == 0.75 and log["eval_pass@2"] == 1.0
    assert log["eval_num_questions"] == 3 and log["eval_num_samples"] == 6
    assert log["eval_num_unscored"] == 2 and log["eval_num_unscored_questions"] == 1
    assert log["eval_rewards/exact/mean"] == 0.75 and log["eval_reward"] == 0.75
    assert log["eval_seconds"] >= 0
    # two chunks of questions (2, then 1), k = 2 samples each, sampled at eval_temperature
    eval_calls = [call for start, end in spans for call in gen.calls[start:end]]
    assert [len(call.prompt_ids) for call in eval_calls] == [4, 2]
    assert set(sampling) == {(True, 1.0)}
    assert trainer.generation_config.temperature == 1.0 and trainer.generation_config.max_new_tokens == 8


def test_sampled_evaluation_is_deterministic_given_the_seed(tmp_path):
    trainer = make_trainer(tmp_path, eval_strategy="no", max_completion_length=6)
    sampled = []

    def recording(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completion_ids, logprobs = type(trainer)._generate_single_turn(
            trainer, prompt_ids, images, multimodal_fields, num_generations, has_tool_images
        )
        sampled.append(completion_ids)
        return completion_ids, logprobs

    trainer._generate_single_turn = recording
    first = trainer.heldout_evaluate()  # the held-out evaluation's samples alone (no TRL evaluation loop)
    second = trainer.heldout_evaluate()
    del trainer._generate_single_turn
    assert sampled[:2] == sampled[2:]  # the model's own samples, twice the same
    assert sampled[0][0] != sampled[0][1] or sampled[0][2] != sampled[0][3]  # and really sampled
    assert {k: v for k, v in first.items() if k != "eval_seconds"} == pytest.approx(
        {k: v for k, v in second.items() if k != "eval_seconds"}, nan_ok=True
    )


def test_sampling_needs_a_temperature(tmp_path):
    with pytest.raises(ValueError, match="eval_temperature > 0"):
        cpu_test_args(tmp_path, ReplayGRPOConfig, eval_num_samples=4)
