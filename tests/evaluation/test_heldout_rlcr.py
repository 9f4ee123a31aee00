"""RLCR's held-out evaluation during training (`trainer.evaluate()`, trainers/seams/heldout.py): scripted answers and
confidences on a hand-computable set, evaluated at the configured steps through the trainer's generation path."""

import math
from pathlib import Path

import pytest
from datasets import Dataset

from trl_ext.evaluation.records import read_jsonl
from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


CONFIDENCE_PROMPT = "How confident are you? Reply <confidence>p</confidence>."
TRAIN = [("What is 2+3?", "5"), ("What is 7*6?", "42")]
EVAL = [("What is 2+3?", "5"), ("What is 7*6?", "42"), ("What is 1+1?", None)]  # the last one has no gold
LEVELS = [1, 1, 2]  # the group of each evaluation question
ANSWERS = {
    "2+3": "<answer>5</answer>",
    "7*6": "<answer>41</answer>",
    "1+1": "I cannot say",
}  # right, wrong, unparsable
CONFIDENCES = {
    "<answer>5</answer>": "<confidence>0.9</confidence>",
    "<answer>41</answer>": "<confidence>0.2</confidence>",
}

# By hand. Correct: [1, 0, None (no gold)]; confidences [0.9, 0.2, None (unparsable)].
EXPECTED = {
    "eval_answer/accuracy": 0.5,
    "eval_answer/parse_fail_rate": 1 / 3,
    "eval_confidence/parse_fail_rate": 1 / 3,
    "eval_confidence/mean": 0.55,
    "eval_calibration/ece": 0.15,  # bins (0.8, 0.9]: |1 - 0.9|; (0.1, 0.2]: |0 - 0.2|; weights 1/2 each
    "eval_calibration/brier": 0.025,  # (0.1^2 + 0.2^2) / 2
    "eval_calibration/auroc": 1.0,
    "eval_calibration/brier_skill": 0.9,  # 1 - 0.025 / (0.5 * 0.5): the best constant states the base rate 0.5
    "eval_calibration/auroc_within_groups": 1.0,  # both calibrated answers are level 1: one right/wrong pair
    "eval_calibration/brier_skill_groups": 0.9,  # level 1's base rate is 0.5 too
    "eval_num_samples": 3.0,
    "eval_num_questions": 3.0,
    "eval_num_missing_gold": 1.0,
    "eval_num_calibrated": 2.0,
}


def conversation(question):
    return [{"role": "user", "content": question}]


def script(prompt_text, k):
    if CONFIDENCE_PROMPT in prompt_text:
        return next((reply for answer, reply in CONFIDENCES.items() if answer in prompt_text), "no idea")
    return next(reply for key, reply in ANSWERS.items() if key in prompt_text)


def make_trainer(tmp_path, **overrides):
    model, tokenizer = tiny_causal_lm()
    train = Dataset.from_list([{"prompt": conversation(q), "solution": s} for q, s in TRAIN])
    evaluation = Dataset.from_list(
        [{"prompt": conversation(q), "solution": s, "level": level} for (q, s), level in zip(EVAL, LEVELS)]
    )
    settings = dict(
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        max_completion_length=24,
        max_confidence_length=12,
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=2,  # two chunks: 2 questions, then 1
    )
    args = cpu_test_args(tmp_path, RLCRMultiTurnConfig, **{**settings, **overrides})
    return RLCRMultiTurnTrainer(
        model=model, args=args, train_dataset=train, eval_dataset=evaluation, processing_class=tokenizer
    )


def assert_metrics(metrics):
    for key, value in EXPECTED.items():
        assert metrics[key] == pytest.approx(value), key
    assert metrics["eval_seconds"] >= 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("rlcr_eval"))
    settings, spans, inside = [], [], [False]  # evaluate() also runs TRL's evaluation loop: mark the held-out part
    heldout = trainer._heldout_evaluation

    def tracked(*args, **kwargs):
        start, inside[0] = len(gen.calls), True
        try:
            return heldout(*args, **kwargs)
        finally:
            spans.append((start, len(gen.calls)))
            inside[0] = False

    def recording(prompt_text, k):
        settings.append((inside[0], trainer.generation_config.do_sample, trainer.generation_config.max_new_tokens))
        return script(prompt_text, k)

    trainer._heldout_evaluation = tracked
    with ScriptedGeneration(trainer, recording) as gen:
        trainer.train()
    del trainer._heldout_evaluation
    return trainer, gen, settings, spans


def test_evaluates_at_every_eval_step_with_exact_metrics(trained):
    trainer, _, _, _ = trained
    evaluations = [log for log in trainer.state.log_history if "eval_answer/accuracy" in log]
    assert [log["step"] for log in evaluations] == [1, 2]
    for log in evaluations:
        assert_metrics(log)
    # training metrics are logged apart, without eval keys
    train_logs = [log for log in trainer.state.log_history if "answer/accuracy" in log]
    assert train_logs and all(not any(k.startswith("eval_") for k in log) for log in train_logs)


def test_greedy_answer_then_confidence_turn_per_answer(trained):
    trainer, gen, settings, spans = trained
    # per evaluation: 2 chunks x (answers, confidences)
    eval_calls = [call for start, end in spans for call in gen.calls[start:end]]
    assert len(eval_calls) == 8 and all(c.num_generations == 1 for c in eval_calls)
    answers, confidences = eval_calls[0], eval_calls[1]
    for prompt, answer, turn2 in zip(answers.prompt_ids, answers.completion_ids, confidences.prompt_ids):
        assert turn2[: len(prompt) + len(answer)] == prompt + answer  # the training turn's token concatenation
    evaluation = [s for s in settings if s[0]]
    assert evaluation and all(not do_sample for _, do_sample, _ in evaluation)
    assert {length for _, _, length in evaluation} == {24, 12}
    assert trainer.generation_config.do_sample and trainer.generation_config.max_new_tokens == 24  # restored


def test_every_evaluation_writes_its_per_sample_records(trained):
    trainer, _, _, _ = trained
    for step in (1, 2):
        records = read_jsonl(Path(trainer.args.output_dir) / "heldout" / f"eval_step{step}.jsonl")
        assert [r["prompt"] for r in records] == [q for q, _ in EVAL] and [r["group"] for r in records] == LEVELS
        assert [r["correct"] for r in records] == [1.0, 0.0, None]
        assert [r["confidence"] for r in records] == [0.9, 0.2, None]
        assert records[1]["answer"] == "<answer>41</answer>"
    assert trainer.heldout_records == records


def test_evaluate_returns_the_logged_metrics(trained):
    trainer, _, _, _ = trained
    with ScriptedGeneration(trainer, script):
        metrics = trainer.evaluate()
    assert_metrics(metrics)
    assert trainer.state.log_history[-1]["eval_answer/accuracy"] == metrics["eval_answer/accuracy"]
    assert trainer.model.training


def test_without_trls_loop_evaluate_reports_the_heldout_metrics_alone(trained):
    trainer, _, _, _ = trained
    with ScriptedGeneration(trainer, script):
        assert "eval_loss" in trainer.evaluate()  # TRL's loop ran too
    trainer.args.eval_trl_loop = False
    try:
        with ScriptedGeneration(trainer, script):
            metrics = trainer.evaluate()
    finally:
        trainer.args.eval_trl_loop = True
    assert_metrics(metrics)
    assert "eval_loss" not in metrics and not any("rollout/" in key for key in metrics)
    assert trainer.state.log_history[-1]["eval_answer/accuracy"] == metrics["eval_answer/accuracy"]


def test_calibration_undefined_without_labels(tmp_path):
    trainer = make_trainer(tmp_path, eval_strategy="no")
    only_missing = Dataset.from_list([{"prompt": conversation("What is 1+1?"), "solution": None}])
    with ScriptedGeneration(trainer, script):
        metrics = trainer.evaluate(only_missing, metric_key_prefix="test")
    assert math.isnan(metrics["test_answer/accuracy"]) and math.isnan(metrics["test_calibration/ece"])
    assert metrics["test_num_missing_gold"] == 1.0 and metrics["test_confidence/parse_fail_rate"] == 1.0
