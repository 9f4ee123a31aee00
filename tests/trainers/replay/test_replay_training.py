"""ReplayGRPOTrainer end to end on a tiny model: real generation, checkpoints, vLLM server mode."""

import math

import pytest
import torch
from datasets import Dataset

from trl_ext.testing import BatchRecorder, LoopbackVLLMServer, cpu_test_args, tiny_causal_lm, vllm_server_mode
from trl_ext.trainers import ReplayGRPOConfig, ReplayGRPOTrainer
from trl_ext.trainers.seams.trainer_state import CheckpointStateError, load_state


def coin(completions, **kwargs):
    """Success on about half of a random model's completions, decided by the text itself."""
    return [float(bool(c[0]["content"]) and ord(c[0]["content"][0]) % 2 == 0) for c in completions]


def dataset(n=6):
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Say {i}"}], "task_id": f"t{i}"} for i in range(n)]
    )


def args_for(tmp_path, **overrides):
    defaults = dict(
        max_steps=4,
        replay_start_ratio=0.0,
        learning_rate=1e-2,
        max_completion_length=6,
        experience_lbound=0,
        temperature=1.0,
    )
    return cpu_test_args(tmp_path, ReplayGRPOConfig, **{**defaults, **overrides})


def replay_logs(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


@pytest.mark.slow
def test_real_training_replays_and_checkpoints_the_buffer(tmp_path):
    model, tokenizer = tiny_causal_lm(seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = ReplayGRPOTrainer(
        model=model,
        reward_funcs=coin,
        args=args_for(tmp_path, save_strategy="steps", save_steps=2),
        train_dataset=dataset(),
        processing_class=tokenizer,
    )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(math.isfinite(float(x)) for x in losses)
    assert sum(replay_logs(trainer, "replay/replay_groups")) > 0
    ratios = replay_logs(trainer, "replay/importance_ratio_mean")
    assert ratios and all(math.isfinite(r) and r > 0 for r in ratios)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    for step in (2, 4):
        state = load_state(tmp_path / f"checkpoint-{step}", "replay_state", "ReplayGRPOTrainer")
        assert state["replay_active"] is True
        assert set(state["experience"]["task2trajectories"]) <= {f"t{i}" for i in range(6)}
    # The buffer stores ~8 bytes per completion token (int32 id + float32 log-prob) plus prompts once per task.
    exp = trainer.experience
    completion_tokens = sum(t.num_tokens for ts in exp.task2trajectories.values() for t in ts)
    assert exp.nbytes <= 8 * completion_tokens + 4 * sum(p.numel() for p in exp.task_prompt_ids.values())


def test_resume_needs_the_replay_state(tmp_path):
    model, tokenizer = tiny_causal_lm()
    trainer = ReplayGRPOTrainer(
        model=model,
        reward_funcs=coin,
        args=args_for(tmp_path, max_steps=1, save_strategy="steps", save_steps=1),
        train_dataset=dataset(),
        processing_class=tokenizer,
    )
    trainer.train()
    (tmp_path / "checkpoint-1" / "replay_state.json").unlink()
    resumed = ReplayGRPOTrainer(
        model=model,
        reward_funcs=coin,
        args=args_for(tmp_path, max_steps=2),
        train_dataset=dataset(),
        processing_class=tokenizer,
    )
    with pytest.raises(CheckpointStateError, match=r"checkpoint-1/replay_state\.json is missing.*Resume from"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))


def test_vllm_server_mode_generates_only_fresh_rows(tmp_path):
    model, tokenizer = tiny_causal_lm(seed=1)
    with LoopbackVLLMServer(model, tokenizer) as server, vllm_server_mode(server):
        args = args_for(
            tmp_path,
            max_steps=4,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server.base_url,
            vllm_importance_sampling_mode="token_truncate",
        )
        trainer = ReplayGRPOTrainer(
            model=model, reward_funcs=coin, args=args, train_dataset=dataset(), processing_class=tokenizer
        )
        with BatchRecorder(trainer) as rec:
            trainer.train()
    replayed = [(req, batch) for req, batch in zip(server.requests, rec.batches) if "exp_mask" in batch]
    assert replayed, "some generation batch replayed"
    for request, batch in replayed:
        stored = batch["exp_mask"].any(-1)
        # One sample per fresh row; the stored rows cost the server nothing.
        assert request["body"]["n"] == 1 and len(request["body"]["prompt"]) == int((~stored).sum())
        fresh_rows = torch.nonzero(~stored).flatten().tolist()
        for choice, row in zip(request["choices"], fresh_rows, strict=True):
            assert batch["completion_ids"][row, : len(choice["token_ids"])].tolist() == choice["token_ids"]
        # TRL's sampler correction stays on the fresh rows; the replayed rows get none (ratio exactly 1).
        ratio = batch["importance_sampling_ratio"]
        assert torch.all(ratio[stored] == 1.0)
    plain = [(req, batch) for req, batch in zip(server.requests, rec.batches) if "exp_mask" not in batch]
    assert all(req["body"]["n"] == 4 for req, _ in plain)
    assert all(math.isfinite(float(h["loss"])) for h in trainer.state.log_history if "loss" in h)


class SkewedSampler(LoopbackVLLMServer):
    """Reports log-probs 5 nats per token below its model's for completions with a "!": TRL's sampler/trainer
    ratio of those rows leaves its bounds."""

    def _logprobs(self, prompt_ids, completion_ids, temperature):
        logps = super()._logprobs(prompt_ids, completion_ids, temperature)
        return [lp - 5.0 for lp in logps] if "!" in self.tokenizer.decode(completion_ids) else logps


def test_vllm_rows_the_sampler_correction_masks_are_not_replayed(tmp_path):
    """TRL's `sequence_mask` correction (the default) zeroes the "ok!" rows: successes that train at weight 0. They
    are not stored (a replayed row trains at full weight, ratio 1); the "ok" successes are. The logged sampler ratio
    covers the fresh rows only: in replay batches every fresh row is an "ok!" (one sample per request), so 0."""
    model, tokenizer = tiny_causal_lm(seed=1)
    offered = []

    def ok(completions, **kwargs):
        return [float(c[0]["content"].startswith("ok")) for c in completions]

    script = lambda text, j: ["ok!", "ok", "no", "no"][j]  # noqa: E731
    with SkewedSampler(model, tokenizer, script=script) as server, vllm_server_mode(server):
        args = args_for(
            tmp_path,
            max_steps=3,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server.base_url,
            per_device_train_batch_size=8,
        )
        trainer = ReplayGRPOTrainer(
            model=model, reward_funcs=ok, args=args, train_dataset=dataset(), processing_class=tokenizer
        )
        update = trainer.experience.update
        trainer.experience.update = lambda outcomes, step: (
            offered.extend(tokenizer.decode(t.completion_ids) for o in outcomes for t in o.candidates),
            update(outcomes, step),
        )[1]
        with BatchRecorder(trainer) as rec:
            trainer.train()
    assert offered and all(text.startswith("ok") and "!" not in text for text in offered)
    replayed = ["exp_mask" in batch for batch in rec.batches]
    assert replayed[0] is False and any(replayed)
    for batch, log in zip(rec.batches, [h for h in trainer.state.log_history if "loss" in h], strict=True):
        ratio = batch["importance_sampling_ratio"].flatten()
        assert (ratio == 0).any()  # the "ok!" rows were masked
        if "exp_mask" in batch:
            stored = batch["exp_mask"].any(-1)
            assert torch.all(ratio[stored] == 1.0) and torch.all(ratio[~stored] == 0.0)
            for name in ("min", "mean", "max"):
                assert log[f"sampling/importance_sampling_ratio/{name}"] == 0.0, name
        else:
            assert log["sampling/importance_sampling_ratio/max"] > 0.5  # the fresh "ok" and "no" rows


def test_with_trl_old_log_probs_collection_reuses_them(tmp_path):
    # num_iterations=2: TRL computes old log-probs itself; collection reuses that forward (entropy switched on) and
    # on-policy rows keep TRL's values next to the recorded ones.
    model, tokenizer = tiny_causal_lm(seed=1)
    trainer = ReplayGRPOTrainer(
        model=model,
        reward_funcs=coin,
        args=args_for(tmp_path, num_iterations=2, max_steps=6),
        train_dataset=dataset(),
        processing_class=tokenizer,
    )
    with BatchRecorder(trainer) as rec:
        trainer.train()
    replayed = [b for b in rec.batches if "exp_mask" in b]
    assert replayed and all(b["replay_has_old_logps"].item() for b in replayed)
    assert all("replay_collect" not in b for b in rec.batches)  # nothing waited for a loss forward
    for batch in replayed:
        fresh = ~batch["exp_mask"].bool().any(-1)
        assert torch.all(batch["old_per_token_logps"][fresh].abs().sum(-1) > 0)  # TRL's values, not placeholders
    assert trainer.experience.num_trajectories > 0
    assert all(math.isfinite(float(h["loss"])) for h in trainer.state.log_history if "loss" in h)
