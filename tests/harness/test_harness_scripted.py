"""Scripted generation on plain `trl.GRPOTrainer` gives exact, hand-computable batches."""

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from trl_ext.testing import BatchRecorder, ScriptedGeneration, cpu_test_args, tiny_causal_lm


# Per prompt, the completion of each sample index k within its group of 4.
SCRIPT = {
    "alpha": ["yes", "no", "no", "no"],  # rewards 1 0 0 0
    "beta": ["yes", "yes", "no", "no"],  # rewards 1 1 0 0
}


def reward_yes(completions, **kwargs):
    return [1.0 if c[0]["content"].strip() == "yes" else 0.0 for c in completions]


def script(prompt_text, k):
    key = "alpha" if "alpha" in prompt_text else "beta"
    return SCRIPT[key][k]


@pytest.fixture
def trainer(tmp_path):
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": word}]} for word in ["alpha", "beta"]])
    args = cpu_test_args(
        tmp_path, max_steps=1, per_device_train_batch_size=8, num_generations=4, shuffle_dataset=False
    )
    return GRPOTrainer(
        model=model, reward_funcs=reward_yes, args=args, train_dataset=dataset, processing_class=tokenizer
    )


def test_scripted_completions_give_exact_group_advantages(trainer):
    tokenizer = trainer.processing_class
    with ScriptedGeneration(trainer, script) as gen, BatchRecorder(trainer) as rec:
        trainer.train()

    assert len(gen.calls) == 1 and gen.calls[0].num_generations == 4
    (batch,) = rec.batches
    prompts = [tokenizer.decode(ids) for ids in gen.calls[0].prompt_ids]
    keys = ["alpha" if "alpha" in p else "beta" for p in prompts]
    assert keys == [keys[0]] * 4 + [keys[4]] * 4 and set(keys) == {"alpha", "beta"}  # groups are consecutive rows

    # The batch holds exactly the scripted tokens, each followed by EOS and right padding.
    for row, (key, k) in enumerate(zip(keys, [0, 1, 2, 3] * 2)):
        expected = tokenizer.encode(SCRIPT[key][k], add_special_tokens=False) + [tokenizer.eos_token_id]
        n = int(batch["completion_mask"][row].sum())
        assert batch["completion_ids"][row, :n].tolist() == expected

    # Hand-computed GRPO advantages, (r - mean) / (std + 1e-4) with the unbiased std of each group:
    # alpha [1,0,0,0]: mean 0.25, std 0.5;  beta [1,1,0,0]: mean 0.5, std sqrt(1/3).
    hand = {
        "alpha": [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001],
        "beta": [0.5 / (3**-0.5 + 1e-4)] * 2 + [-0.5 / (3**-0.5 + 1e-4)] * 2,
    }
    expected = torch.tensor(hand[keys[0]] + hand[keys[4]])
    torch.testing.assert_close(batch["advantages"], expected, rtol=0, atol=1e-6)


def test_scripted_generation_is_removed_on_exit(trainer):
    with ScriptedGeneration(trainer, script):
        assert trainer._generate_single_turn.__self__.__class__ is ScriptedGeneration
    assert trainer._generate_single_turn.__func__ is GRPOTrainer._generate_single_turn


def test_token_id_script_output_is_used_verbatim(trainer):
    """A list of ids (here a truncated completion, no EOS) reaches the batch unchanged."""
    truncated = trainer.processing_class.encode("no end", add_special_tokens=False)
    with ScriptedGeneration(trainer, lambda prompt, k: truncated), BatchRecorder(trainer) as rec:
        trainer.train()
    ids = rec.batches[0]["completion_ids"]
    assert ids.shape == (8, len(truncated)) and (ids == torch.tensor(truncated)).all()
