"""TRL's log-prob tiles on CPU: smaller tiles give the same log-probs and gradients, and the trainers use them."""

import pytest
import torch
import trl.kernels.chunked_logprob as chunked_logprob
from datasets import Dataset
from trl.trainer.utils import add_fused_lm_head

from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer
from trl_ext.trainers.base_config import TrlExtGRPOConfig
from trl_ext.trainers.logprob_tiles import logprob_tile_tokens


CPU = torch.device("cpu")


def test_the_tile_is_set_for_the_block_and_restored():
    default = chunked_logprob.TOKEN_CHUNK_SIZE
    with logprob_tile_tokens(16, CPU):
        assert chunked_logprob.TOKEN_CHUNK_SIZE == 16
    assert chunked_logprob.TOKEN_CHUNK_SIZE == default
    with logprob_tile_tokens(None, CPU):
        assert chunked_logprob.TOKEN_CHUNK_SIZE == default
    with pytest.raises(RuntimeError), logprob_tile_tokens(16, CPU):
        raise RuntimeError("restored on error too")
    assert chunked_logprob.TOKEN_CHUNK_SIZE == default


def test_small_tiles_give_the_same_log_probs_and_gradients():
    model, _ = tiny_causal_lm()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids = torch.randint(0, 1000, (3, 40))
    labels = ids.clone()
    labels[:, :25] = -100  # completions: the last 15 positions

    def run():
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
        (out.log_probs.sum() + out.entropy.sum()).backward()
        return out.log_probs.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    logps, grads = run()  # TRL's tile (4096 tokens: all 120 positions in one)
    with logprob_tile_tokens(7, CPU):  # 18 tiles, the last one partial
        small_logps, small_grads = run()
    torch.testing.assert_close(small_logps, logps, rtol=1e-5, atol=1e-6)
    for small, full in zip(small_grads, grads, strict=True):
        torch.testing.assert_close(small, full, rtol=1e-4, atol=1e-6)


def test_a_training_step_uses_the_configured_tile(tmp_path, monkeypatch):
    seen = []
    backward_tile = chunked_logprob._backward_tile

    def spy(*args, **kwargs):
        seen.append(chunked_logprob.TOKEN_CHUNK_SIZE)
        return backward_tile(*args, **kwargs)

    monkeypatch.setattr(chunked_logprob, "_backward_tile", spy)
    model, tokenizer = tiny_causal_lm()
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"{i}+{i}?"}], "solution": str(2 * i)} for i in range(4)]
    )
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        per_device_train_batch_size=2,
        num_generations=2,
        num_generations_confidence=2,
        max_completion_length=8,
        max_confidence_length=8,
        max_steps=1,
        cpu_logprob_tile_tokens=32,
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    with ScriptedGeneration(trainer, lambda text, k: ("<answer>2</answer>", "<confidence>0.5</confidence>")[k % 2]):
        trainer.train()
    assert seen and set(seen) == {32}
    assert chunked_logprob.TOKEN_CHUNK_SIZE == 4096


def test_the_tile_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="cpu_logprob_tile_tokens"):
        TrlExtGRPOConfig(output_dir=str(tmp_path), cpu_logprob_tile_tokens=0)
