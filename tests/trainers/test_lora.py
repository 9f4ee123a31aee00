"""LoRA with every trainer: training changes the adapter's weights and nothing else, and the adapter does train."""

import pytest
from datasets import Dataset
from peft import LoraConfig

from trl_ext.testing import ScriptedGeneration, changed_parameters, cpu_test_args, snapshot_parameters, tiny_causal_lm
from trl_ext.trainers import (
    AbsoluteZeroConfig,
    AbsoluteZeroTrainer,
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)


LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def rlcr(tmp_path, peft_config):
    """Half the answers right, two different confidences per answer: signal in both turns."""
    model, tokenizer = tiny_causal_lm()
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
        max_confidence_length=8,
        learning_rate=1e-2,
        max_steps=2,
    )
    trainer = RLCRMultiTurnTrainer(
        model=model, args=args, train_dataset=data, processing_class=tokenizer, peft_config=peft_config
    )

    def script(text, k):
        if "confidence" in text.split("<|im_start|>user")[-1]:
            return ["<confidence>0.9</confidence>", "<confidence>0.2</confidence>"][k % 2]
        gold = int(text.split("What is ")[1].split("+")[0]) * 2
        return f"<answer>{gold if k % 2 == 0 else gold + 1}</answer>"

    return trainer, script, None


def replay(tmp_path, peft_config):
    """Each group's first rollout succeeds: replay starts at once and replays stored rollouts."""
    model, tokenizer = tiny_causal_lm()
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Say {i}"}], "task_id": f"t{i}"} for i in range(6)]
    )
    args = cpu_test_args(
        tmp_path,
        ReplayGRPOConfig,
        max_steps=3,
        replay_start_ratio=0.0,
        learning_rate=1e-2,
        max_completion_length=6,
        experience_lbound=0,
    )

    def first_is_a(completions, **kwargs):
        return [float(c[0]["content"] == "a") for c in completions]

    trainer = ReplayGRPOTrainer(
        model=model,
        reward_funcs=first_is_a,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=peft_config,
    )

    def replayed(trainer):  # the off-policy path ran under the adapter too
        assert sum(log.get("replay/replay_groups", 0) for log in trainer.state.log_history) > 0

    return trainer, lambda text, k: ("a", "b")[k % 2], replayed


def absolute_zero(tmp_path, peft_config):
    """Proposals "good" (valid) and "bad" (invalid); responses "a" (reward 1) and "b" (0): signal in both roles."""
    model, tokenizer = tiny_causal_lm()
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Propose task {i}"}]} for i in range(4)])
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        per_device_train_batch_size=4,
        num_generations=2,
        num_questions_per_prompt=2,
        max_repropose_attempts=0,
        max_completion_length=6,
        max_question_length=6,
        learning_rate=1e-2,
        max_steps=2,
    )

    def first_is_a(completions, **kwargs):
        return [float(c[0]["content"] == "a") for c in completions]

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
    return trainer, lambda text, k: ("good", "bad")[k % 2] if "Propose" in text else ("a", "b")[k % 2], None


@pytest.mark.parametrize("make", [rlcr, replay, absolute_zero], ids=lambda f: f.__name__)
def test_lora_changes_only_adapter_weights(tmp_path, make):
    trainer, script, check = make(tmp_path, LoraConfig(**LORA))
    before = snapshot_parameters(trainer.model)
    with ScriptedGeneration(trainer, script):
        trainer.train()
    changed = changed_parameters(before, trainer.model)
    assert changed and all("lora_" in name for name in changed)
    assert any("lora_B" in name for name in changed)  # lora_B starts at zero: the adapter itself trained
    if check is not None:
        check(trainer)
