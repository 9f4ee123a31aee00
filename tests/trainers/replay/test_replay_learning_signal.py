"""Replay reaches a planted rule sooner than GRPO when successes are rare, on a tiny model, over 5 seeds.

The rule: answer with the token "7". Sampling is restricted to 48 one-character tokens (digits and letters), so a tiny
random model hits it about once in 48 samples, and with 8 samples a step most steps have no success: a GRPO group
without one has zero advantage, and the update learns nothing from it. Replay stores each rare success with the
log-probs recorded when it was sampled and puts it back, importance-weighted, into later groups of its prompt beside
fresh failures, where its advantage is positive. The baseline is the same trainer with replay never starting (the
plain GRPO update, with the same buffer bookkeeping), from the same weights and seed: both runs sample the same
first batch.

Training accuracy is exact, not sampled: after every step, the probability that the sampler (the 48 tokens at
temperature 1) answers "7", averaged over the 16 training prompts. It has no sampling noise, and it weights every
prompt alike whichever prompts replay chose to train on. The test fails if replay does not reach the threshold in
fewer steps than GRPO on the median and on most seeds.
"""

import statistics
import string

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from trl_ext.testing import cpu_test_args, tiny_causal_lm
from trl_ext.trainers import ReplayGRPOConfig, ReplayGRPOTrainer


SEEDS = range(5)
STEPS = 40
THRESHOLD = 0.3
ALLOWED = (string.digits + string.ascii_letters)[:48]  # one token each in SmolLM2's vocabulary
TARGET = "7"
NUM_PROMPTS = 16


def rule(completions, **kwargs):
    return [float(c[0]["content"].strip() == TARGET) for c in completions]


def prompts():
    return [[{"role": "user", "content": ALLOWED[i] * 12 + f" {i}"}] for i in range(NUM_PROMPTS)]


class ExactAccuracy(TrainerCallback):
    """After every step: the sampler's probability of the rule's token, averaged over the training prompts."""

    def __init__(self, model, tokenizer):
        self.model = model
        self.allowed = [tokenizer.convert_tokens_to_ids(c) for c in ALLOWED]
        self.target = ALLOWED.index(TARGET)
        rows = [
            tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
            for p in prompts()
        ]
        # One forward over all prompts, right-padded: a causal model's last real position never sees the padding.
        self.batch = torch.full((len(rows), max(map(len, rows))), tokenizer.pad_token_id)
        for i, ids in enumerate(rows):
            self.batch[i, : len(ids)] = torch.tensor(ids)
        self.last = torch.tensor([len(ids) - 1 for ids in rows])
        self.curve = []

    @torch.no_grad()
    def accuracy(self) -> float:
        hidden = self.model.model(self.batch).last_hidden_state[torch.arange(len(self.last)), self.last]
        logits = hidden @ self.model.get_output_embeddings().weight[self.allowed].T  # the 48 tokens' logits
        return torch.softmax(logits, -1)[:, self.target].mean().item()

    def on_step_end(self, args, state, control, **kwargs):
        self.curve.append(self.accuracy())


def run(tmp_path, seed: int, replay: bool):
    model, tokenizer = tiny_causal_lm(seed=seed, hidden_size=32)
    keep = {tokenizer.convert_tokens_to_ids(c) for c in ALLOWED}
    args = cpu_test_args(
        tmp_path / f"{seed}-{replay}",
        ReplayGRPOConfig,
        max_steps=STEPS,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        per_device_train_batch_size=8,  # 2 prompts x 4 samples a step
        num_generations=4,
        max_completion_length=1,
        temperature=1.0,
        beta=0.0,
        generation_kwargs={"suppress_tokens": [t for t in range(len(tokenizer)) if t not in keep]},
        replay_start_ratio=0.0 if replay else 1.0,
        seed=seed,
    )
    rows = [{"prompt": p, "task_id": f"t{i}"} for i, p in enumerate(prompts())] * 32
    accuracy = ExactAccuracy(model, tokenizer)
    trainer = ReplayGRPOTrainer(
        model=model,
        reward_funcs=rule,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[accuracy],
    )
    initial = accuracy.accuracy()
    trainer.train()
    replay_groups = sum(log.get("replay/replay_groups", 0) for log in trainer.state.log_history)
    return initial, accuracy.curve, replay_groups


def steps_to_threshold(curve) -> int:
    """First step whose accuracy reaches the threshold; STEPS + 1 when none does."""
    return next((step for step, value in enumerate(curve, 1) if value >= THRESHOLD), STEPS + 1)


@pytest.fixture
def one_thread():
    """A model this small gains nothing from threads; one thread keeps the order of its sums whatever the core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_replay_reaches_a_sparse_rule_in_fewer_steps_than_grpo(tmp_path, one_thread):
    steps = {True: [], False: []}
    for seed in SEEDS:
        for replay in (False, True):
            initial, curve, replay_groups = run(tmp_path, seed, replay)
            assert initial < 0.05, initial  # successes are rare at the start: the setting replay is for
            assert len(curve) == STEPS
            assert (replay_groups > 0) == replay, replay_groups  # replay ran in one arm only
            steps[replay].append(steps_to_threshold(curve))
    report = f"steps to {THRESHOLD} (>{STEPS}: never), replay {steps[True]}, GRPO {steps[False]}"
    print(report)  # the measurement, in the log (`pytest -s`)
    assert statistics.median(steps[True]) < statistics.median(steps[False]), report
    wins = sum(r < g for r, g in zip(steps[True], steps[False], strict=True))
    assert wins > len(SEEDS) / 2, report
