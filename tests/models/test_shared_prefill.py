"""Shared prefill (trl_ext/models/shared_prefill.py): the completions of `model.generate` on the left-padded batch,
with the shared prompt positions computed once; plain `generate` where the layout does not apply; the trainers'
transformers generation goes through it unless `shared_prefill=False`."""

import functools

import pytest
import torch
from datasets import Dataset

from trl_ext.evaluation.greedy import left_padded
from trl_ext.models import shared_prefill
from trl_ext.models.shared_prefill import shared_prefill_generate
from trl_ext.testing import cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


PREFIX = [5, 6, 7, 8, 9]
# repeated prompts, a shared prefix, rests of 1 to 4 tokens
PROMPTS = [PREFIX + [10, 11], PREFIX + [10, 11], PREFIX + [12], PREFIX + [12, 13, 14, 15], PREFIX + [10, 11]]


@pytest.fixture(scope="module")
def model_and_pad():
    # float64 and large weights: logits depend strongly on context and position, and rounding cannot flip a token
    model, tokenizer = tiny_causal_lm(seed=1, hidden_size=32, dtype=torch.float64, initializer_range=0.5)
    return model.eval(), tokenizer.pad_token_id


def forwards(model):
    """Record the `(rows, columns)` of every forward of `model` and whether it carried a cache."""
    calls = []
    original = model.forward

    @functools.wraps(original)  # generate reads the forward's signature
    def spy(*args, **kwargs):
        calls.append((tuple(kwargs["input_ids"].shape), kwargs.get("cache") is not None))
        return original(*args, **kwargs)

    model.forward = spy
    return calls


def both(model, pad, prompts, **kwargs):
    input_ids, attention_mask, _ = left_padded(prompts, pad, "cpu")
    return compare(model, pad, input_ids, attention_mask, **kwargs)


def compare(model, pad, input_ids, attention_mask, **kwargs):
    """Plain `generate` and the shared prefill on the same seed, and the forwards of the latter."""
    kwargs = dict(max_new_tokens=6, pad_token_id=pad, **kwargs)
    torch.manual_seed(0)
    plain = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    calls = forwards(model)
    torch.manual_seed(0)
    try:
        shared = shared_prefill_generate(model, model.generate, input_ids, attention_mask, **kwargs)
    finally:
        del model.forward
    return plain, shared, calls


@pytest.mark.parametrize("sampling", [dict(do_sample=False), dict(do_sample=True, temperature=1.0)])
def test_same_sequences_with_each_shared_position_prefilled_once(model_and_pad, sampling):
    model, pad = model_and_pad
    plain, shared, calls = both(model, pad, PROMPTS, **sampling)
    assert torch.equal(plain, shared)
    assert len(set(map(tuple, plain[:, 9:].tolist()))) > 1  # the rows differ, so a wrong row's cache would show
    # the prefix once (5 tokens), the 3 distinct rests but their last token (widest rest: 4 -> 3 columns), then
    # generate's prefill of each row's last token and 5 decoding steps
    assert calls[:3] == [((1, 5), True), ((3, 3), True), ((5, 1), True)]
    assert calls[3:] == [((5, 1), True)] * 5


def test_padding_beyond_the_longest_prompt(model_and_pad):
    # TRL pads to `pad_to_multiple_of`: columns of padding in every row
    model, pad = model_and_pad
    width = max(map(len, PROMPTS)) + 3
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in PROMPTS])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    plain, shared, calls = compare(model, pad, input_ids, attention_mask, do_sample=True)
    assert torch.equal(plain, shared)
    assert calls[:3] == [((1, 5), True), ((3, 6), True), ((5, 1), True)]


def test_repeated_prompts_without_a_shared_prefix(model_and_pad):
    model, pad = model_and_pad
    prompts = [[20, 21, 22], [30, 31], [20, 21, 22], [30, 31]]
    plain, shared, calls = both(model, pad, prompts, do_sample=True)
    assert torch.equal(plain, shared)
    assert calls[:2] == [((2, 2), True), ((4, 1), True)]  # the two prompts once, left-padded; no prefix forward


def test_rows_of_one_shared_prompt_and_its_last_token(model_and_pad):
    model, pad = model_and_pad
    prompts = [PREFIX] * 3  # everything but the last token is the prefix; no rest forward
    plain, shared, calls = both(model, pad, prompts, do_sample=True)
    assert torch.equal(plain, shared)
    assert calls[:2] == [((1, 4), True), ((3, 1), True)]


@pytest.mark.parametrize(
    "prompts, kwargs",
    [
        ([[20, 21], [30, 31, 32]], {}),  # nothing shared
        ([[7], [7], [8]], {}),  # repeated, but only the last token: nothing to prefill before generate's own
        (PROMPTS, dict(num_return_sequences=2, do_sample=True)),  # generate expands the rows itself
        (PROMPTS, dict(num_beams=2)),
        (PROMPTS, dict(no_repeat_ngram_size=2)),  # reads the prompt as a sequence: it would see the middle padding
    ],
)
def test_plain_generate_where_the_layout_does_not_apply(model_and_pad, prompts, kwargs):
    model, pad = model_and_pad
    plain, shared, calls = both(model, pad, prompts, **kwargs)
    assert torch.equal(plain, shared)
    assert calls[0][0][1] == max(len(p) for p in prompts)  # generate's own prefill, every prompt column


def test_not_left_padding_goes_to_generate(model_and_pad):
    model, _ = model_and_pad
    input_ids = torch.tensor([[5, 6, 7], [5, 6, 7]])
    attention_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # right padding: the layout would move tokens
    assert shared_prefill._plan(model, input_ids, attention_mask, {}) is None
    assert shared_prefill._plan(model, input_ids, None, {"pixel_values": torch.zeros(1)}) is None


def rlcr_trainer(tmp_path, model, tokenizer, **overrides):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 1+1?"}], "solution": "2"}] * 4)
    args = cpu_test_args(
        tmp_path, RLCRMultiTurnConfig, per_device_train_batch_size=4, num_generations=2, max_completion_length=6
    )
    for name, value in overrides.items():
        setattr(args, name, value)
    return RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


def test_trainer_generation_shares_prefill_unless_turned_off(tmp_path, monkeypatch):
    model, tokenizer = tiny_causal_lm(seed=1, hidden_size=32, dtype=torch.float64, initializer_range=0.5)
    calls = []

    def spy(model, generate, input_ids, attention_mask, **kwargs):
        # the rows, and whether the call takes the shared layout (TRL's generation config passes the checks)
        calls.append((input_ids.shape[0], shared_prefill._plan(model, input_ids, attention_mask, kwargs) is not None))
        return shared_prefill_generate(model, generate, input_ids, attention_mask, **kwargs)

    monkeypatch.setattr("trl_ext.trainers.seams.generation_backends.shared_prefill_generate", spy)
    rows = [[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 9], [5, 6, 9]]
    completions = {}
    for shared in (True, False):
        trainer = rlcr_trainer(tmp_path, model, tokenizer, shared_prefill=shared)
        torch.manual_seed(0)
        completions[shared], _ = trainer._generate_single_turn(rows, None, {}, 2)
        assert "generate" not in vars(trainer.accelerator.unwrap_model(trainer.model_wrapped))  # restored
    assert calls == [(4, True)]  # one call, with TRL's four rows, shared; none with shared_prefill=False
    assert completions[True] == completions[False]
    assert len({tuple(c) for c in completions[True]}) > 1
