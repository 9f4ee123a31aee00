"""`completion_probabilities`: the geometric-mean probability of each completion's tokens, computed in one left-padded
batch, equals the one of each prompt and completion scored alone."""

import math

import pytest
import torch

from trl_ext.evaluation.greedy import completion_probabilities
from trl_ext.testing import tiny_causal_lm


def test_each_completion_scored_in_a_padded_batch_as_alone():
    model, tokenizer = tiny_causal_lm(initializer_range=0.5)  # log-probs that depend on the context
    model.eval()
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("What is 2+3?", "Say hi", "A longer question?")]
    completions = [tokenizer.encode(t, add_special_tokens=False) for t in ("5", "hello there", "")]
    got = completion_probabilities(model, tokenizer, prompts, completions)

    for prompt, completion, value in zip(prompts, completions, got):
        if not completion:
            assert value == 0.0
            continue
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([prompt + completion])).logits[0], -1)
        picked = [logprobs[len(prompt) + j - 1, t].item() for j, t in enumerate(completion)]
        assert value == pytest.approx(math.exp(sum(picked) / len(picked)), rel=1e-4)
    assert 0 < got[0] < 1 and got[0] != pytest.approx(got[1])
