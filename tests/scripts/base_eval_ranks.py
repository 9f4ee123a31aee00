"""Runs under torchrun: the RLCR recipe's evaluation of the base model before the format warm-up
(`trl_ext.recipe.rlcr.evaluate_base`) on every rank, then a collective; reports per rank the device the base model
was evaluated on, its rows and whether this rank wrote the files.

Usage: base_eval_ranks.py OUTPUT_DIR (shared by the ranks; the main process writes the report there).
"""

import sys
import tempfile
from pathlib import Path

from datasets import Dataset
from trl import ModelConfig

from trl_ext.recipe import rlcr
from trl_ext.testing import cpu_test_args, tiny_checkpoint, tiny_tokenizer, write_rank_result
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


def main(output_dir):
    base = tiny_checkpoint(Path(tempfile.mkdtemp()) / "base")  # seeded: the same weights on every rank
    questions = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i}+1?"}], "solution": str(i + 1)} for i in range(3)]
    )
    args = cpu_test_args(
        output_dir,
        RLCRMultiTurnConfig,
        num_generations=2,
        num_generations_confidence=2,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        max_completion_length=4,
        max_confidence_length=4,
    )
    trainer = RLCRMultiTurnTrainer(model=base, args=args, train_dataset=questions, processing_class=tiny_tokenizer())
    devices = []
    real_to = rlcr.AutoModelForCausalLM.from_pretrained

    def recording(*a, **kw):
        model = real_to(*a, **kw)
        move = model.to
        model.to = lambda device: devices.append(str(device)) or move(device)
        return model

    rlcr.AutoModelForCausalLM.from_pretrained = recording
    script_args = rlcr.RLCRScriptArguments()
    result = rlcr.evaluate_base(base, tiny_tokenizer(), questions, trainer, script_args, ModelConfig(dtype="float32"))
    trainer.accelerator.wait_for_everyone()  # a collective right after: no rank may still be evaluating alone
    write_rank_result(
        {
            "world_size": trainer.accelerator.num_processes,
            "devices": devices,
            "training_device": str(trainer.accelerator.device),
            "rows": result.rows,
            "wrote": trainer.accelerator.is_main_process and (Path(output_dir) / "eval_base.json").is_file(),
        }
    )


if __name__ == "__main__":
    main(sys.argv[1])
