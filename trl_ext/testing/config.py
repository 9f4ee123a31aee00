"""Small CPU-friendly trainer arguments for tests."""

from __future__ import annotations

import os

from trl import GRPOConfig


def cpu_test_args(output_dir: str | os.PathLike, config_cls: type = GRPOConfig, **overrides):
    """Return `config_cls(...)` set up for a few fast CPU steps: fp32, no reporting, no saving, logging every step.

    Defaults: 4 completions per prompt, 8 rows per device, 8 completion tokens. Any field can be overridden.
    """
    defaults = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        max_steps=2,
        learning_rate=1e-3,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return config_cls(**{**defaults, **overrides})
