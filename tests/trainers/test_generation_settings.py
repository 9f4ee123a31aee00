"""Per-turn generation settings (docs/design.md#per-turn-generation-settings): each turn's `generation_kwargs` and
structured-outputs regex reach only that turn's requests at the loopback vLLM server; settings that would leak into
another turn or defeat a group are refused at config time, naming the field."""

import pytest
from datasets import Dataset

from trl_ext.testing import BatchRecorder, LoopbackVLLMServer, cpu_test_args, tiny_causal_lm, vllm_server_mode
from trl_ext.trainers import (
    AbsoluteZeroConfig,
    AbsoluteZeroTrainer,
    ReplayGRPOConfig,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)


def rlcr_dataset(n=4):
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "solution": str(2 * i)} for i in range(n)]
    )


def parity(prompts, completions, completion_ids, **kwargs):
    return [float(ids[0] % 2) if ids else 0.0 for ids in completion_ids]


def server_args(server):
    return dict(use_vllm=True, vllm_mode="server", vllm_server_base_url=server.base_url, max_steps=1)


def test_rlcr_answer_settings_stay_in_the_answer_turn(tmp_path):
    model, tokenizer = tiny_causal_lm()
    with LoopbackVLLMServer(model, tokenizer) as server, vllm_server_mode(server):
        args = cpu_test_args(
            tmp_path,
            RLCRMultiTurnConfig,
            per_device_train_batch_size=4,
            num_generations=2,
            num_generations_confidence=2,
            max_completion_length=12,
            max_confidence_length=8,
            generation_kwargs={"stop": ["</answer>"], "frequency_penalty": 0.5},
            vllm_structured_outputs_regex="<think>.*",
            confidence_generation_kwargs={"stop": ["</confidence>"]},
            **server_args(server),
        )
        RLCRMultiTurnTrainer(model=model, args=args, train_dataset=rlcr_dataset(), processing_class=tokenizer).train()

    answers, confidences = (request["body"] for request in server.requests)
    assert answers["stop"] == ["</answer>"] and answers["frequency_penalty"] == 0.5
    assert answers["structured_outputs"] == {"regex": "<think>.*"}
    assert answers["max_tokens"] == 12 and answers["n"] == 2
    assert confidences["stop"] == ["</confidence>"]
    assert "structured_outputs" not in confidences and "frequency_penalty" not in confidences
    assert confidences["max_tokens"] == 8 and confidences["n"] == 2
    assert args.generation_kwargs == {"stop": ["</answer>"], "frequency_penalty": 0.5}  # restored after each turn


def test_rlcr_transformers_generation_config_per_turn(tmp_path):
    model, tokenizer = tiny_causal_lm()
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        max_completion_length=12,
        max_confidence_length=8,
        generation_kwargs={"no_repeat_ngram_size": 3},
        confidence_generation_kwargs={"suppress_tokens": [5]},
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=rlcr_dataset(), processing_class=tokenizer)
    answer = trainer.generation_config
    assert answer.no_repeat_ngram_size == 3 and answer.suppress_tokens is None and answer.max_new_tokens == 12
    with trainer._confidence_turn([[1, 2]], "train"):
        turn = trainer.generation_config
        assert turn.suppress_tokens == [5] and turn.no_repeat_ngram_size is None and turn.max_new_tokens == 8
        assert (
            trainer.generation_kwargs["max_new_tokens"] == 8
            and "no_repeat_ngram_size" not in trainer.generation_kwargs
        )
    assert trainer.generation_config is answer and answer.max_new_tokens == 12
    assert trainer.generation_kwargs["no_repeat_ngram_size"] == 3 and trainer.generation_kwargs["max_new_tokens"] == 12


def test_absolute_zero_solver_settings_stay_with_the_solver(tmp_path):
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Propose task {i}"}]} for i in range(4)])
    with LoopbackVLLMServer(model, tokenizer) as server, vllm_server_mode(server):
        args = cpu_test_args(
            tmp_path,
            AbsoluteZeroConfig,
            per_device_train_batch_size=4,
            num_generations=2,
            num_questions_per_prompt=2,
            max_repropose_attempts=0,
            max_completion_length=6,
            max_question_length=5,
            generation_kwargs={"stop": ["."]},
            vllm_structured_outputs_regex="[0-9]+",
            proposer_generation_kwargs={"stop": ["?"], "presence_penalty": 0.1},
            **server_args(server),
        )
        AbsoluteZeroTrainer(
            model,
            [parity],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            parse_question=lambda text: {"question": f"Repeat: {text[:12]}"},
        ).train()

    proposer, solver = (request["body"] for request in server.requests)
    assert proposer["stop"] == ["?"] and proposer["presence_penalty"] == 0.1 and proposer["max_tokens"] == 5
    assert "structured_outputs" not in proposer
    assert solver["stop"] == ["."] and solver["structured_outputs"] == {"regex": "[0-9]+"}
    assert "presence_penalty" not in solver and solver["max_tokens"] == 6


@pytest.mark.parametrize(
    "config_cls, overrides, match",
    [
        # a length in the kwargs would override the turn's own length field (12 was sent where 8/5 were configured)
        (
            RLCRMultiTurnConfig,
            {"generation_kwargs": {"max_tokens": 12}},
            r"generation_kwargs\['max_tokens'\] would override max_completion_length",
        ),
        (
            RLCRMultiTurnConfig,
            {"confidence_generation_kwargs": {"max_tokens": 12}},
            r"confidence_generation_kwargs\['max_tokens'\] would override max_confidence_length",
        ),
        (
            AbsoluteZeroConfig,
            {"generation_kwargs": {"max_new_tokens": 12}},
            r"generation_kwargs\['max_new_tokens'\] would override max_completion_length",
        ),
        (
            AbsoluteZeroConfig,
            {"proposer_generation_kwargs": {"max_tokens": 12}},
            r"proposer_generation_kwargs\['max_tokens'\] would override max_question_length",
        ),
        # `n` would replace the group size the trainer requests
        (RLCRMultiTurnConfig, {"confidence_generation_kwargs": {"n": 3}}, r"confidence_generation_kwargs\['n'\]"),
        (ReplayGRPOConfig, {"generation_kwargs": {"n": 3}}, r"generation_kwargs\['n'\]"),
        # a seed makes rows sampled one per request identical
        (
            ReplayGRPOConfig,
            {"generation_kwargs": {"seed": 3}, "use_vllm": True, "vllm_mode": "server"},
            r"generation_kwargs\['seed'\]",
        ),
        (
            RLCRMultiTurnConfig,
            {"generation_kwargs": {"seed": 3}, "use_vllm": True, "vllm_mode": "colocate"},
            r"generation_kwargs\['seed'\]",
        ),
        (
            AbsoluteZeroConfig,
            {"proposer_generation_kwargs": {"seed": 3}, "use_vllm": True, "vllm_mode": "colocate"},
            r"proposer_generation_kwargs\['seed'\]",
        ),
    ],
)
def test_leaking_or_group_defeating_settings_name_the_field(tmp_path, config_cls, overrides, match):
    sizes = dict(per_device_train_batch_size=4, num_generations=4)
    with pytest.raises(ValueError, match=match):
        cpu_test_args(tmp_path, config_cls, **{**sizes, **overrides})


def test_turn_kwargs_parse_from_json_and_a_seed_is_fine_with_n_per_request(tmp_path):
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        use_vllm=True,
        vllm_mode="server",
        generation_kwargs={"seed": 3},
        confidence_generation_kwargs='{"stop": ["x"]}',
    )
    assert args.confidence_generation_kwargs == {"stop": ["x"]}
    azr = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        per_device_train_batch_size=4,
        num_generations=2,
        proposer_generation_kwargs='{"stop": ["?"]}',
    )
    assert azr.proposer_generation_kwargs == {"stop": ["?"]}
    replay = cpu_test_args(tmp_path, ReplayGRPOConfig, num_generations=4, generation_kwargs={"seed": 3})
    assert replay.generation_kwargs == {"seed": 3}  # transformers generation: no request per row


def test_rlcr_confidence_prompts_over_the_vllm_context_become_zero_reward_stand_ins(tmp_path):
    model, tokenizer = tiny_causal_lm()

    def script(prompt_text, k):
        if "<|im_start|>" not in prompt_text:  # a stand-in for a prompt that does not fit
            return "stand-in"
        if "confidence" in prompt_text.split("<|im_start|>user")[-1]:
            return "<confidence>0.9</confidence>"
        return "<think>" + " long" * 20 if k == 0 else "<answer>2</answer>"  # k == 0: cut at max_tokens

    with LoopbackVLLMServer(model, tokenizer, script=script) as server, vllm_server_mode(server):
        args = cpu_test_args(
            tmp_path,
            RLCRMultiTurnConfig,
            per_device_train_batch_size=4,
            num_generations=2,
            num_generations_confidence=2,
            max_completion_length=12,
            max_confidence_length=8,
            **server_args(server),
        )
        trainer = RLCRMultiTurnTrainer(
            model=model, args=args, train_dataset=rlcr_dataset(), processing_class=tokenizer
        )
        # The context fits every answer turn and the confidence turns of short answers, not those of long ones.
        prompts = [trainer._tokenize_prompts([row["prompt"]])[0][0] for row in rlcr_dataset()]
        short = tokenizer.encode("<answer>2</answer>", add_special_tokens=False) + [tokenizer.eos_token_id]
        server.max_model_len = max(len(trainer._turn.prompt_ids(p, short, trainer.eos_token_ids)) for p in prompts) + 8
        long_turn2 = min(len(trainer._turn.prompt_ids(p, [7] * 12, trainer.eos_token_ids)) for p in prompts)
        assert max(map(len, prompts)) + 12 <= server.max_model_len < long_turn2 + 8
        with BatchRecorder(trainer) as rec:
            trainer.train()

    answers, confidences = server.requests
    long_answer = [len(c["token_ids"]) == 12 for c in answers["choices"]]
    assert long_answer == [True, False] * 2
    # One stand-in per long answer's G_c siblings (n=2): row counts are unchanged.
    assert [len(p) == 1 for p in confidences["body"]["prompt"]] == long_answer * 1
    batch = rec.batches[0]
    assert batch["completion_ids"].shape[0] == 4 + 8  # no lost rows
    over = [flag for flag in long_answer for _ in range(2)]
    for row, flag in enumerate(over, start=4):  # a stand-in row: one EOS token, no sampler log-prob, advantage 0
        assert (batch["completion_mask"][row].sum().item() == 1) == flag
        if flag:
            assert batch["completion_ids"][row, 0].item() == tokenizer.eos_token_id
            assert batch["advantages"][row].item() == 0.0
    log = trainer.state.log_history[0]
    assert log["confidence/generation/prompts_over_context"] == 4.0
    assert log["generation/prompts_over_context"] == 0.0
