"""The held-out evaluation in vLLM server mode (`LoopbackVLLMServer`, TRL's real `VLLMGeneration` and client): the
requests carry the evaluation's settings (greedy: temperature 0, one sample; sampled: `eval_temperature`,
`eval_num_samples` as `n`, `seed`) and the lengths of each turn, and the server's scripted answers give the metrics
that `ScriptedGeneration` gives. The questions and scripts are tests/scripts/heldout_ranks.py's."""

import math
from pathlib import Path

import pytest

from trl_ext.testing import LoopbackVLLMServer, ScriptedGeneration, load_script, tiny_causal_lm, vllm_server_mode


scenario = load_script(Path(__file__).parents[1] / "scripts" / "heldout_ranks.py")


def numbers(metrics):
    return {key: value for key, value in metrics.items() if key != "eval_seconds"}


def assert_same(served, scripted):
    # vLLM mode adds RLCR's count of confidence prompts over the server's context
    assert served.keys() - scripted.keys() <= {"eval_generation/prompts_over_context"}
    assert served.get("eval_generation/prompts_over_context", 0) == 0
    for key, value in scripted.items():
        assert (math.isnan(value) and math.isnan(served[key])) or served[key] == pytest.approx(value), key


def evaluate_served(build, script):
    model, tokenizer = tiny_causal_lm()
    with LoopbackVLLMServer(model, tokenizer, script=script) as server, vllm_server_mode(server):
        trainer, _ = build(use_vllm=True, vllm_mode="server", vllm_server_base_url=server.base_url)
        temperature = trainer.vllm_generation.temperature
        metrics = trainer.heldout_evaluate()  # the held-out evaluation's requests alone (no TRL evaluation loop)
    assert trainer.vllm_generation.temperature == temperature  # the training settings are back
    return trainer, metrics, [request["body"] for request in server.requests]


def evaluate_scripted(build):
    trainer, script = build()
    with ScriptedGeneration(trainer, script):
        return trainer.heldout_evaluate()


def test_rlcr_greedy_requests_and_metrics():
    _, served, requests = evaluate_served(scenario.rlcr_trainer, scenario.rlcr_script)
    # one process, five questions in chunks of 2, 2, 1: per chunk the answers, then a confidence turn per answer
    assert [len(body["prompt"]) for body in requests] == [2, 2, 2, 2, 1, 1]
    assert all(body["temperature"] == 0 and body["n"] == 1 and "seed" not in body for body in requests)
    assert [body["max_tokens"] for body in requests] == [12, 16] * 3
    assert_same(numbers(served), numbers(evaluate_scripted(scenario.rlcr_trainer)))
    assert served["eval_answer/accuracy"] == pytest.approx(0.5)


def test_replay_sampled_requests_and_metrics():
    trainer, served, requests = evaluate_served(scenario.replay_trainer, scenario.replay_script)
    # TRL sends each distinct prompt once with n samples
    assert [len(body["prompt"]) for body in requests] == [2, 2, 1]
    assert all(
        body["temperature"] == 1.0 and body["n"] == 2 and body["seed"] == trainer.args.seed for body in requests
    )
    assert all(body["max_tokens"] == 8 for body in requests)
    assert_same(numbers(served), numbers(evaluate_scripted(scenario.replay_trainer)))
    assert served["eval_mean@2"] == pytest.approx(0.5) and served["eval_pass@2"] == pytest.approx(1.0)
