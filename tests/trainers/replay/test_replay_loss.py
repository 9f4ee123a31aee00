"""ReplayGRPOTrainer's loss against GRPOTrainer's on the same inputs, and hand-computed off-policy values."""

import math

import pytest
import torch
from scripts.replay_world import make_trainer
from trl import GRPOTrainer


B, P, T = 4, 3, 5


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("loss"), max_completion_length=T)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def make_inputs(trainer, advantages=(1.0, -0.5, 0.8, -1.2)):
    g = torch.Generator().manual_seed(0)
    completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    inputs = {
        "prompt_ids": torch.randint(10, 1000, (B, P), generator=g),
        "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(10, 1000, (B, T), generator=g),
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": completion_mask.sum(),
    }
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], completion_mask], 1),
            T,
        )
    inputs["old_per_token_logps"] = logps
    return inputs


def with_replay(inputs, rows, recorded_shift=0.0):
    exp_mask = torch.zeros_like(inputs["completion_mask"])
    exp_mask[rows] = inputs["completion_mask"][rows]
    old = inputs["old_per_token_logps"].clone()
    old[rows] = old[rows] - recorded_shift
    return {**inputs, "exp_mask": exp_mask, "old_per_token_logps": old}


def loss_and_grads(fn, trainer, inputs):
    trainer.model.zero_grad()
    loss = fn(trainer.model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"])
def test_replay_at_ratio_one_equals_the_parents_loss_and_gradient(trainer, loss_type):
    # Recorded log-probs equal to the current ones: off-policy tokens reduce to -A, as GRPO's do at ratio 1, so
    # the combined aggregation must reproduce the parent's loss over all tokens, for every loss type.
    trainer.loss_type = loss_type
    inputs = make_inputs(trainer)
    parent_loss, parent_grads = loss_and_grads(lambda m, x: GRPOTrainer._compute_loss(trainer, m, x), trainer, inputs)
    loss, grads = loss_and_grads(trainer._compute_loss, trainer, with_replay(inputs, [1, 3]))
    assert loss.item() == pytest.approx(parent_loss.item(), abs=1e-6)
    for a, b in zip(grads, parent_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    trainer.loss_type = "grpo"


def test_on_policy_rows_keep_the_parents_semantics(trainer):
    inputs = make_inputs(trainer)
    inputs["old_per_token_logps"] = inputs["old_per_token_logps"] - 0.1  # ratio e^0.1 on every on-policy token
    parent = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
    ours = trainer._compute_loss(trainer.model, with_replay(inputs, []))
    assert ours.item() == pytest.approx(parent.item(), abs=1e-7)


def test_off_policy_ratio_uses_the_recorded_log_probs_and_is_clipped(trainer):
    trainer._metrics["train"].clear()
    inputs = make_inputs(trainer, advantages=(0.0, 0.0, 0.0, 2.0))
    # Row 3 replayed with recorded log-probs log(3) lower than now: ratio 3, clipped at 1 + off_cliprange_high = 2.
    replayed = with_replay(inputs, [3], recorded_shift=math.log(3.0))
    loss = trainer._compute_loss(trainer.model, replayed)
    # grpo: mean over 4 rows of each row's token mean; only row 3 has a non-zero advantage: -2 * A / 4.
    assert loss.item() == pytest.approx(-2 * 2.0 / 4, rel=1e-5)
    metrics = trainer._metrics["train"]
    assert metrics["replay/importance_ratio_mean"][-1] == pytest.approx(3.0, rel=1e-4)
    assert metrics["replay/logp_drift"][-1] == pytest.approx(math.log(3.0), rel=1e-4)
    assert metrics["replay/offpolicy_token_ratio"][-1] == pytest.approx(2 / 14)
    loss.backward()  # clipped above the range with A > 0: no gradient from the replayed row


def test_without_importance_correction_the_ratio_is_one(trainer):
    trainer._metrics["train"].clear()
    trainer.args.exp_is_correct = False
    try:
        inputs = make_inputs(trainer, advantages=(0.0, 0.0, 0.0, 2.0))
        loss = trainer._compute_loss(trainer.model, with_replay(inputs, [3], recorded_shift=math.log(3.0)))
    finally:
        trainer.args.exp_is_correct = True
    assert loss.item() == pytest.approx(-2.0 / 4, rel=1e-5)
    assert trainer._metrics["train"]["replay/importance_ratio_mean"][-1] == pytest.approx(1.0)


def test_shaping_loss(trainer):
    trainer.args.off_policy_loss = "shaping"
    try:
        inputs = make_inputs(trainer, advantages=(0.0, 0.0, 0.0, 2.0))
        loss = trainer._compute_loss(trainer.model, with_replay(inputs, [3], recorded_shift=math.log(3.0)))
    finally:
        trainer.args.off_policy_loss = "clip"
    assert loss.item() == pytest.approx(-2.0 * 3 / 3.1 / 4, rel=1e-5)


def test_on_policy_rows_without_old_log_probs_use_the_current_ones(trainer):
    # Aligned steps without vLLM: TRL computes no old log-probs, the batch says so, and on-policy rows get GRPO's
    # own semantics (old = current) while the replayed row keeps its recorded log-probs.
    inputs = make_inputs(trainer, advantages=(1.0, -0.5, 0.0, 0.0))
    no_old = {k: v for k, v in inputs.items() if k != "old_per_token_logps"}
    parent = GRPOTrainer._compute_loss(trainer, trainer.model, no_old)
    replayed = with_replay(inputs, [3])
    replayed["old_per_token_logps"][:3] = 0.0  # placeholders the loss must not read
    replayed["replay_has_old_logps"] = torch.tensor(False)
    assert trainer._compute_loss(trainer.model, replayed).item() == pytest.approx(parent.item(), abs=1e-6)
    replayed["replay_has_old_logps"] = torch.tensor(True)  # reading the placeholders would change the loss
    assert trainer._compute_loss(trainer.model, replayed).item() != pytest.approx(parent.item(), abs=1e-3)
