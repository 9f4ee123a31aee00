"""The calibration benchmark's single-turn RLCR baseline (benchmarks/single_turn_rlcr.py): GRPOTrainer with its KL
term on the answer tokens only, checked against plain GRPOTrainer on the same scripted batch."""

import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_ext.core.tail_spans import tail_token_mask
from trl_ext.testing import BatchRecorder, ScriptedGeneration, cpu_test_args, tiny_causal_lm, tiny_checkpoint


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
single_turn = pytest.importorskip("single_turn_rlcr")

QUESTIONS = [("What is 2+3?", "5"), ("What is 7*6?", "42")]
REPLIES = {  # question -> reply k: right and confident, wrong, a format failure (no </answer>), right and unsure
    "2+3": [
        "<answer>5</answer><confidence>0.9</confidence>",
        "<answer>6</answer> <confidence>0.8</confidence>",
        "5, confidence 0.5",
        "<answer>5</answer>\n<confidence>0.3</confidence>",
    ],
    "7*6": [
        "<answer>42</answer><confidence>1.0</confidence>",
        "<answer>41</answer><confidence>0.1</confidence>",
        "<answer>42</answer>",
        "<think>7*6</think><answer>42</answer><confidence>0.6</confidence>",
    ],
}


def script(prompt_text, k):
    return REPLIES["2+3" if "2+3" in prompt_text else "7*6"][k]


def make_trainer(tmp_path, trainer_cls, model=None, **overrides):
    tiny, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "solution": s} for q, s in QUESTIONS])
    settings = dict(max_steps=1, per_device_train_batch_size=8, shuffle_dataset=False, max_completion_length=32)
    args = cpu_test_args(tmp_path, GRPOConfig, **{**settings, **overrides})
    return trainer_cls(
        model=model or tiny,
        reward_funcs=single_turn.single_turn_rlcr_reward(),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(tiny_checkpoint(tmp_path_factory.mktemp("model"), initializer_range=0.5))


@pytest.fixture(scope="module")
def batch(tmp_path_factory, checkpoint):
    trainer = make_trainer(tmp_path_factory.mktemp("run"), single_turn.AnswerKLGRPOTrainer, checkpoint, beta=0.1)
    with ScriptedGeneration(trainer, script), BatchRecorder(trainer) as rec:
        trainer.train()
    return trainer, rec.batches[0]


def test_the_batch_marks_the_tokens_after_the_answer(batch):
    trainer, batch = batch
    tail, mask = batch[single_turn.TAIL_KEY], batch["completion_mask"]
    for ids, row_tail, row_mask in zip(batch["completion_ids"], tail, mask):
        n = int(row_mask.sum())
        assert row_tail[:n].tolist() == tail_token_mask(trainer._tokenizer, ids[:n].tolist(), "</answer>")
        assert not row_tail[n:].any()
    replies = [reply for question in ("2+3", "7*6") for reply in REPLIES[question]]  # recorded before shuffling
    for reply, ids, row_tail, row_mask in zip(replies, batch["completion_ids"], tail, mask):
        ids, row_tail = ids[row_mask.bool()], row_tail[row_mask.bool()].bool()
        head, after = (trainer._tokenizer.decode(ids[m]) for m in (~row_tail, row_tail))
        if "</answer>" not in reply:
            assert not row_tail.any()  # a format failure keeps the KL everywhere
            continue
        answer = reply[: reply.rindex("</answer>") + len("</answer>")]
        # the answer part through </answer> (and a token straddling its end), the rest with the EOS token in the tail
        assert head.startswith(answer) and len(head) <= len(answer) + 1
        assert after.endswith(trainer._tokenizer.eos_token) and "answer" not in after
        assert reply[len(answer) :] in head[len(answer) :] + after


def test_kl_is_zero_on_the_confidence_and_unchanged_on_the_answer(batch, checkpoint, tmp_path):
    """With a reference the policy has drifted from: our loss equals plain GRPOTrainer's with the reference set to the
    policy on the tail tokens, and with zero advantages (the loss is then the KL term alone) it equals plain
    GRPOTrainer's KL over the answer tokens only."""
    _, batch = batch
    inputs = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    tail = inputs[single_turn.TAIL_KEY].bool()
    assert tail.any() and (~tail & inputs["completion_mask"].bool()).any()
    ours = make_trainer(tmp_path / "ours", single_turn.AnswerKLGRPOTrainer, checkpoint, beta=0.1)
    plain = make_trainer(tmp_path / "plain", GRPOTrainer, checkpoint, beta=0.1)
    for trainer in (ours, plain):
        trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logits_to_keep = inputs["completion_ids"].size(1)
        policy, _, _ = plain._get_per_token_logps_and_entropies(plain.model, ids, attention, logits_to_keep)
    noise = torch.randn(policy.shape, generator=torch.Generator().manual_seed(0))
    inputs["ref_per_token_logps"] = drifted = policy + 0.5 * noise
    without_tail = {k: v for k, v in inputs.items() if k != single_turn.TAIL_KEY}

    def loss(trainer, batch):
        return trainer._compute_loss(trainer.model, batch).item()

    anchored_answers = {**without_tail, "ref_per_token_logps": torch.where(tail, policy, drifted)}
    assert loss(ours, inputs) == pytest.approx(loss(plain, anchored_answers), abs=1e-5)
    assert abs(loss(ours, inputs) - loss(plain, without_tail)) > 1e-3  # the tail's KL was not 0 to begin with
    assert torch.equal(inputs["ref_per_token_logps"], drifted)  # the batch is left as it was, for later iterations

    zero = torch.zeros_like(inputs["advantages"])
    kl_only = {**inputs, "advantages": zero}
    answer_kl = {**without_tail, "advantages": zero, "tool_mask": (~tail).long()}  # TRL's loss mask * tool_mask
    assert loss(ours, kl_only) == pytest.approx(loss(plain, answer_kl), abs=1e-6)
    assert loss(ours, kl_only) > 1e-3
    # and a batch without a tail mask is plain GRPO
    assert loss(ours, without_tail) == pytest.approx(loss(plain, without_tail), abs=1e-6)
