"""vLLM server mode (`LoopbackVLLMServer`, TRL's real `VLLMGeneration` and client): every trainer pushes its weights
once per optimizer step, however many generation requests a step makes, and with LoRA the pushed weights are the
merged adapter weights, `W + B @ A * lora_alpha / r`, under the base model's parameter names. The same for LoRA in
colocate mode with sleep mode (`vllm_colocate_mode`)."""

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig

from trl_ext.testing import LoopbackVLLMServer, cpu_test_args, tiny_causal_lm, vllm_server_mode
from trl_ext.testing.vllm_colocate import vllm_colocate_mode
from trl_ext.trainers import (
    AbsoluteZeroConfig,
    AbsoluteZeroTrainer,
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)


LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
SCALE = 8 / 4  # lora_alpha / r


def first_is_a(completions, **kwargs):
    return [float(c[0]["content"].startswith("a")) for c in completions]


def rlcr(tmp_path, model, tokenizer, peft_config, **vllm):
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "solution": str(2 * i)} for i in range(8)]
    )
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        max_completion_length=12,
        max_confidence_length=12,
        **vllm,
    )

    def script(text, k):
        if "confidence" in text.split("<|im_start|>user")[-1]:
            return ["<confidence>0.9</confidence>", "<confidence>0.2</confidence>"][k % 2]
        gold = int(text.split("What is ")[1].split("+")[0]) * 2
        return f"<answer>{gold if k % 2 == 0 else gold + 1}</answer>"

    trainer = RLCRMultiTurnTrainer(
        model=model, args=args, train_dataset=data, processing_class=tokenizer, peft_config=peft_config
    )
    return trainer, script


def replay(tmp_path, model, tokenizer, peft_config, **vllm):
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Say {i}"}], "task_id": f"t{i}"} for i in range(6)]
    )
    args = cpu_test_args(
        tmp_path, ReplayGRPOConfig, replay_start_ratio=0.0, max_completion_length=6, experience_lbound=0, **vllm
    )
    trainer = ReplayGRPOTrainer(
        model=model,
        reward_funcs=first_is_a,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    return trainer, lambda text, k: ("a", "b")[k % 2]


def absolute_zero(tmp_path, model, tokenizer, peft_config, **vllm):
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Propose task {i}"}]} for i in range(4)])
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        per_device_train_batch_size=4,
        num_generations=2,
        num_questions_per_prompt=2,
        max_repropose_attempts=1,
        max_completion_length=6,
        max_question_length=6,
        **vllm,
    )

    def good_or_bad(text):
        return {"question": f"Answer to {text}"} if text == "good" else None

    trainer = AbsoluteZeroTrainer(
        model,
        [first_is_a],
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        parse_question=good_or_bad,
        peft_config=peft_config,
    )
    return trainer, lambda text, k: ("good", "bad")[k % 2] if "Propose" in text else ("a", "b")[k % 2]


def merged_weights(peft_model) -> dict[str, torch.Tensor]:
    """The base model's weights with each LoRA layer's `B @ A * scale` added, by hand, under the base names."""
    weights = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A"):
            assert module.scaling["default"] == SCALE
            delta = module.lora_B["default"].weight @ module.lora_A["default"].weight * SCALE
            weights[f"{name}.weight"] = module.base_layer.weight + delta
    for name, param in peft_model.named_parameters():
        if "lora_" not in name and ".base_layer." not in name:
            weights[name] = param
    return {name.removeprefix("base_model.model."): value.detach().clone() for name, value in weights.items()}


def record_pushes(trainer, engine_model, lora: bool) -> list:
    """Per push: the step, the trainer's weights as vLLM should hold them, and the engine's weights after it."""
    pushes = []
    sync_weights = trainer.vllm_generation.sync_weights

    def recorded_sync():
        sync_weights()
        expected = (
            merged_weights(trainer.model)
            if lora
            else {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        )
        served = {name: p.detach().clone() for name, p in engine_model.named_parameters()}
        pushes.append((trainer.state.global_step, expected, served))

    trainer.vllm_generation.sync_weights = recorded_sync
    return pushes


def assert_pushed_trained_weights(pushes, lora: bool) -> None:
    assert [step for step, _, _ in pushes] == [0, 1]
    for _, expected, served in pushes:
        assert expected.keys() == served.keys()
        for name, value in expected.items():
            torch.testing.assert_close(served[name], value, msg=name)
    # After one update the second push carries new weights (with LoRA: a non-zero B @ A on the targeted layers).
    _, first, _ = pushes[0]
    _, second, _ = pushes[1]
    changed = {name for name in first if not torch.equal(first[name], second[name])}
    assert changed
    if lora:
        assert changed <= {name for name in first if "q_proj" in name or "v_proj" in name}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("make", [rlcr, replay, absolute_zero], ids=lambda f: f.__name__)
def test_one_push_per_step_of_the_trained_weights(tmp_path, make, lora):
    model, tokenizer = tiny_causal_lm()
    server = LoopbackVLLMServer(model, tokenizer)
    with server, vllm_server_mode(server):
        trainer, script = make(
            tmp_path,
            model,
            tokenizer,
            LoraConfig(**LORA) if lora else None,
            max_steps=2,
            learning_rate=0.05,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server.base_url,
        )
        server.script = script
        pushes = record_pushes(trainer, server.model, lora)
        trainer.train()

    assert server.weight_updates == 2
    # RLCR's two turns and Absolute Zero's proposer and solver rounds: several requests share each push
    assert len(server.requests) >= (1 if make is replay else 2) * server.weight_updates
    assert_pushed_trained_weights(pushes, lora)


def test_colocated_lora_pushes_the_merged_weights_once_per_step(tmp_path):
    """The same through TRL's colocate path, in sleep mode (`vllm_colocate_mode`), for RLCR's two turns."""
    model, tokenizer = tiny_causal_lm()
    with vllm_colocate_mode(model, tokenizer) as engines:
        trainer, script = rlcr(
            tmp_path,
            model,
            tokenizer,
            LoraConfig(**LORA),
            max_steps=2,
            learning_rate=0.05,
            use_vllm=True,
            vllm_mode="colocate",
            vllm_enable_sleep_mode=True,
        )
        (engine,) = engines
        engine.sampler.script = script
        pushes = record_pushes(trainer, engine.model, lora=True)
        trainer.train()
    assert engine.pushes == 2 and len(engine.generations) == 4
    assert_pushed_trained_weights(pushes, lora=True)
