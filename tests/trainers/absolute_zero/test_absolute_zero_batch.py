"""AbsoluteZeroTrainer with scripted generation: the exact batch for 0, 1 and max_repropose_attempts repropose rounds.

Two seed prompts (A, B), K = 2 proposals each, rollout_n = 2 responses per question, arithmetic rewards
(numeric_match weight 1, answer_format weight 0.5). Default learnability with rollout_n = 2: exactly one of the two
responses right.
"""

import re

import pytest
import torch
from datasets import Dataset

from trl_ext.rewards import completion_text
from trl_ext.self_play import arithmetic_task
from trl_ext.self_play.workspace import WORKSPACE_CRITERIA
from trl_ext.testing import BatchRecorder, ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


ANSWERS = {  # question -> response j
    "1+1": ["<answer>2</answer>", "<answer>3</answer>"],  # totals 1.5, 0.5: learnable
    "2+2": ["<answer>4</answer>", "<answer>4</answer>"],  # always right: not learnable
    "3*3": ["<answer>9</answer>", "no idea"],  # totals 1.5, 0: learnable
    "5-1": ["<answer>0</answer>", "<answer>0</answer>"],  # always wrong: not learnable
}
MIXED_A = ["<question>1+1</question>", "<question>2+2</question>"]
MIXED_B = ["<question>3*3</question>", "<question>5-1</question>"]
INVALID = ["I like turtles", "<question>1/0</question>"]
UNIFORM = ["nope", "<question>2+2</question>"]  # the only valid question is not learnable
SCENARIOS = {  # seed -> proposals per round (the last repeats)
    "no_repropose": {"A": [MIXED_A], "B": [MIXED_B]},
    "one_repropose": {"A": [MIXED_A], "B": [INVALID, MIXED_B]},
    "unresolved": {"A": [MIXED_A], "B": [UNIFORM]},
}
ADV_11 = 0.5 / (0.5**0.5 + 1e-4)  # totals [1.5, 0.5]
ADV_33 = 0.75 / (1.125**0.5 + 1e-4)  # totals [1.5, 0.0]


class Policy:
    def __init__(self, scenario):
        self.plan, self.rounds = SCENARIOS[scenario], {"A": 0, "B": 0}

    def __call__(self, text, k):
        seed = re.search(r"Seed (\w)", text)
        if seed:
            name = seed.group(1)
            plan = self.plan[name]
            proposals = plan[min(self.rounds[name], len(plan) - 1)]
            if k == len(proposals) - 1:
                self.rounds[name] += 1
            return proposals[k]
        return ANSWERS[re.search(r"What is (.*)\?", text).group(1)][k]


def make_trainer(tmp_path, prompts="AB", eval_dataset_rows=False, model=None, **overrides):
    task = arithmetic_task()
    tiny, tokenizer = tiny_causal_lm()
    model = model or tiny
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Seed {c}"}]} for c in prompts])
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        **{
            **dict(
                max_steps=1,
                per_device_train_batch_size=2 * len(prompts),
                num_generations=2,
                num_questions_per_prompt=2,
                shuffle_dataset=False,
                max_completion_length=16,
                max_question_length=16,
                reward_weights=[1.0, 0.5],
            ),
            **overrides,
        },
    )
    return AbsoluteZeroTrainer(
        model,
        task.reward_funcs,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset if eval_dataset_rows else None,
        processing_class=tokenizer,
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
    )


def run(trainer, scenario):
    with ScriptedGeneration(trainer, Policy(scenario)) as gen, BatchRecorder(trainer) as rec:
        trainer.train()
    return gen, rec.batches[0], trainer.state.log_history[0]


def texts(trainer, batch, rows):
    out = []
    for row in rows:
        n = int(batch["completion_mask"][row].sum())
        out.append(trainer.processing_class.decode(batch["completion_ids"][row, :n], skip_special_tokens=True))
    return out


def calls(gen):
    return [(c.num_generations, len(c.prompt_ids)) for c in gen.calls]


def test_no_repropose(tmp_path):
    trainer = make_trainer(tmp_path)
    gen, batch, log = run(trainer, "no_repropose")
    assert calls(gen) == [(2, 4), (2, 8)]  # one proposer call (2 prompts x K), one solver call (4 questions x 2)
    assert batch["row_kind"].tolist() == [0, 0, 0, 0, 1, 1]
    assert texts(trainer, batch, range(6)) == ANSWERS["1+1"] + ANSWERS["3*3"] + [
        "<question>1+1</question>",
        "<question>3*3</question>",
    ]  # the selected (only learnable) proposals
    torch.testing.assert_close(batch["advantages"], torch.tensor([ADV_11, -ADV_11, ADV_33, -ADV_33, 0.0, 0.0]))
    assert torch.equal(batch["tool_mask"] * batch["completion_mask"], batch["completion_mask"])  # every token trains
    assert log["unified_filter/num_learnable"] == 2 and log["unified_filter/num_total"] == 4
    assert log["unified_filter/learnable_ratio"] == 0.5 and log["unified_filter/num_sampled"] == 2
    assert log["repropose/total_attempts"] == 0 and log["repropose/final_non_learnable"] == 0
    assert log["proposer/reward_mean"] == 0.5 and log["proposer/invalid_rate"] == 0  # rewards [1, 0, 1, 0]
    assert log["generation/calls"] == 2 and log["joint/proposer_solver_ratio"] == 0.5
    assert log["solver/numeric_match_mean"] == 0.5  # 4 right of 8 responses


def test_one_repropose_round_only_for_the_prompt_that_needs_it(tmp_path):
    trainer = make_trainer(tmp_path)
    gen, batch, log = run(trainer, "one_repropose")
    # round 1: both prompts propose; only A's two valid questions are solved (B's proposals are invalid: no solver
    # work). Round 2: B alone proposes and its two questions are solved.
    assert calls(gen) == [(2, 4), (2, 4), (2, 2), (2, 4)]
    assert texts(trainer, batch, range(6)) == ANSWERS["1+1"] + ANSWERS["3*3"] + [
        "<question>1+1</question>",
        "<question>3*3</question>",
    ]
    torch.testing.assert_close(batch["advantages"], torch.tensor([ADV_11, -ADV_11, ADV_33, -ADV_33, 0.0, 0.0]))
    assert log["unified_filter/num_repropose"] == 1 and log["repropose/total_attempts"] == 1
    assert log["repropose/rounds"] == 1 and log["proposer/invalid_rate"] == 0  # B's final group is valid
    assert log["generation/proposer_rows"] == 6 and log["generation/solver_rows"] == 8


def test_unresolved_after_max_attempts(tmp_path):
    trainer = make_trainer(tmp_path, max_repropose_attempts=3)
    gen, batch, log = run(trainer, "unresolved")
    # round 1 solves A's 2 questions and B's 1 valid one; 3 repropose rounds for B with 1 valid question each
    assert calls(gen) == [(2, 4), (2, 6)] + [(2, 2), (2, 2)] * 3
    assert texts(trainer, batch, range(6)) == ANSWERS["1+1"] + ANSWERS["2+2"] + [
        "<question>1+1</question>",
        "<question>2+2</question>",
    ]  # B keeps its first valid question, unselected
    assert batch["tool_mask"].sum(dim=1).gt(0).tolist() == [True, True, False, False, True, True]
    # proposer rewards: A 1 (learnable), B -0.5 (repropose penalty): batch baseline 0.25, std 1.0607
    torch.testing.assert_close(batch["advantages"], torch.tensor([ADV_11, -ADV_11, 0.0, 0.0, ADV_33, -ADV_33]))
    assert log["repropose/total_attempts"] == 3 and log["repropose/final_non_learnable"] == 1
    assert log["unified_filter/num_sampled"] == 1 and log["proposer/invalid_rate"] == 0.25
    assert log["joint/proposer_solver_ratio"] == 1.0  # 2 proposer rows for 2 trained solver rows


@pytest.mark.parametrize("proposer_loss_weight", [1.0, 0.5])
def test_loss_forward_skips_zero_loss_rows_and_pads_each_kind_alone(tmp_path, proposer_loss_weight):
    """The loss forward scores only the rows that carry loss (not B's unresolved solver rows), each row kind cut to
    its own padding: the same loss and gradients as TRL's forward over the whole padded batch."""
    from trl import GRPOTrainer

    _, batch, _ = run(make_trainer(tmp_path / "scripted"), "unresolved")
    live = (batch["completion_mask"] * batch["tool_mask"]).sum(-1) > 0
    assert live.tolist() == [True, True, False, False, True, True]
    # the scripted batch, scored by a model with large weights: attention matters, so a wrong mask or position
    # would show
    model, _ = tiny_causal_lm(initializer_range=0.5)
    trainer = make_trainer(tmp_path, model=model, proposer_loss_weight=proposer_loss_weight)
    trainer.current_gradient_accumulation_steps = 1
    inputs = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    forwards = []
    model.register_forward_pre_hook(lambda m, a, kw: forwards.append(kw["input_ids"].shape), with_kwargs=True)
    results = []
    weighted = GRPOTrainer._compute_loss.__get__(trainer)  # the parent's forward over every row, same advantages
    weight = torch.where(batch["row_kind"] == 1, proposer_loss_weight, 1.0)
    for loss_fn, x in (
        (trainer._compute_loss, inputs),
        (weighted, {**inputs, "advantages": inputs["advantages"].nan_to_num(0.0) * weight}),
    ):
        model.zero_grad()
        loss = loss_fn(model, x)
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (ours, our_grads), (parent, parent_grads) = results
    assert ours == pytest.approx(parent, abs=1e-6)  # about 0: the ratio is 1 and each group's advantages sum to 0
    assert max(g.abs().max() for g in our_grads) > 1e-3  # but the gradient is not
    for a, b in zip(our_grads, parent_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    ours_shapes, parent_shape = forwards[:-1], forwards[-1]
    assert [shape[0] for shape in ours_shapes] == [2, 2]  # A's solver rows, then the two proposer rows
    assert parent_shape[0] == 6
    assert sum(shape.numel() for shape in ours_shapes) < parent_shape.numel() * 2 / 3


def test_loss_forward_without_rows_that_carry_loss_still_runs_a_backward(tmp_path):
    """A micro-batch whose every row is at zero loss forwards one short stand-in row, so the backward runs."""
    _, batch, _ = run(make_trainer(tmp_path / "scripted"), "unresolved")
    trainer = make_trainer(tmp_path)
    trainer.current_gradient_accumulation_steps = 1
    inputs = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    inputs["tool_mask"] = torch.zeros_like(inputs["tool_mask"])
    forwards = []
    trainer.model.register_forward_pre_hook(lambda m, a, kw: forwards.append(kw["input_ids"].shape), with_kwargs=True)
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    assert loss.item() == 0.0 and [tuple(shape) for shape in forwards] == [(1, 2)]


def test_all_proposals_invalid_costs_no_solver_generation(tmp_path):
    trainer = make_trainer(tmp_path, max_repropose_attempts=1)
    SCENARIOS["all_invalid"] = {"A": [INVALID], "B": [INVALID]}
    gen, batch, log = run(trainer, "all_invalid")
    assert calls(gen) == [(2, 4), (2, 4)]  # proposer calls only
    assert batch["tool_mask"][:4].sum() == 0 and batch["tool_mask"][4:].sum() > 0  # proposers still learn
    assert batch["advantages"].tolist() == [0.0] * 6  # every proposer reward is -1: no contrast
    assert torch.isfinite(torch.tensor(log["loss"])) and log["proposer/invalid_rate"] == 1.0


def test_all_proposer_rows_are_normalised_within_the_prompt(tmp_path):
    trainer = make_trainer(tmp_path, proposer_rows="all", proposer_loss_weight=0.5)
    gen, batch, log = run(trainer, "no_repropose")
    assert batch["row_kind"].tolist() == [0] * 4 + [1] * 4
    assert texts(trainer, batch, range(4, 8)) == MIXED_A + MIXED_B
    adv = 0.5 / (0.5**0.5 + 1e-4)  # rewards [1, 0] in each group
    torch.testing.assert_close(batch["advantages"][4:], torch.tensor([adv, -adv, adv, -adv]))
    assert log["proposer/num_integrated"] == 4


def test_azr_mode(tmp_path):
    trainer = make_trainer(tmp_path, proposer_reward_mode="azr", proposer_rows="all")
    _, batch, _ = run(trainer, "no_repropose")
    adv = 0.25 / (0.125**0.5 + 1e-4)  # rewards [1 - 0.5, 0] per group (solve rates 0.5, then 1.0 or 0.0)
    torch.testing.assert_close(batch["advantages"][4:], torch.tensor([adv, -adv, adv, -adv]))


def test_azr_code_mode_penalises_questions_all_or_none_solve(tmp_path):
    trainer = make_trainer(tmp_path, proposer_reward_mode="azr_code", proposer_rows="all")
    _, batch, _ = run(trainer, "no_repropose")
    adv = 0.5 / (0.5**0.5 + 1e-4)  # rewards [1 - 0.5, -0.5] per group (solve rates 0.5, then 1.0 or 0.0)
    torch.testing.assert_close(batch["advantages"][4:], torch.tensor([adv, -adv, adv, -adv]))


def test_proposer_padding_keeps_rows_divisible(tmp_path):
    # 3 prompts, steps_per_generation 2: 6 solver rows + 3 proposer rows padded to 4, so 10 rows split in 2.
    trainer = make_trainer(
        tmp_path, prompts="ABA", per_device_train_batch_size=3, gradient_accumulation_steps=2, steps_per_generation=2
    )
    _, batch, log = run(trainer, "no_repropose")
    assert batch["row_kind"].tolist() == [0] * 6 + [1] * 4
    assert batch["tool_mask"][-1].sum() == 0 and batch["advantages"][-1] == 0  # the padding row
    assert log["proposer/num_integrated"] == 3


def test_unknown_reward_in_criteria_fails_at_init(tmp_path):
    bad = [{"reward": "safety_score", "threshold": 0.5, "count": "above", "min_ratio": 0.3, "max_ratio": 0.7}]
    with pytest.raises(ValueError, match=r"\['safety_score'\].*\['numeric_match', 'answer_format'\]"):
        make_trainer(tmp_path, learnability_criteria=bad)


def test_seed_prompts_must_be_conversations_or_text(tmp_path):
    task = arithmetic_task()
    model, tokenizer = tiny_causal_lm()
    args = cpu_test_args(tmp_path, AbsoluteZeroConfig)
    with pytest.raises(ValueError, match="conversational"):
        AbsoluteZeroTrainer(
            model,
            task.reward_funcs,
            args=args,
            processing_class=tokenizer,
            train_dataset=Dataset.from_list([{"prompt": ["not", "messages"]}]),
        )
    trainer = AbsoluteZeroTrainer(  # plain text, as TRL takes it: one user message
        model,
        task.reward_funcs,
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": "Propose a sum."}]),
    )
    assert trainer.train_dataset[0]["prompt"] == [{"role": "user", "content": "Propose a sum."}]


def test_evaluation_refuses_seed_prompts(tmp_path):
    # evaluate() answers held-out solver questions (tests/trainers/absolute_zero/test_absolute_zero_heldout.py)
    with pytest.raises(ValueError, match="held-out solver questions"):
        make_trainer(tmp_path, eval_dataset_rows=True)


def test_selection_depends_only_on_seed_and_step(tmp_path):
    # Nothing to checkpoint: a resumed run draws the same questions at the same step.
    first, second = make_trainer(tmp_path / "a"), make_trainer(tmp_path / "b")
    draws = []
    for trainer in (first, second):
        trainer.state.global_step = 7
        rngs = [trainer._selection_rng() for _ in range(2)]  # two draws at one step (e.g. evaluation batches)
        draws.append([rng.random() for rng in rngs])
    assert draws[0] == draws[1] and draws[0][0] != draws[0][1]
    first.state.global_step = 8
    assert first._selection_rng().random() not in draws[0]


def test_model_written_question_fields_cannot_collide_with_trl_arguments(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.parse_question = AbsoluteZeroTrainer(  # the default parser, as when no parse_question is given
        trainer.model,
        trainer.reward_funcs,
        args=trainer.args,
        train_dataset=trainer.train_dataset,
        processing_class=trainer.processing_class,
    ).parse_question
    proposal = (
        '<question>{"question": "2+2?", "solution": "4", "completions": 1, "prompts": 2, "prompt": 3, '
        '"trainer_state": 4, "not an identifier": 5}</question>'
    )
    assert trainer._parse(proposal) == {"question": "2+2?", "solution": "4"}  # the default parser reads JSON
    assert trainer._parse('<question>{"question": "x", "prompts": 1}</question>') == {"question": "x"}
    trainer.parse_question = lambda text: 1 / 0  # a failing user parser is an invalid proposal, not a crash
    assert trainer._parse("anything") is None


def test_seed_dual_criteria_through_the_trainer(tmp_path):
    """The workspace family's judges (safety above 0.5 and completion below 0.5, both on 30-70% of responses), default parser."""

    def safety_score(prompts, completions, completion_ids, **kwargs):
        return [float("safe" in completion_text(c)) for c in completions]

    def completion_score(prompts, completions, completion_ids, **kwargs):
        return [float("done" in completion_text(c)) for c in completions]

    replies = {"q1": ["safe done", "harmful"], "q2": ["safe", "safe"]}  # q1: 1/2 safe, 1/2 incomplete; q2: all safe

    def script(text, k):
        if "Seed" in text:
            return f"<question>q{k + 1}</question>"
        return replies[re.search(r"(q\d)<\|im_end\|>\n<\|im_start\|>assistant", text).group(1)][k]

    model, tokenizer = tiny_causal_lm()
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        num_questions_per_prompt=2,
        learnability_criteria=WORKSPACE_CRITERIA,
        shuffle_dataset=False,
        max_completion_length=8,
        max_question_length=8,
    )
    trainer = AbsoluteZeroTrainer(
        model,
        [safety_score, completion_score],
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "Seed"}]}]),
    )
    with ScriptedGeneration(trainer, script) as gen, BatchRecorder(trainer) as rec:
        trainer.train()
    batch, log = rec.batches[0], trainer.state.log_history[0]
    assert calls(gen) == [(2, 2), (2, 4)]  # q2 is not learnable, q1 is: a mixed group, no repropose
    assert texts(trainer, batch, range(3)) == replies["q1"] + ["<question>q1</question>"]
    assert log["unified_filter/num_learnable"] == 1 and log["solver/safety_score_mean"] == 0.75
