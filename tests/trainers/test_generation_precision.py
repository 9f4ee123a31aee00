"""Generation runs under the training's mixed precision before `train()` as after it: `train()` wraps the model's
forward in accelerate's autocast, so without the generation seam's own autocast a report's "before" evaluation would
be measured in float32 and its "after" in bf16 (trainers/seams/generation_backends.py)."""

import pytest
import torch
from datasets import Dataset

from trl_ext.testing import cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


def questions(n):
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "solution": str(2 * i)} for i in range(n)]
    )


@pytest.mark.parametrize("bf16", [True, False])
def test_held_out_generation_has_the_same_precision_before_and_after_train(tmp_path, bf16):
    model, tokenizer = tiny_causal_lm()
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        bf16=bf16,
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        max_completion_length=4,
        max_confidence_length=4,
        save_strategy="no",
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=questions(4), processing_class=tokenizer)
    seen = []

    def record(module, inputs):
        enabled = torch.is_autocast_enabled("cpu")
        seen.append(torch.get_autocast_dtype("cpu") if enabled else None)

    handle = trainer.model.model.layers[0].register_forward_pre_hook(record)
    trainer.heldout_evaluate(questions(2))
    before, seen[:] = list(seen), []
    trainer.train()
    training, seen[:] = list(seen), []
    trainer.heldout_evaluate(questions(2))
    handle.remove()
    expected = torch.bfloat16 if bf16 else None
    assert before and set(before) == {expected}  # every forward of the evaluation before train()
    assert set(training) == {expected}  # the training step's generation and loss
    assert seen and set(seen) == {expected}  # the evaluation after train()
