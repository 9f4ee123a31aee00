"""What a recipe writes: the final model (saved atomically), JSON reports, learning-curve plots, the model card."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from ..evaluation.curves import plot_logged
from .cli import RecipeScriptArguments


def time_summary(seconds: dict[str, float]) -> str:
    """`seconds` per phase (and their `total`) as a recipe prints them last."""
    return (
        f"time: {seconds['total'] / 60:.1f} min ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items() if k != "total")
        + ")"
    )


FINAL_STAGING = ".final-model.tmp"


def parameters_sharded(trainer) -> bool:
    """Whether the model's parameters are sharded across processes (DeepSpeed ZeRO-3, FSDP): then a forward pass or
    a generation on the main process alone waits for ever in the parameter gathers the other processes never join,
    so the recipes skip their main-process evaluation (docs/design.md#multi-process-invariants)."""
    if getattr(trainer, "is_fsdp_enabled", False):
        return True
    if getattr(trainer, "is_deepspeed_enabled", False):
        return trainer.accelerator.state.deepspeed_plugin.zero_stage == 3
    return False


def save_final_model(trainer, output_dir: str | os.PathLike) -> None:
    """Save the trained model (and tokenizer) into `output_dir` atomically: written aside into
    `output_dir/.final-model.tmp` by `trainer.save_model`, then each file renamed into place, `config.json` last, so
    `output_dir` never holds a config without its weights. Call it on every process (saving is a collective under
    DeepSpeed and FSDP).

    If the save fails (a full disk, say), nothing in `output_dir` is replaced, the staging folder is removed and the
    error names the last complete checkpoint, which still holds the trained weights (checkpoints are never deleted
    here).
    """
    from ..trainers.seams.trainer_state import last_complete_checkpoint

    output_dir = Path(output_dir)
    staging = output_dir / FINAL_STAGING
    main_process = trainer.accelerator.is_main_process
    try:
        if main_process and staging.exists():
            shutil.rmtree(staging)  # left by an earlier run that was killed while saving
        trainer.save_model(str(staging), _internal_call=True)  # _internal_call: the recipe pushes after its card
        trainer.accelerator.wait_for_everyone()
        if main_process:
            names = sorted(os.listdir(staging), key=lambda name: name == "config.json")
            for name in names:
                os.replace(staging / name, output_dir / name)
            staging.rmdir()
    except Exception as error:
        if main_process:
            shutil.rmtree(staging, ignore_errors=True)
        last = last_complete_checkpoint(output_dir)  # a folder whose save was cut off holds no usable weights
        keep = (
            f"the trained weights are in the last checkpoint, {last} (load it as a model, or resume from it)"
            if last
            else "no checkpoint was saved (set save_strategy and save_steps to keep one)"
        )
        raise RuntimeError(
            f"Saving the final model to {output_dir} failed ({type(error).__name__}: {error}); nothing there was "
            f"replaced and {keep}."
        ) from error
    trainer.accelerator.wait_for_everyone()


def plot_learning_curves(log_history: list[dict], keys: Sequence[str], path: str | os.PathLike, title: str) -> str:
    """One panel per metric in `keys` against the training step, from `trainer.state.log_history`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(keys), 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    for ax, key in zip(axes, keys):
        plot_logged(ax, log_history, key)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    return str(path)


def plot_heldout_curves(
    log_history: list[dict], keys: Sequence[str], path: str | os.PathLike, title: str
) -> str | None:
    """The held-out evaluation's metrics (`eval_*` entries of `trainer.state.log_history`, logged by `evaluate()`
    under `--eval_strategy steps --eval_steps N`) against the training step, one panel per key; nothing (`None`) when
    no evaluation ran."""
    if not any(key in log for log in log_history for key in keys):
        return None
    return plot_learning_curves(log_history, keys, path, title)


def write_json(path: str | os.PathLike, payload) -> str:
    """Write `payload` as indented JSON, NaN written as null (strict JSON readers reject NaN)."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(clean(payload), indent=2))
    return str(path)


def write_model_card(trainer, script_args: RecipeScriptArguments, builtin_data: str, results: dict | None = None):
    """Record the run's data and headline results on the trainer and write its model card (`README.md`) to
    `output_dir`. `push_to_hub` later pushes the same card (the trainer keeps what is recorded here)."""
    if script_args.dataset_name:
        data = {"dataset_name": script_args.dataset_name}
    elif script_args.dataset_path:
        data = {"dataset_description": f"the local file `{Path(script_args.dataset_path).name}`"}
    else:
        data = {"dataset_description": builtin_data}
    trainer.set_model_card_details(**data, results=results)
    trainer.create_model_card()
