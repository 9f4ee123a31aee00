"""Runs under torchrun: plain GRPOTrainer for 2 steps on each rank, then reports a digest of the weights."""

import sys
import tempfile

import torch
from datasets import Dataset
from trl import GRPOTrainer

from trl_ext.testing import cpu_test_args, tiny_causal_lm, weights_digest, write_rank_result


def reward_len(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


def main():
    model, tokenizer = tiny_causal_lm(seed=0)
    initial = weights_digest(model)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Count to {i}"}]} for i in range(16)])
    args = cpu_test_args(tempfile.mkdtemp(), max_steps=2, per_device_train_batch_size=4, num_generations=4)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward_len, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()
    final = trainer.accelerator.unwrap_model(trainer.model)
    write_rank_result(
        {
            "rank": trainer.accelerator.process_index,
            "world_size": trainer.accelerator.num_processes,
            "global_step": trainer.state.global_step,
            "initial_digest": initial,
            "final_digest": weights_digest(final),
            "distributed_type": str(trainer.accelerator.distributed_type),
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        }
    )


if __name__ == "__main__":
    sys.exit(main())
