"""RLCRMultiTurnTrainer end to end on a tiny model: real generation, training, checkpoints, vLLM server mode."""

import math

import pytest
import torch
from datasets import Dataset

from trl_ext.testing import (
    BatchRecorder,
    LoopbackVLLMServer,
    ScriptedGeneration,
    changed_parameters,
    cpu_test_args,
    snapshot_parameters,
    tiny_causal_lm,
    vllm_server_mode,
)
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


def dataset(n=8):
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "solution": str(2 * i)} for i in range(n)]
    )


def args_for(tmp_path, **overrides):
    defaults = dict(
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        max_completion_length=12,
        max_confidence_length=8,
        learning_rate=1e-2,
    )
    return cpu_test_args(tmp_path, RLCRMultiTurnConfig, **{**defaults, **overrides})


def half_right(prompt_text, k):
    """Scripted policy with signal in both turns (a random tiny model never closes a tag)."""
    if "confidence" in prompt_text.split("<|im_start|>user")[-1]:
        return ["<confidence>0.9</confidence>", "<confidence>0.2</confidence>"][k % 2]
    gold = int(prompt_text.split("What is ")[1].split("+")[0]) * 2
    return f"<think>sum</think><answer>{gold if k % 2 == 0 else gold + 1}</answer>"


@pytest.mark.slow
def test_real_generation_trains_and_resumes(tmp_path):
    model, tokenizer = tiny_causal_lm()
    before = snapshot_parameters(model)
    # constant LR: the resumed step must not inherit a schedule that already decayed to 0 at max_steps=2
    args = args_for(tmp_path, max_steps=2, save_strategy="steps", save_steps=2, lr_scheduler_type="constant")
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset(), processing_class=tokenizer)
    with BatchRecorder(trainer) as rec:
        trainer.train()  # real sampling from the tiny model: tags are rare, the format-failure path is exercised
    for log in trainer.state.log_history[:-1]:
        assert math.isfinite(log["loss"]) and "answer/accuracy" in log and "confidence/parse_fail_rate" in log
    for batch in rec.batches:
        assert batch["row_kind"].tolist() == [0] * 4 + [1] * 8
        assert all(torch.isfinite(v).all() for v in batch.values() if v.is_floating_point())

    # Scripted steps give non-zero advantages, so the weights must move.
    with ScriptedGeneration(trainer, half_right):
        trainer.args.max_steps = 3
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert trainer.state.global_step == 3
    assert changed_parameters(before, trainer.model)

    # The checkpoint holds the model card with the trainer's tags and citation.
    card = (tmp_path / "README.md").read_text()
    assert "rlcr" in card and "2507.16806" in card


def test_vllm_server_mode(tmp_path):
    model, tokenizer = tiny_causal_lm()
    with LoopbackVLLMServer(model, tokenizer) as server, vllm_server_mode(server):
        args = args_for(
            tmp_path,
            max_steps=2,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server.base_url,
            vllm_importance_sampling_mode="token_truncate",
        )
        trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset(), processing_class=tokenizer)
        with BatchRecorder(trainer) as rec:
            trainer.train()

    # Two HTTP generation requests per step: answers (n = G_a, max_completion_length) then confidences.
    assert len(server.requests) == 4
    for answers, confidences, batch in zip(server.requests[::2], server.requests[1::2], rec.batches):
        assert answers["body"]["n"] == 2 and answers["body"]["max_tokens"] == 12
        assert len(answers["body"]["prompt"]) == 2  # unique prompts
        assert confidences["body"]["n"] == 2 and confidences["body"]["max_tokens"] == 8
        assert len(confidences["body"]["prompt"]) == 4  # one prompt per answer
        for choice, turn2 in zip(answers["choices"], confidences["body"]["prompt"]):
            context = choice["prompt_token_ids"] + choice["token_ids"]
            assert turn2[: len(context)] == context  # built on the sampled tokens
        returned = [c["token_ids"] for c in answers["choices"] + confidences["choices"]]
        for row, ids in enumerate(returned):
            assert batch["completion_ids"][row, : len(ids)].tolist() == ids
            logps = (answers["choices"] + confidences["choices"])[row]["logprobs"]["token_logprobs"]
            torch.testing.assert_close(batch["sampling_per_token_logps"][row, : len(ids)], torch.tensor(logps))
    logs = trainer.state.log_history[:-1]
    for key in ("sampling/importance_sampling_ratio/mean", "confidence/sampling/importance_sampling_ratio/mean"):
        assert all(abs(log[key] - 1) < 1e-3 for log in logs), key
