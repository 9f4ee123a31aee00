"""The recipes in `recipes/`: what they share (the command line and its defaults, data loading, outputs) here, and
each recipe's flags, steps and `main` in `rlcr`, `replay` and `absolute_zero` (with `self_play_heldout`).

A recipe runs in TRL's idiom, `TrlParser((ScriptArguments, <Config>, ModelConfig))` with `--config <yaml>`; with no
model and no config it runs the embedded default on CPU from a YAML shipped next to the recipe.
"""

from .cli import (
    HARDWARE_FIELDS,
    FormatWarmupArguments,
    RecipeScriptArguments,
    annotate_help,
    cpu_fallback,
    resolve_model,
    run_recipe,
    single_process_cpu_threads,
    with_default_config,
)
from .data import LOCAL_FORMATS, load_recipe_dataset
from .outputs import (
    FINAL_STAGING,
    parameters_sharded,
    plot_learning_curves,
    save_final_model,
    time_summary,
    write_json,
    write_model_card,
)


__all__ = [
    "FINAL_STAGING",
    "HARDWARE_FIELDS",
    "LOCAL_FORMATS",
    "FormatWarmupArguments",
    "RecipeScriptArguments",
    "annotate_help",
    "cpu_fallback",
    "load_recipe_dataset",
    "parameters_sharded",
    "plot_learning_curves",
    "resolve_model",
    "run_recipe",
    "save_final_model",
    "single_process_cpu_threads",
    "time_summary",
    "with_default_config",
    "write_json",
    "write_model_card",
]
