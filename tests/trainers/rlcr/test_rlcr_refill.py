"""`answer_refill_rounds` with scripted generation: the exact batch after refilling all-equal answer groups.

Three prompts, G_a = 2 answers each, G_c = 2 confidences per answer, two refill rounds:
- 1+1: first both answers wrong; answered again (round 1), one right and one wrong: the group is replaced.
- 2+2: mixed from the start: never answered again.
- 3+3: both right, both right again (round 1), both wrong (round 2): still all equal, it keeps its first answers.
"""

import math

import pytest
import torch
from datasets import Dataset

from trl_ext.testing import BatchRecorder, ScriptedGeneration, cpu_test_args, tiny_causal_lm, tiny_checkpoint
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


CONFIDENCE_PROMPT = "How confident are you? Reply <confidence>p</confidence>."
QUESTIONS = [("1+1", "2"), ("2+2", "4"), ("3+3", "6")]
ATTEMPTS = {  # question -> the answers of each attempt (the first sampling, then each refill round)
    "1+1": [["<think>a</think><answer>3</answer>"] * 2, ["<think>b</think><answer>2</answer>", "<answer>7</answer>"]],
    "2+2": [["<think>c</think><answer>4</answer>", "<think>c</think><answer>5</answer>"]],
    "3+3": [
        ["<think>d</think><answer>6</answer>"] * 2,
        ["<think>e</think><answer>6</answer>"] * 2,
        ["<think>f</think><answer>9</answer>"] * 2,
    ],
}


class Script:
    """Answers each question's group with its next attempt; every answer gets confidences 0.3 and 0.8."""

    def __init__(self):
        self.attempt = {question: -1 for question in ATTEMPTS}

    def __call__(self, prompt_text, k):
        if CONFIDENCE_PROMPT in prompt_text:
            return ["<confidence>0.3</confidence>", "<confidence>0.8</confidence>"][k]
        question = next(q for q in ATTEMPTS if f"What is {q}?" in prompt_text)
        if k == 0:
            self.attempt[question] += 1
        return ATTEMPTS[question][self.attempt[question]][k]


def make_trainer(tmp_path, model=None, **overrides):
    tiny, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {q}?"}], "solution": s} for q, s in QUESTIONS]
    )
    settings = dict(
        max_steps=1,
        per_device_train_batch_size=6,
        num_generations=2,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        shuffle_dataset=False,
        max_completion_length=24,
        max_confidence_length=12,
        answer_refill_rounds=2,
    )
    args = cpu_test_args(tmp_path, RLCRMultiTurnConfig, **{**settings, **overrides})
    return RLCRMultiTurnTrainer(model=model or tiny, args=args, train_dataset=dataset, processing_class=tokenizer)


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("refill"))
    with ScriptedGeneration(trainer, Script()) as gen, BatchRecorder(trainer) as rec:
        trainer.train()
    return trainer, gen, rec.batches[0]


def decode(trainer, rows):
    return [trainer.processing_class.decode(ids, skip_special_tokens=True) for ids in rows]


def test_refill_calls_regenerate_only_the_all_equal_groups(step):
    trainer, gen, _ = step
    assert [len(call.prompt_ids) for call in gen.calls] == [6, 4, 2, 12]  # answers, round 1, round 2, confidences
    assert all(call.num_generations == 2 for call in gen.calls)
    round1 = decode(trainer, gen.calls[1].prompt_ids)
    assert ["1+1" in t for t in round1] == [True, True, False, False] and all("3+3" in t for t in round1[2:])
    assert all("3+3" in text for text in decode(trainer, gen.calls[2].prompt_ids))


def test_batch_holds_the_final_answers(step):
    trainer, gen, batch = step
    answers = [
        *ATTEMPTS["1+1"][1],  # replaced by the mixed round-1 group
        *ATTEMPTS["2+2"][0],
        *ATTEMPTS["3+3"][0],  # still all right after two rounds: its first answers, not round 2's wrong ones
    ]
    assert batch["row_kind"].tolist() == [0] * 6 + [1] * 12
    n = batch["completion_mask"][:6].sum(dim=1).tolist()
    assert decode(trainer, [batch["completion_ids"][row, : n[row]] for row in range(6)]) == answers
    prompts = decode(
        trainer, [ids[mask.bool()] for ids, mask in zip(batch["prompt_ids"][:6], batch["prompt_mask"][:6])]
    )
    assert [q for text in prompts for q in ATTEMPTS if f"What is {q}?" in text] == ["1+1"] * 2 + ["2+2"] * 2 + [
        "3+3"
    ] * 2
    # The confidence turn is asked on the final answers (each twice, in answer order): prompt + answer tokens.
    for row in range(6):
        context = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
        context += batch["completion_ids"][row, : n[row]].tolist()
        for turn2 in gen.calls[3].prompt_ids[2 * row : 2 * row + 2]:
            assert turn2[: len(context)] == context


def test_advantages_are_the_refill_calls_within_group(step):
    _, _, batch = step
    a = 0.5 / (0.5**0.5 + 1e-4)  # accuracy [1, 0] in a group: +-0.5 over its std
    # Brier 1 - (acc - c)^2 with c 0.3, 0.8: right 0.51, 0.96 (mean 0.735); wrong 0.91, 0.36 (mean 0.635)
    right, wrong = [-0.225, 0.225], [0.275, -0.275]
    expected = [a, -a, a, -a, 0.0, 0.0] + right + wrong + right + wrong + right + right
    torch.testing.assert_close(batch["advantages"], torch.tensor(expected), rtol=0, atol=1e-5)
    assert batch["num_items_in_batch"].item() == (batch["completion_mask"] * batch["tool_mask"]).sum().item()


def test_metrics_count_the_refill(step):
    trainer, _, _ = step
    log = trainer.state.log_history[0]
    assert log["answer/refilled_groups"] == 1.0
    assert log["answer/refill_rows"] == 6.0  # 2 groups in round 1, 1 in round 2, 2 answers each
    assert log["answer/frac_reward_zero_std_sampled"] == pytest.approx(2 / 3)  # 1+1 and 3+3 before refill
    assert log["frac_reward_zero_std"] == pytest.approx(1 / 3)  # 3+3 after
    assert log["answer/accuracy"] == pytest.approx(4 / 6)  # the trained answers: [1, 0] [1, 0] [1, 1]
    assert log["reward"] == pytest.approx(3 / 6)  # TRL's: the first sampling, [0, 0] [1, 0] [1, 1]
    # TRL's completions table shows the trained answers with their rewards and advantages.
    table = trainer._logs
    assert [c[0]["content"] for c in table["completion"]][:2] == ATTEMPTS["1+1"][1]
    assert list(table["rewards"]["accuracy"])[:2] == [1.0, 0.0]
    assert list(table["advantages"])[:2] == pytest.approx([0.5 / (0.5**0.5 + 1e-4), -0.5 / (0.5**0.5 + 1e-4)])


def test_off_by_default(tmp_path):
    trainer = make_trainer(tmp_path, answer_refill_rounds=0)
    with ScriptedGeneration(trainer, Script()) as gen:
        trainer.train()
    assert [len(call.prompt_ids) for call in gen.calls] == [6, 12]
    assert "answer/refilled_groups" not in trainer.state.log_history[0]


def test_groups_split_over_processes_are_refused(tmp_path, monkeypatch):
    # two processes of 2 rows each: every prompt's 4 answers would span both
    monkeypatch.setattr(RLCRMultiTurnConfig, "world_size", property(lambda self: 2))
    with pytest.raises(ValueError, match="answer_refill_rounds needs each prompt's num_generations=4 answers"):
        cpu_test_args(
            tmp_path, RLCRMultiTurnConfig, per_device_train_batch_size=2, num_generations=4, answer_refill_rounds=1
        )
    args = cpu_test_args(tmp_path, RLCRMultiTurnConfig, per_device_train_batch_size=2, num_generations=4)
    assert args.answer_refill_rounds == 0  # without refill the split groups are fine (TRL gathers rewards)
    with pytest.raises(ValueError, match="answer_refill_rounds must be 0"):
        cpu_test_args(
            tmp_path, RLCRMultiTurnConfig, per_device_train_batch_size=4, num_generations=2, answer_refill_rounds=-1
        )


def test_real_generation_with_reference_and_old_logprobs(tmp_path):
    # The tiny random model writes no <answer> tag: every group is all wrong, so each round regenerates all of them
    # and none is replaced. num_iterations 2 makes TRL keep old log-probs, beta a reference pass: both are merged.
    checkpoint = tiny_checkpoint(tmp_path / "model")  # the reference model loads from a path
    trainer = make_trainer(
        tmp_path, checkpoint, answer_refill_rounds=2, num_iterations=2, beta=0.1, max_completion_length=8
    )
    with BatchRecorder(trainer) as rec:
        trainer.train()
    batch, log = rec.batches[0], trainer.state.log_history[0]
    assert log["answer/refill_rows"] == 12.0 and log["answer/refilled_groups"] == 0.0
    assert log["frac_reward_zero_std"] == log["answer/frac_reward_zero_std_sampled"] == 1.0
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        assert batch[key].shape == batch["completion_ids"].shape and torch.isfinite(batch[key]).all(), key
    assert math.isfinite(log["loss"])
