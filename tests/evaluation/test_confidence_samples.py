"""The stated confidence's mean of k samples, a second confidence column beside the greedy one: the mean by hand, its
report from rows, through the greedy calibration evaluation on a tiny model (real sampling, seeded, on the greedy
confidence turn's prompt), and through the recipe's held-out evaluation (scripted replies, exact report)."""

import json

import pytest
from datasets import Dataset

import trl_ext.evaluation.agreement as agreement
import trl_ext.evaluation.rlcr as rlcr
from trl_ext.data import graded_arithmetic
from trl_ext.evaluation.confidence_samples import mean_confidence
from trl_ext.evaluation.records import read_jsonl
from trl_ext.evaluation.rlcr import calibration_evaluation, evaluate_calibration
from trl_ext.recipe.rlcr import add_confidence_samples, heldout_evaluation, metrics_line
from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


def test_mean_over_the_parsed_samples_by_hand():
    assert mean_confidence([0.2, None, 0.5, 0.8]) == pytest.approx(0.5)  # (0.2 + 0.5 + 0.8) / 3, None left out
    assert mean_confidence([0.3]) == 0.3
    assert mean_confidence([None, None, None]) is None  # none parsed: the row's mean is unparsable
    assert mean_confidence([]) is None


def test_mean_report_from_rows_beside_the_greedy_one():
    rows = [
        # the greedy confidence is one constant; the sampled means separate right from wrong within level 1
        {"correct": 1, "confidence": 0.5, "group": 1, "sampled_confidences": [0.9, 0.7], "confidence_mean": 0.8},
        {"correct": 0, "confidence": 0.5, "group": 1, "sampled_confidences": [0.2, None], "confidence_mean": 0.2},
        {"correct": 1, "confidence": 0.5, "group": 2, "sampled_confidences": [None, None], "confidence_mean": None},
        {"correct": 0, "confidence": None, "group": 2, "sampled_confidences": [0.4, 0.6], "confidence_mean": 0.5},
    ]
    cost = {"samples_per_question": 2, "generated_tokens": 30}
    result = calibration_evaluation(rows, confidence_samples_cost=cost)
    assert result.report.n == 3 and result.report.auroc == 0.5  # the greedy column is unchanged
    m = result.mean_report
    # by hand over the 3 rows with a mean: confidences [0.8, 0.2, 0.5], correct [1, 0, 0]
    assert m.n == 3 and m.auroc == 1.0 and m.auroc_within_groups == 1.0  # level 1's one right/wrong pair
    assert m.brier == pytest.approx((0.2**2 + 0.2**2 + 0.5**2) / 3)
    assert m.brier_skill == pytest.approx(1 - 0.11 / (1 / 3 * 2 / 3))
    assert m.mean_confidence == pytest.approx(0.5)
    assert result.mean_parse_fail_rate == 0.25  # one row of four: all its samples unparsable
    d = result.to_dict()["stated_confidence_mean_of_k"]
    assert d["samples_per_question"] == 2 and d["generated_tokens"] == 30
    assert d["confidence_parse_fail_rate"] == 0.25 and d["sample_parse_fail_rate"] == 3 / 8
    assert {"auroc", "auroc_within_groups", "brier_skill_groups", "ece"} <= set(d["intervals"])


def test_no_mean_column_without_samples():
    rows = [{"correct": 1, "confidence": 0.5}, {"correct": 0, "confidence": 0.4}]
    result = calibration_evaluation(rows)
    assert result.mean_report is None and "stated_confidence_mean_of_k" not in result.to_dict()


def test_evaluation_samples_k_confidences_on_the_greedy_confidence_prompt(tmp_path, monkeypatch):
    model, tokenizer = tiny_causal_lm(seed=3, initializer_range=0.5)
    greedy_prompts, sampled_prompts = [], []
    greedy, sample = rlcr.greedy_completions, agreement.sampled_completions

    def recording_greedy(model, tokenizer, prompts, *args):
        greedy_prompts.append(prompts)
        return greedy(model, tokenizer, prompts, *args)

    def recording_sample(model, tokenizer, prompts, *args, **kwargs):
        sampled_prompts.extend(prompts)
        return sample(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(rlcr, "greedy_completions", recording_greedy)
    monkeypatch.setattr(agreement, "sampled_completions", recording_sample)
    args = cpu_test_args(
        tmp_path, RLCRMultiTurnConfig, max_completion_length=5, max_confidence_length=3, lenient_parsing=True
    )
    dataset = graded_arithmetic(6, seed=1)
    result = evaluate_calibration(model, tokenizer, dataset, args, batch_size=4, progress=False, confidence_samples=3)
    # per batch of questions: the answers' greedy call, then the confidence turn's, whose prompts are sampled again
    assert sampled_prompts == greedy_prompts[1] + greedy_prompts[3]
    for prompt, row in zip(sampled_prompts, result.rows, strict=True):
        text = tokenizer.decode(prompt, skip_special_tokens=True)
        assert row["answer"] and row["answer"] in text  # the greedy answer, then the confidence question
        assert text.index(row["answer"]) < text.rindex(args.confidence_prompt)
        assert len(row["sampled_confidences"]) == 3
        assert row["sampled_confidences"] == [None] * 3 and row["confidence_mean"] is None
    # this random model's 3-token replies never parse: rows whose k replies all fail count as unparsable
    assert result.mean_parse_fail_rate == 1.0 and result.mean_cost["sample_parse_fail_rate"] == 1.0
    assert 0 < result.mean_cost["generated_tokens"] <= 6 * 3 * 3 and result.mean_cost["samples_per_question"] == 3
    assert "stated_confidence_mean_of_k" in result.to_dict()
    again = evaluate_calibration(model, tokenizer, dataset, args, batch_size=4, progress=False, confidence_samples=3)
    assert [r["sampled_confidences"] for r in again.rows] == [r["sampled_confidences"] for r in result.rows]


CONFIDENCE_PROMPT = "How confident are you? Reply <confidence>p</confidence>."
QUESTIONS = [("What is 2+3?", "5", 1), ("What is 7*6?", "42", 1), ("What is 1+1?", "2", 2)]
ANSWERS = {"2+3": "<answer>5</answer>", "7*6": "<answer>41</answer>", "1+1": "I cannot say"}  # right, wrong, wrong
# k = 3 sampled replies per greedy answer (the greedy confidence is 0.5 for every answer)
SAMPLED = {
    "<answer>5</answer>": ["<confidence>0.9</confidence>", "<confidence>0.7</confidence>", "no idea"],
    "<answer>41</answer>": ["<confidence>0.2</confidence>", "maybe", "<confidence>0.4</confidence>"],
    "I cannot say": ["hmm", "no idea", "?"],  # none parses: the row's mean is unparsable
}


def test_recipe_evaluation_reports_the_mean_of_k_beside_the_greedy_confidence(tmp_path, monkeypatch):
    model, tokenizer = tiny_causal_lm()
    evaluation = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": q}], "solution": s, "level": level} for q, s, level in QUESTIONS]
    )
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        confidence_prompt=CONFIDENCE_PROMPT,
        max_completion_length=24,
        max_confidence_length=12,
        per_device_eval_batch_size=2,
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=evaluation, processing_class=tokenizer)

    def script(prompt_text, k):
        if CONFIDENCE_PROMPT in prompt_text:
            return "<confidence>0.5</confidence>"
        return next(reply for key, reply in ANSWERS.items() if key in prompt_text)

    sampled_calls = []

    def scripted_samples(model, tokenizer, prompts, k, max_new_tokens, seed=0):
        sampled_calls.append((prompts, k, max_new_tokens))
        replies = []
        for prompt in prompts:
            text = tokenizer.decode(prompt)
            answer = next(answer for answer in SAMPLED if answer in text)
            replies.append([tokenizer.encode(reply) + [tokenizer.eos_token_id] for reply in SAMPLED[answer][:k]])
        return replies

    monkeypatch.setattr(agreement, "sampled_completions", scripted_samples)
    with ScriptedGeneration(trainer, script) as gen:
        result = heldout_evaluation(trainer, evaluation, "after", confidence_samples=3)

    # the k replies were sampled on the greedy confidence turn's own prompts: question, greedy answer, question
    greedy_confidence_prompts = [p for call in gen.calls[1::2] for p in call.prompt_ids]
    assert [p for prompts, _, _ in sampled_calls for p in prompts] == greedy_confidence_prompts
    assert all(k == 3 and length == 12 for _, k, length in sampled_calls)
    for prompt, (question, _, _) in zip(greedy_confidence_prompts, QUESTIONS, strict=True):
        text = tokenizer.decode(prompt)
        answer = next(reply for key, reply in ANSWERS.items() if key in question)
        assert question in text and text.index(answer) < text.rindex(CONFIDENCE_PROMPT)

    saved = json.loads((tmp_path / "eval_after.json").read_text())
    assert saved["auroc"] == 0.5 and saved["n"] == 3  # the greedy column: one constant
    mean = saved["stated_confidence_mean_of_k"]
    # by hand: means [0.8, 0.3] for the right and the wrong answer, the third row unparsable
    assert mean["n"] == 2 and mean["auroc"] == 1.0 and mean["mean_confidence"] == pytest.approx(0.55)
    assert mean["brier"] == pytest.approx((0.2**2 + 0.3**2) / 2)
    assert mean["confidence_parse_fail_rate"] == pytest.approx(1 / 3)
    assert mean["sample_parse_fail_rate"] == pytest.approx(5 / 9) and mean["samples_per_question"] == 3
    tokens = sum(len(tokenizer.encode(reply)) + 1 for replies in SAMPLED.values() for reply in replies)
    assert mean["generated_tokens"] == tokens and set(mean["intervals"]) >= {"auroc", "auroc_within_groups"}

    records = read_jsonl(tmp_path / "eval_after.jsonl")
    assert [r["sampled_confidences"] for r in records] == [[0.9, 0.7, None], [0.2, None, 0.4], [None, None, None]]
    assert [r["confidence_mean"] for r in records] == pytest.approx([0.8, 0.3, None])
    assert [r["confidence"] for r in records] == [0.5, 0.5, 0.5]
    assert "stated confidence, mean of 3 samples at temperature 1" in metrics_line(result)

    # the final --eval_steps evaluation reused (`trainer.evaluate()`, TRL's evaluation loop included): its prompts
    sampled_calls.clear()
    with ScriptedGeneration(trainer, script):
        trainer.evaluate(evaluation)
        heldout_evaluation(trainer, evaluation, "reused", reuse_last=True, confidence_samples=3)
    assert [p for prompts, _, _ in sampled_calls for p in prompts] == greedy_confidence_prompts
    assert json.loads((tmp_path / "eval_reused.json").read_text())["stated_confidence_mean_of_k"] == mean

    monkeypatch.setattr(trainer.args, "eval_temperature", 1.0)  # sampled answers: no greedy answer to sample on
    with pytest.raises(ValueError, match="--confidence_samples needs a greedy evaluation"):
        add_confidence_samples(trainer, result.rows, 3)
