"""Plain GRPOTrainer in vLLM server mode, through TRL's real VLLMGeneration/VLLMClient over HTTP."""

import pytest
import requests
import torch
from datasets import Dataset
from trl import GRPOTrainer

from trl_ext.testing import BatchRecorder, LoopbackVLLMServer, cpu_test_args, tiny_causal_lm, vllm_server_mode


def reward_len(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


@pytest.fixture
def model_and_tokenizer():
    return tiny_causal_lm(seed=0)


def test_server_speaks_the_completions_api(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompt = tokenizer.encode("hello there", add_special_tokens=False)
    with LoopbackVLLMServer(model, tokenizer) as server:
        assert requests.get(f"{server.base_url}/health").status_code == 200
        assert requests.get(f"{server.base_url}/v1/models").json()["data"][0]["id"] == "loopback-model"
        body = {
            "prompt": [prompt, prompt[:1]],
            "n": 3,
            "max_tokens": 5,
            "logprobs": 0,
            "temperature": 1.0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        choices = requests.post(f"{server.base_url}/v1/completions", json=body).json()["choices"]
        assert len(choices) == 6  # prompt-major: n choices per prompt
        assert [c["prompt_token_ids"] for c in choices] == [prompt] * 3 + [prompt[:1]] * 3
        for c in choices:
            assert 1 <= len(c["token_ids"]) <= 5
            assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
            assert all(lp <= 0 for lp in c["logprobs"]["token_logprobs"])
        bad = requests.post(f"{server.base_url}/v1/completions", json={"prompt": ["text prompt"]})
        assert bad.status_code == 400 and "token-id prompts" in bad.json()["error"]


@pytest.mark.slow
def test_grpo_trains_two_steps_through_the_vllm_server(tmp_path, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say {i}"}]} for i in range(8)])
    with LoopbackVLLMServer(model, tokenizer) as server, vllm_server_mode(server):
        args = cpu_test_args(
            tmp_path,
            max_steps=2,
            learning_rate=5e-2,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server.base_url,
            vllm_importance_sampling_mode="token_truncate",
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward_len, args=args, train_dataset=dataset, processing_class=tokenizer
        )
        with BatchRecorder(trainer) as rec:
            trainer.train()

    # One HTTP generation request per generation batch: 2 unique prompts x n=4, as TRL de-duplicates prompts.
    assert len(server.requests) == 2
    for request, batch in zip(server.requests, rec.batches):
        assert request["body"]["n"] == 4 and len(request["body"]["prompt"]) == 2
        assert request["body"]["return_token_ids"] and request["body"]["return_tokens_as_token_ids"]
        for row, choice in enumerate(request["choices"]):
            n = len(choice["token_ids"])
            assert batch["completion_ids"][row, :n].tolist() == choice["token_ids"]
            assert int(batch["completion_mask"][row].sum()) == n
            torch.testing.assert_close(
                batch["sampling_per_token_logps"][row, :n], torch.tensor(choice["logprobs"]["token_logprobs"])
            )

    # Weights reached the server before each generation (step 0 and step 1) over the patched NCCL channel ...
    assert server.weight_updates == 2
    # ... so the sampler's log-probs come from the same weights as the trainer's: TRL's IS ratio is ~1 at both steps,
    # although a learning rate of 5e-2 moves the policy far between the steps.
    ratios = [
        log["sampling/importance_sampling_ratio/mean"]
        for log in trainer.state.log_history
        if "sampling/importance_sampling_ratio/mean" in log
    ]
    assert len(ratios) == 2 and all(abs(r - 1) < 1e-3 for r in ratios), ratios
    diffs = [
        log["sampling/sampling_logp_difference/max"]
        for log in trainer.state.log_history
        if "sampling/sampling_logp_difference/max" in log
    ]
    assert all(d < 1e-3 for d in diffs), diffs
    # and the policy did move: the server model (synced at step 1) differs from the initial weights
    assert any(not torch.equal(p, q) for p, q in zip(server.model.parameters(), model_and_tokenizer[0].parameters()))


def test_server_honours_seed_stop_eos_ids_and_context(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompt = tokenizer.encode("hello there", add_special_tokens=False)
    body = {"prompt": [prompt], "n": 1, "max_tokens": 8, "logprobs": 0, "temperature": 1.0, "seed": 7}

    def choices(server, **fields):
        reply = requests.post(f"{server.base_url}/v1/completions", json={**body, **fields})
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"]

    with LoopbackVLLMServer(model, tokenizer) as server:
        first = choices(server)[0]
        assert choices(server)[0]["token_ids"] == first["token_ids"]  # a seed: the same sample, request after request
        pair = choices(server, n=2, max_tokens=8)
        assert pair[0]["token_ids"] != pair[1]["token_ids"]  # ... but n samples of one request differ
        ids = first["token_ids"]
        cut = next(k for k in range(1, len(ids)) if tokenizer.decode(ids[:k], skip_special_tokens=True).strip())
        stop = tokenizer.decode(ids[:cut], skip_special_tokens=True)
        stopped = choices(server, stop=[stop])[0]
        assert stopped["token_ids"] == ids[:cut] and stopped["finish_reason"] == "stop"
        assert server.requests[-1]["body"]["stop"] == [stop]
        too_long = requests.post(f"{server.base_url}/v1/completions", json={**body, "max_tokens": 1024})
        assert too_long.status_code == 400 and "maximum context length is 1024 tokens" in too_long.json()["error"]
        assert (
            requests.get(f"{server.base_url}/server_info").json()["vllm_config"]["model_config"]["max_model_len"]
            == 1024
        )

    model.generation_config.eos_token_id = [tokenizer.eos_token_id, ids[0]]  # a second EOS id, as chat models have
    with LoopbackVLLMServer(model, tokenizer) as server:
        assert choices(server)[0]["token_ids"] == ids[:1] and choices(server)[0]["finish_reason"] == "stop"


def test_perturbed_server_weights_move_the_importance_sampling_ratio_off_one(tmp_path, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say {i}"}]} for i in range(8)])
    with LoopbackVLLMServer(model, tokenizer, perturb=0.05) as server, vllm_server_mode(server):
        args = cpu_test_args(
            tmp_path,
            max_steps=1,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server.base_url,
            vllm_importance_sampling_mode="token_truncate",
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward_len, args=args, train_dataset=dataset, processing_class=tokenizer
        )
        trainer.train()
    log = trainer.state.log_history[0]
    ratios = (log["sampling/importance_sampling_ratio/min"], log["sampling/importance_sampling_ratio/max"])
    assert ratios[0] < 0.99 and ratios[1] > 1.01, ratios  # the unperturbed server stays within 1e-3 of 1
    assert log["sampling/sampling_logp_difference/max"] > 1e-2
