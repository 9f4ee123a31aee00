"""The confidence-turn probe (benchmarks/rlcr_probe.py): the features it reads from a left-padded batch are those of
each conversation alone (hidden state at the confidence turn's last prompt token, the greedy answer's probability),
and the probe's regularisation is chosen on the tune split, never on the report split."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trl_ext.core.turns import follow_up_turn
from trl_ext.data.graded_arithmetic import graded_arithmetic
from trl_ext.evaluation.greedy import greedy_completions
from trl_ext.rewards.verify import verify_answer
from trl_ext.testing import cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
probe_bench = pytest.importorskip("rlcr_probe")


def test_features_of_a_padded_batch_are_each_conversations_own(tmp_path):
    model, tokenizer = tiny_causal_lm(initializer_range=0.5)  # log-probs that depend on position and context
    model.eval()
    rows = graded_arithmetic(5, seed=0)  # levels 1-5: prompts of different lengths, so the batch is padded
    args = cpu_test_args(tmp_path, RLCRMultiTurnConfig, max_completion_length=6, max_confidence_length=4)
    data = probe_bench.features(model, tokenizer, rows, args, verify_answer, (1, 2), batch_size=5, stated=True)

    eos = tokenizer.eos_token_id
    turn = follow_up_turn(tokenizer, args.confidence_prompt, [eos])
    prompts = turn.first_turn_ids(tokenizer, rows["prompt"])
    assert len({len(p) for p in prompts}) > 1
    for i, prompt in enumerate(prompts):
        (answer,) = greedy_completions(model, tokenizer, [prompt], args.max_completion_length)
        ids = turn.prompt_ids(prompt, answer, [eos])
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        logprobs = torch.log_softmax(alone.logits[0], -1)
        expected = np.exp(np.mean([logprobs[len(prompt) + j - 1, t].item() for j, t in enumerate(answer)]))
        assert data["answer_prob"][i] == pytest.approx(expected, rel=1e-4)
        for layer in (1, 2):
            np.testing.assert_allclose(data[f"layer{layer}"][i], alone.hidden_states[layer][0, -1].numpy(), atol=1e-4)
    assert data["level"] == [1, 2, 3, 4, 5] and len(data["stated"]) == len(data["correct"]) == 5


def test_probe_chooses_its_regularisation_on_the_tune_split():
    rng = np.random.default_rng(0)

    def split(n, signal):
        correct = rng.integers(0, 2, n)
        levels = rng.integers(1, 3, n)
        x = rng.normal(size=(n, 4))
        x[:, 0] += signal * correct  # within a level, feature 0 separates right from wrong
        return {"layer1": list(x), "correct": correct.tolist(), "level": levels.tolist()}

    data = {"fit": split(300, 2.0), "tune": split(200, 2.0), "report": split(200, 0.0)}
    result = probe_bench.probe(data, "layer1", seed=0)
    assert result["C"] == max(result["tune_auroc_within_levels"], key=result["tune_auroc_within_levels"].get)
    assert min(result["tune_auroc_within_levels"].values()) > 0.8
    # the report split carries no signal: the probe must not have seen it
    low, high = result["report"]["intervals"]["auroc_within_groups"]
    assert low < 0.5 < high and len(result["scores"]) == 200


def test_mean_over_tenths_weighs_each_stated_value_by_its_probability():
    model, tokenizer = tiny_causal_lm(initializer_range=0.5)
    model.eval()
    turn2 = [tokenizer.encode(text, add_special_tokens=False) for text in ("What is 2+3?", "Say 7 * 6 = 42 ok")]
    means = probe_bench.expected_tenths(model, tokenizer, turn2, "confidence")

    for prompt, mean in zip(turn2, means):
        logps = []
        for k in range(11):  # every candidate in full, one forward each
            ids = prompt + tokenizer.encode(f"<confidence>{k / 10:.1f}", add_special_tokens=False)
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
            logps.append(sum(lp[j - 1, ids[j]].item() for j in range(len(prompt), len(ids))))
        weights = np.exp(np.array(logps) - max(logps))
        assert mean == pytest.approx(float(weights @ np.arange(11) / 10 / weights.sum()), rel=1e-4)
    assert means[0] != pytest.approx(means[1], abs=1e-3)  # the prompt matters
