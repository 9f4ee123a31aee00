"""TRL's fused log-probs on CPU: only the labelled positions, in smaller tiles, give the same log-probs and gradients,
and the trainers use them."""

import pytest
import torch
import trl.kernels.chunked_logprob as chunked_logprob
import trl.trainer.utils as trl_utils
from datasets import Dataset
from trl.trainer.utils import add_fused_lm_head

from trl_ext.models.logprob_tiles import cpu_logprob_tiles
from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer
from trl_ext.trainers.base import TrlExtGRPOConfig


CPU = torch.device("cpu")


def test_the_tile_and_the_selection_are_set_for_the_block_and_restored():
    default, selector = chunked_logprob.TOKEN_CHUNK_SIZE, trl_utils._use_triton
    with cpu_logprob_tiles(16, CPU):
        assert chunked_logprob.TOKEN_CHUNK_SIZE == 16
        assert trl_utils._use_triton(CPU) and not chunked_logprob._use_triton(CPU)  # the kernel stays torch's
    assert (chunked_logprob.TOKEN_CHUNK_SIZE, trl_utils._use_triton) == (default, selector)
    with cpu_logprob_tiles(None, CPU, compact=False):
        assert (chunked_logprob.TOKEN_CHUNK_SIZE, trl_utils._use_triton) == (default, selector)
    with cpu_logprob_tiles(16, torch.device("meta")):  # not CPU: TRL's own path
        assert (chunked_logprob.TOKEN_CHUNK_SIZE, trl_utils._use_triton) == (default, selector)
    with pytest.raises(RuntimeError), cpu_logprob_tiles(16, CPU):
        raise RuntimeError("restored on error too")
    assert (chunked_logprob.TOKEN_CHUNK_SIZE, trl_utils._use_triton) == (default, selector)


@pytest.mark.parametrize("compact", [False, True], ids=["all-positions", "labelled-only"])
def test_small_tiles_give_the_same_log_probs_and_gradients(compact, monkeypatch):
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

    scored = []
    forward_tile = chunked_logprob._forward_tile

    def spy(*args, **kwargs):
        scored.append(args[0].shape[0])  # the tile's hidden states
        return forward_tile(*args, **kwargs)

    monkeypatch.setattr(chunked_logprob, "_forward_tile", spy)
    logps, grads = run()  # TRL's CPU path: all 117 positions (3 rows x 39 shifted), one tile
    assert scored == [117, 117]  # one tile, two vocabulary chunks
    scored.clear()
    with cpu_logprob_tiles(7, CPU, compact=compact):
        small_logps, small_grads = run()
    positions = 3 * 15 if compact else 117
    assert sum(scored) == 2 * positions and max(scored) == 7
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
