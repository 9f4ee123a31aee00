"""Runs under torchrun: a scripted RLCR step, then a real one; reports the batch, metrics and weights per rank.

Usage: rlcr_ranks.py PER_DEVICE_BATCH. With 2 ranks and 2 rows each, every group of G_a = 4 answers spans both ranks.
"""

import sys
import tempfile

from datasets import Dataset

from trl_ext.testing import (
    BatchRecorder,
    ScriptedGeneration,
    cpu_test_args,
    tiny_causal_lm,
    weights_digest,
    write_rank_result,
)
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


CONFIDENCE_PROMPT = "Confidence? Reply <confidence>p</confidence>."


def script(prompt_text, k):
    if CONFIDENCE_PROMPT in prompt_text:
        return f"<confidence>{[0.2, 0.9][k % 2]}</confidence>" if k < 2 else "<confidence>x</confidence>"
    right = "3" if "1+2" in prompt_text else "8"
    return f"<think>t</think><answer>{right if k % 2 == 0 else 0}</answer>" if k < 3 else "no answer"


def main():
    per_device = int(sys.argv[1])
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "What is 1+2?"}], "solution": "3"},
            {"prompt": [{"role": "user", "content": "What is 4+4?"}], "solution": "8"},
        ]
    )
    args = cpu_test_args(
        tempfile.mkdtemp(),
        RLCRMultiTurnConfig,
        max_steps=1,
        per_device_train_batch_size=per_device,
        num_generations=4,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        shuffle_dataset=False,
        confidence_normalization="answer_then_prompt",
        max_completion_length=24,
        max_confidence_length=12,
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    with ScriptedGeneration(trainer, script), BatchRecorder(trainer) as rec:
        trainer.train()
    batch = rec.batches[0]
    scripted_log = trainer.state.log_history[0]

    # A real step (transformers generation) with a fresh trainer on the updated model: no deadlock, same metrics.
    real = RLCRMultiTurnTrainer(
        model=trainer.accelerator.unwrap_model(trainer.model),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    real.train()
    write_rank_result(
        {
            "advantages": batch["advantages"].tolist(),
            "row_kind": batch["row_kind"].tolist(),
            "scripted_log": {k: v for k, v in scripted_log.items() if "/" in k},
            "real_log": {k: v for k, v in real.state.log_history[0].items() if "/" in k},
            "digest": weights_digest(real.accelerator.unwrap_model(real.model)),
            "world_size": real.accelerator.num_processes,
        }
    )


if __name__ == "__main__":
    main()
