"""What the recipes in `recipes/` share: dataset loading, the embedded default, plots and reports.

A recipe runs in TRL's idiom, `TrlParser((ScriptArguments, <Config>, ModelConfig))` with `--config <yaml>`; with no
model and no config it runs the embedded default on CPU from a YAML shipped next to the recipe.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset, load_dataset
from trl import ScriptArguments

from .curves import plot_logged
from .default_model import default_model_path
from .rewards.functions import is_missing


logger = logging.getLogger(__name__)

LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass
class RecipeScriptArguments(ScriptArguments):
    """TRL's `ScriptArguments` (`--dataset_name`, `--dataset_config`, splits) plus local files and column mapping.

    Parameters:
        dataset_path (`str`, *optional*):
            A local dataset file (`.json`, `.jsonl`, `.parquet`, `.csv`), instead of `--dataset_name`.
        question_column (`str`, *optional*, defaults to `"question"`):
            Column holding the question text, turned into a conversational `prompt`. Ignored when the dataset
            already has a conversational `prompt` column.
        answer_column (`str`, *optional*, defaults to `"answer"`):
            Column holding the gold answer, copied to `solution` (TRL's convention) when that column is absent. A
            missing answer (null, NaN, blank cell) stays `None`: the row is not scored (never as wrong), and the
            loader reports how many rows lack one.
        answer_delimiter (`str`, *optional*):
            Keep only the text after the last occurrence of this delimiter in the answer column (GSM8K: `"####"`).
        system_prompt (`str`, *optional*):
            System message put before each question, or before a plain-text `prompt` (defaults to the recipe's
            answer-format instructions). A conversational `prompt` is kept as it is.
        num_train_samples (`int`, *optional*):
            Use at most this many training rows (all when unset; the built-in dataset needs a number).
        num_eval_samples (`int`, *optional*, defaults to `64`):
            Rows for the calibration evaluation before and after training (the test split, or held out).
    """

    dataset_path: str | None = field(default=None, metadata={"help": "Local .json/.jsonl/.parquet/.csv dataset."})
    question_column: str = field(default="question", metadata={"help": "Column with the question text."})
    answer_column: str = field(default="answer", metadata={"help": "Column with the gold answer."})
    answer_delimiter: str | None = field(
        default=None, metadata={"help": "Keep the answer text after the last occurrence of this (GSM8K: '####')."}
    )
    system_prompt: str | None = field(default=None, metadata={"help": "System message before each question."})
    num_train_samples: int | None = field(default=None, metadata={"help": "Cap on the number of training rows."})
    num_eval_samples: int = field(default=64, metadata={"help": "Rows for the before/after evaluation."})


@dataclass
class FormatWarmupArguments:
    """The flags of a recipe's supervised format warm-up before RL ([`~trl_ext.warmup.format_warmup`]: TRL's
    `SFTTrainer`, built once per distinct inputs and cached like the embedded default).

    Parameters:
        warmup_samples (`int`, *optional*, defaults to `0`):
            Size of the warm-up: what one sample is depends on the recipe (RLCR: a training row set aside; Absolute
            Zero workspace: a generated task config). 0 skips it.
        warmup_learning_rate (`float`, *optional*, defaults to `1e-4`):
            Learning rate of the format warm-up (constant; bf16 autocast when the RL run uses bf16).
        warmup_epochs (`float`, *optional*, defaults to `1.0`):
            Epochs of the format warm-up over its examples.
        warmup_batch_size (`int`, *optional*, defaults to `8`):
            Examples per step of the format warm-up.
    """

    warmup_samples: int = field(
        default=0, metadata={"help": "Size of the supervised format warm-up before RL (see the recipe); 0 skips it."}
    )
    warmup_learning_rate: float = field(default=1e-4, metadata={"help": "Learning rate of the format warm-up."})
    warmup_epochs: float = field(default=1.0, metadata={"help": "Epochs of the format warm-up."})
    warmup_batch_size: int = field(default=8, metadata={"help": "Batch size of the format warm-up."})

    def __post_init__(self):
        if self.warmup_samples < 0:
            raise ValueError(f"--warmup_samples must be 0 (no warm-up) or more (got {self.warmup_samples}).")
        if not self.warmup_learning_rate > 0:
            raise ValueError(f"--warmup_learning_rate must be positive (got {self.warmup_learning_rate}).")
        if not self.warmup_epochs > 0:
            raise ValueError(f"--warmup_epochs must be positive (got {self.warmup_epochs}).")
        if self.warmup_batch_size < 1:
            raise ValueError(f"--warmup_batch_size must be at least 1 (got {self.warmup_batch_size}).")

    def build_warmup(self, base_model: str, examples: Sequence[dict], training_args) -> tuple[str, float]:
        """`(checkpoint, seconds)`: `base_model` warmed up on `examples` with these flags (bf16 and seed from the RL
        run's `training_args`), built once and cached."""
        from .warmup import format_warmup

        started = time.monotonic()
        path = format_warmup(base_model, examples, learning_rate=self.warmup_learning_rate,
                             num_train_epochs=self.warmup_epochs, per_device_train_batch_size=self.warmup_batch_size,
                             bf16=training_args.bf16, seed=training_args.seed)
        return path, time.monotonic() - started


def time_summary(seconds: dict[str, float]) -> str:
    """`seconds` per phase (and their `total`) as a recipe prints them last."""
    return (f"time: {seconds['total'] / 60:.1f} min ("
            + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items() if k != "total") + ")")


def run_recipe(main, script_args_cls: type, config_cls: type, default_config: str | os.PathLike, argv=None) -> None:
    """Parse `(script_args_cls, config_cls, ModelConfig)` the TRL way (flags and `--config`, falling back to
    `default_config`, see [`with_default_config`]) and call `main(script_args, training_args, model_args)`.

    On a machine without a GPU, a run whose command line and config leave the hardware open runs on CPU (see
    [`cpu_fallback`]). `--help` shows TRL's defaults and marks the values the embedded-default YAML sets.
    """
    from trl import ModelConfig, TrlParser

    parser = TrlParser((script_args_cls, config_cls, ModelConfig))
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        annotate_help(parser, default_config)
        parser.parse_args_and_config(args=argv)  # prints the help and exits
        return
    argv = cpu_fallback(with_default_config(argv, default_config))
    # TRL 1.16 (and PEFT) call the model methods transformers 5 renamed (`is_gradient_checkpointing`,
    # `gradient_checkpointing_enable/disable`) around every generation: the warning would name library internals a
    # recipe user cannot change. A config that writes the deprecated `gradient_checkpointing` key still warns.
    warnings.filterwarnings(
        "ignore", message=r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated",
        category=FutureWarning,
    )
    parsed = parser.parse_args_and_config(args=argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(*parsed)


def with_default_config(argv: Sequence[str], default_config: str | os.PathLike) -> list[str]:
    """Prepend `--config default_config` when the command line names neither a model nor a config.

    Explicit flags still override the YAML, e.g. `recipes/rlcr.py --max_steps 2`.
    """
    argv = list(argv)
    named = _flag_names(argv)
    if "config" in named or "model_name_or_path" in named:
        return argv
    return ["--config", str(default_config), *argv]


HARDWARE_FIELDS = ("use_cpu", "bf16", "fp16")


def cpu_fallback(argv: Sequence[str], has_accelerator: bool | None = None) -> list[str]:
    """Append `--use_cpu true --bf16 false` when no GPU (or other accelerator) is present and neither the command
    line nor its `--config` sets `use_cpu`, `bf16` or `fp16`.

    TRL turns `bf16` on by default, which fails on a CPU-only machine ("Your setup doesn't support bf16/gpu"); a
    config that asks for bf16 explicitly still fails there, as it should.
    """
    argv = list(argv)
    if has_accelerator is None:
        has_accelerator = _accelerator_available()
    if has_accelerator:
        return argv
    chosen = _flag_names(argv) | set(_config_values(argv))
    if chosen & set(HARDWARE_FIELDS):
        return argv
    print("trl-ext: no GPU found, running on CPU (use_cpu=true, bf16=false)", file=sys.stderr)
    return [*argv, "--use_cpu", "true", "--bf16", "false"]


def annotate_help(parser, default_config: str | os.PathLike) -> None:
    """Mark, in `--help`, each option the embedded-default YAML sets: that value applies only when the command line
    names neither `--model_name_or_path` nor `--config`; otherwise the default shown (TRL's or ours) applies."""
    import yaml

    values = yaml.safe_load(Path(default_config).read_text()) or {}
    name = Path(default_config).name
    for action in parser._actions:
        if action.dest in values and action.help is not None:
            shown = str(values[action.dest]).replace("%", "%%")
            action.help = f"{action.help} [embedded default: {shown}]"
    parser.description = (
        f"Options marked [embedded default: ...] take that value from {name} when the command line names neither "
        "--model_name_or_path nor --config (the embedded-default run); otherwise the (default: ...) shown applies. "
        "Flags always override. Without a GPU, --use_cpu true --bf16 false is added unless the command line or its "
        "config sets use_cpu, bf16 or fp16."
    )


def _flag_names(argv: Sequence[str]) -> set[str]:
    """Option names given on a command line, `--a-b=1` as `a_b`."""
    return {a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}


def _config_values(argv: Sequence[str]) -> dict:
    """The YAML named by `--config` on `argv` (empty without one)."""
    import yaml

    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return yaml.safe_load(Path(argv[i + 1]).read_text()) or {}
        if arg.startswith("--config="):
            return yaml.safe_load(Path(arg.split("=", 1)[1]).read_text()) or {}
    return {}


def _accelerator_available() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6: CUDA, XPU, MPS, ...
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def resolve_model(model_name_or_path: str | None) -> str:
    """The model to train: the given Hub id or path, else the embedded default checkpoint."""
    return model_name_or_path or default_model_path()


def load_recipe_dataset(
    script_args: RecipeScriptArguments, system_prompt: str | None, require_answer: bool = True
) -> tuple[Dataset, Dataset | None]:
    """Load `--dataset_name` (Hub) or `--dataset_path` (local file) as `(train, eval)` with `prompt` and `solution`.

    With `require_answer=False` (seed prompts without gold answers, e.g. Absolute Zero), `solution` is filled only
    when the answer column exists.

    The eval split is `--dataset_test_split` when the dataset has it, else the last `num_eval_samples` training rows
    are held out. Returns `(None, None)` if neither source is given (the recipe then uses its built-in data).

    Rows without a question are left out (and counted in a warning); rows without a gold answer keep `solution=None`
    (counted in a warning). An empty training set, a malformed data file (named, with its line where known) and
    `--num_train_samples` below 1 raise `ValueError`.
    """
    if script_args.dataset_name and script_args.dataset_path:
        raise ValueError("Give either --dataset_name (Hub) or --dataset_path (local file), not both.")
    if script_args.num_train_samples is not None and script_args.num_train_samples < 1:
        raise ValueError(
            f"--num_train_samples must be at least 1 (got {script_args.num_train_samples}); leave it unset to use "
            "every row."
        )
    if script_args.dataset_path:
        suffix = Path(script_args.dataset_path).suffix.lower()
        if suffix not in LOCAL_FORMATS:
            raise ValueError(
                f"--dataset_path {script_args.dataset_path!r}: unsupported extension {suffix!r}; use one of "
                f"{sorted(LOCAL_FORMATS)}."
            )
        splits = {"train": _load_local(script_args.dataset_path, suffix)}
    elif script_args.dataset_name:
        splits = load_dataset(script_args.dataset_name, script_args.dataset_config)
    else:
        return None, None

    train = splits[script_args.dataset_train_split]
    test_split = script_args.dataset_test_split
    if test_split in splits and test_split != script_args.dataset_train_split:
        evaluation = splits[test_split].select(range(min(script_args.num_eval_samples, len(splits[test_split]))))
    else:
        held_out = min(script_args.num_eval_samples, len(train) // 5)
        evaluation = train.select(range(len(train) - held_out, len(train))) if held_out else None
        train = train.select(range(len(train) - held_out))
    if script_args.num_train_samples is not None:
        train = train.select(range(min(script_args.num_train_samples, len(train))))
    prepare = _column_mapper(script_args, system_prompt, train.column_names, require_answer)
    train = _prepared(train, prepare, script_args, "training")
    evaluation = _prepared(evaluation, prepare, script_args, "evaluation") if evaluation is not None else None
    if evaluation is not None and len(evaluation) == 0:
        evaluation = None
    if len(train) == 0:
        source = script_args.dataset_path or script_args.dataset_name
        raise ValueError(
            f"The dataset {source!r} has no training rows (split {script_args.dataset_train_split!r}, after holding "
            "out evaluation rows and dropping rows without a question); check the file, the split and "
            "--question_column."
        )
    return train, evaluation


def _load_local(path: str, suffix: str) -> Dataset:
    """`load_dataset` on a local file; a file it cannot read fails with a `ValueError` naming the file and the line
    where the parser knows it (a malformed JSON line is located here, as pyarrow counts rows within a block)."""
    from datasets.exceptions import DatasetGenerationError

    kind = LOCAL_FORMATS[suffix]
    try:
        return load_dataset(kind, data_files=path, split="train")
    except Exception as error:
        if not Path(path).is_file():
            raise  # datasets' FileNotFoundError names the path
        if not Path(path).read_bytes().strip():
            located = "the file is empty"
        else:
            located = _json_error(path) if kind == "json" else None
        if located is None:
            # The parser's own error, which datasets wraps: pandas names the CSV line, pyarrow the JSON column whose
            # type changes from one line to another (datasets without the `Json` feature refuse mixed types).
            cause = error.__cause__ if isinstance(error, DatasetGenerationError) and error.__cause__ else error
            located = f"cannot be read as {kind.upper()} ({type(cause).__name__}: {str(cause).strip()})"
        raise ValueError(f"--dataset_path {path}: {located}") from error


def _json_error(path: str) -> str | None:
    """Where a JSON file (one document, or one object per line) is malformed: "line N: reason", else `None`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        return f"not UTF-8 text ({error})"
    if text.lstrip().startswith("["):  # one document: its parser knows the line
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            return f"line {error.lineno}: not valid JSON ({error.msg})"
        return None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            return f"line {number}: not valid JSON ({error.msg}, column {error.colno}); one JSON object per line"
        if not isinstance(row, dict):
            return f"line {number}: expected a JSON object per line, got {type(row).__name__}"
    return None


def _prepared(dataset: Dataset, prepare, script_args: RecipeScriptArguments, name: str) -> Dataset:
    """`dataset` mapped to `prompt`/`solution`, rows without a question left out; both counts are reported."""
    question = None if "prompt" in dataset.column_names else script_args.question_column
    prompts = dataset["prompt"] if question is None else dataset[question]
    keep = [i for i, value in enumerate(prompts) if not is_missing(value)]
    if len(keep) < len(dataset):
        logger.warning("%d of %d %s rows have no question (%r) and are left out.", len(dataset) - len(keep),
                       len(dataset), name, question or "prompt")
        dataset = dataset.select(keep)
    dataset = dataset.map(prepare)
    if "solution" in dataset.column_names:
        missing = sum(is_missing(value) for value in dataset["solution"])
        if missing:
            logger.warning("%d of %d %s rows have no gold answer: they are not scored (reward None, never 0).",
                           missing, len(dataset), name)
    return dataset


def _column_mapper(script_args: RecipeScriptArguments, system_prompt: str | None, columns: list[str],
                   require_answer: bool = True):
    has_prompt = "prompt" in columns
    has_solution = "solution" in columns or (not require_answer and script_args.answer_column not in columns)
    if not has_prompt and script_args.question_column not in columns:
        raise ValueError(
            f"The dataset has neither a 'prompt' column nor the question column {script_args.question_column!r} "
            f"(columns: {columns}); set --question_column."
        )
    if not has_solution and script_args.answer_column not in columns:
        raise ValueError(
            f"The dataset has neither a 'solution' column nor the answer column {script_args.answer_column!r} "
            f"(columns: {columns}); set --answer_column."
        )

    def prepare(row):
        out = {}
        if not has_prompt:
            prompt = [{"role": "user", "content": str(row[script_args.question_column])}]
            if system_prompt:
                prompt.insert(0, {"role": "system", "content": system_prompt})
            out["prompt"] = prompt
        elif isinstance(row["prompt"], str):
            prompt = [{"role": "user", "content": row["prompt"]}]
            if system_prompt:
                prompt.insert(0, {"role": "system", "content": system_prompt})
            out["prompt"] = prompt
        if not has_solution:
            answer = row[script_args.answer_column]
            if is_missing(answer):
                answer = None  # never the text "None" or "nan", which a model could match
            else:
                answer = str(answer)
                if script_args.answer_delimiter and script_args.answer_delimiter in answer:
                    answer = answer.rsplit(script_args.answer_delimiter, 1)[1].strip() or None
            out["solution"] = answer
        return out

    return prepare


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
    from .trainers.trainer_state import last_complete_checkpoint

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
        keep = (f"the trained weights are in the last checkpoint, {last} (load it as a model, or resume from it)"
                if last else "no checkpoint was saved (set save_strategy and save_steps to keep one)")
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
