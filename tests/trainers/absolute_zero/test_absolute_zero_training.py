"""AbsoluteZeroTrainer end to end on a tiny model: real generation, training and resume, old/ref log-probs for both
roles, vLLM server mode."""

import math

import pytest
import torch
from datasets import Dataset

from trl_ext.rewards import completion_text
from trl_ext.testing import (
    BatchRecorder,
    LoopbackVLLMServer,
    ScriptedGeneration,
    changed_parameters,
    cpu_test_args,
    snapshot_parameters,
    tiny_causal_lm,
    tiny_checkpoint,
    vllm_server_mode,
)
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


def parity(prompts, completions, completion_ids, **kwargs):
    """A reward a random model gets right about half the time: learnable groups occur with real sampling."""
    return [float(ids[0] % 2) if ids else 0.0 for ids in completion_ids]


def any_text(text):
    """Every proposal is a valid question (a random tiny model never writes tags)."""
    return {"question": f"Repeat: {text[:12]}"}


def dataset(n=4):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Propose task {i}"}]} for i in range(n)])


def make(tmp_path, model=None, tokenizer=None, **overrides):
    if model is None:
        model, tokenizer = tiny_causal_lm()
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        **{
            **dict(
                per_device_train_batch_size=4,
                num_generations=2,
                num_questions_per_prompt=2,
                max_repropose_attempts=1,
                max_completion_length=6,
                max_question_length=6,
                learning_rate=1e-2,
            ),
            **overrides,
        },
    )
    return AbsoluteZeroTrainer(
        model, [parity], args=args, train_dataset=dataset(), processing_class=tokenizer, parse_question=any_text
    )


@pytest.mark.slow
def test_real_generation_trains_and_resumes(tmp_path):
    trainer = make(tmp_path, max_steps=2, save_strategy="steps", save_steps=2, lr_scheduler_type="constant")
    before = snapshot_parameters(trainer.model)
    with BatchRecorder(trainer) as rec:
        trainer.train()
    for log in trainer.state.log_history[:-1]:
        assert math.isfinite(log["loss"]) and 0 <= log["unified_filter/learnable_ratio"] <= 1
        assert log["generation/calls"] in (2, 4)  # one round, or a repropose round too
    for batch in rec.batches:
        assert batch["row_kind"].tolist() == [0] * 4 + [1] * 2
        assert all(torch.isfinite(v).all() for v in batch.values() if v.is_floating_point())
    assert changed_parameters(before, trainer.model)

    trainer.args.max_steps = 3
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert trainer.state.global_step == 3
    card = (tmp_path / "README.md").read_text()
    assert "absolute-zero" in card and "2505.03335" in card


def test_old_and_ref_logps_for_both_roles(tmp_path):
    # num_iterations 2 needs old log-probs, beta > 0 reference log-probs: TRL computes both for each role's rows.
    path = tiny_checkpoint(tmp_path / "tiny")  # beta > 0: TRL loads the reference model from the model's path
    trainer = make(tmp_path, path, None, max_steps=2, num_iterations=2, beta=0.1)
    with BatchRecorder(trainer) as rec:
        trainer.train()
    batch = rec.batches[0]
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        assert batch[key].shape == batch["completion_ids"].shape
        assert batch[key][mask].lt(0).all()  # real log-probs on every trained token of both roles
    # Before any update the policy is the reference: identical log-probs, row by row, for solver and proposer rows.
    torch.testing.assert_close(batch["old_per_token_logps"][mask], batch["ref_per_token_logps"][mask])
    assert len(rec.batches) == 1 and "kl" in trainer.state.log_history[0]  # one generation for two iterations


def first_is_a(prompts, completions, completion_ids, **kwargs):
    return [float(completion_text(c).startswith("a")) for c in completions]


def good_or_bad(text):
    return None if "bad" in text else {"question": "Repeat: good"}


def scripted(text, k):
    """Proposals "good" (valid) and "bad" (invalid); responses "a" (reward 1) and "b" (0): signal in both roles."""
    return ("good", "bad")[k] if "Propose" in text else ("a", "b")[k]


def make_scripted(tmp_path, peft_config=None, **overrides):
    model, tokenizer = tiny_causal_lm()
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        **{
            **dict(
                per_device_train_batch_size=4,
                num_generations=2,
                num_questions_per_prompt=2,
                max_repropose_attempts=0,
                max_completion_length=6,
                max_question_length=6,
                learning_rate=1e-2,
                max_steps=1,
            ),
            **overrides,
        },
    )
    return AbsoluteZeroTrainer(
        model,
        [first_is_a],
        args=args,
        train_dataset=dataset(),
        processing_class=tokenizer,
        parse_question=good_or_bad,
        peft_config=peft_config,
    )


def test_proposer_loss_weight_scales_the_proposer_rows(tmp_path):
    losses = {}
    for weight in (0.0, 1.0):
        trainer = make_scripted(tmp_path / str(weight), proposer_rows="all", proposer_loss_weight=weight)
        with ScriptedGeneration(trainer, scripted), BatchRecorder(trainer) as rec:
            trainer.train()
        batch = rec.batches[0]
        proposer = batch["row_kind"] == 1
        assert batch["advantages"][proposer].abs().gt(0.5).all()  # rewards [1, -1] in each group
        solver_only = {**batch, "advantages": batch["advantages"] * ~proposer}
        losses[weight] = [gradient(trainer, b) for b in (batch, solver_only)]
    torch.testing.assert_close(*losses[0.0])  # weight 0: proposer rows contribute nothing
    assert not torch.allclose(*losses[1.0], atol=1e-6)


def gradient(trainer, batch):
    """The loss gradient (the loss value is ~0 on-policy: only its gradient shows the rows' contribution)."""
    trainer.model.zero_grad()
    trainer._compute_loss(trainer.model, batch).backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


def test_vllm_server_mode(tmp_path):
    model, tokenizer = tiny_causal_lm()
    with LoopbackVLLMServer(model, tokenizer) as server, vllm_server_mode(server):
        trainer = make(
            tmp_path,
            model,
            tokenizer,
            max_steps=2,
            max_repropose_attempts=0,
            max_question_length=5,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server.base_url,
            vllm_importance_sampling_mode="token_truncate",
        )
        with BatchRecorder(trainer) as rec:
            trainer.train()

    # Per step: the proposer request (n = K, max_question_length), then the solver request (n = rollout_n).
    assert len(server.requests) == 4
    for proposer, solver, batch in zip(server.requests[::2], server.requests[1::2], rec.batches):
        assert proposer["body"]["n"] == 2 and proposer["body"]["max_tokens"] == 5
        assert len(proposer["body"]["prompt"]) == 2  # unique seed prompts
        assert solver["body"]["n"] == 2 and solver["body"]["max_tokens"] == 6
        assert len(solver["body"]["prompt"]) == 4  # one per valid question
        returned = [c["token_ids"] for c in solver["choices"]]
        proposals = [c["token_ids"] for c in proposer["choices"]]
        for row in range(4):  # solver rows are responses the server returned, with its log-probs
            ids = batch["completion_ids"][row, : int(batch["completion_mask"][row].sum())].tolist()
            assert ids in returned
            choice = solver["choices"][returned.index(ids)]
            torch.testing.assert_close(
                batch["sampling_per_token_logps"][row, : len(ids)], torch.tensor(choice["logprobs"]["token_logprobs"])
            )
        for row in (4, 5):
            assert batch["completion_ids"][row, : int(batch["completion_mask"][row].sum())].tolist() in proposals
    for log in trainer.state.log_history[:-1]:
        for key in ("sampling/importance_sampling_ratio/mean", "proposer/sampling/importance_sampling_ratio/mean"):
            assert abs(log[key] - 1) < 1e-3, key
