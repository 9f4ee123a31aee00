"""The recipes' command line: TRL's `TrlParser` over `(script arguments, config, ModelConfig)`, the YAML a recipe
falls back to with no model and no config, the CPU fallback without an accelerator, and the shared flags."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from trl import ScriptArguments

from ..models.default_model import default_model_path


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
            Rows for the calibration evaluation before and after training (RLCR) and for the held-out evaluation
            during training (`--eval_strategy steps --eval_steps N`): the test split, or held out.
        eval_split (`str`, *optional*, defaults to `"report"`):
            With the built-in data, the split the held-out questions come from: `"report"` (the numbers you publish)
            or `"tune"` (for choosing settings: ablations, early looks). Training and warm-up rows always come from
            `"train"`; the three are disjoint (`trl_ext.data.graded_arithmetic`). Ignored with a dataset.
        train_levels (`list[int]`, *optional*):
            With the built-in data, train (and warm up) on these difficulty levels only, e.g. `--train_levels 2`:
            questions of one form, whose difficulty is not written on them, so a stated confidence can only learn
            which of its own answers are right. The held-out questions keep every level. Ignored with a dataset.
        eval_only (`bool`, *optional*, defaults to `False`):
            Evaluate `--model_name_or_path` (a full model, or a LoRA adapter directory: its base model is loaded and
            the adapter merged) on the recipe's held-out evaluation instead of training. On a directory a recipe
            trained, the run's dataset and evaluation settings (`evaluation_settings.json`) are reused unless flags
            override them, and the report (`evaluation.json`, ...) is written beside the model unless `--output_dir`
            is given.
        reward_funcs (`list[str]`, *optional*):
            Your own reward functions, as in TRL's `trl grpo`: dotted import paths (`my_rewards.brevity`, the module
            found from the working directory or `PYTHONPATH`) or a name from `trl.rewards` (`accuracy_reward`,
            `think_format_reward`, `reasoning_accuracy_reward`). Each has TRL's signature,
            `f(prompts, completions, completion_ids, **kwargs) -> list[float | None]`, dataset columns arriving as
            keyword lists. What the recipe does with them: see the recipe (replay: they replace the built-in rewards;
            RLCR: added to the answer rows' accuracy; Absolute Zero: added to the task family's solver rewards).
    """

    dataset_path: str | None = field(default=None, metadata={"help": "Local .json/.jsonl/.parquet/.csv dataset."})
    question_column: str = field(default="question", metadata={"help": "Column with the question text."})
    answer_column: str = field(default="answer", metadata={"help": "Column with the gold answer."})
    answer_delimiter: str | None = field(
        default=None, metadata={"help": "Keep the answer text after the last occurrence of this (GSM8K: '####')."}
    )
    system_prompt: str | None = field(default=None, metadata={"help": "System message before each question."})
    num_train_samples: int | None = field(default=None, metadata={"help": "Cap on the number of training rows."})
    num_eval_samples: int = field(default=64, metadata={"help": "Rows for the before/after and held-out evaluations."})
    eval_split: str = field(
        default="report",
        metadata={"help": "Built-in data: held-out questions from 'report' or 'tune'.", "choices": ["report", "tune"]},
    )
    train_levels: list[int] | None = field(
        default=None, metadata={"help": "Built-in data: train on these difficulty levels (1-5) only."}
    )
    eval_only: bool = field(
        default=False, metadata={"help": "Evaluate --model_name_or_path (model or LoRA adapter) instead of training."}
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Your reward functions: dotted import paths (my_module.my_reward) or trl.rewards names "
            "(accuracy_reward, think_format_reward, reasoning_accuracy_reward); several allowed."
        },
    )


@dataclass
class FormatWarmupArguments:
    """The flags of a recipe's supervised format warm-up before RL ([`~trl_ext.models.warmup.format_warmup`]: TRL's
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
        from ..models.warmup import format_warmup

        started = time.monotonic()
        path = format_warmup(
            base_model,
            examples,
            learning_rate=self.warmup_learning_rate,
            num_train_epochs=self.warmup_epochs,
            per_device_train_batch_size=self.warmup_batch_size,
            bf16=training_args.bf16,
            seed=training_args.seed,
        )
        return path, time.monotonic() - started


def run_recipe(
    main, script_args_cls: type, config_cls: type, default_config: str | os.PathLike, argv=None, prepare_argv=None
) -> None:
    """Parse `(script_args_cls, config_cls, ModelConfig)` the TRL way (flags and `--config`, falling back to
    `default_config`, see [`with_default_config`]) and call `main(script_args, training_args, model_args)`.
    `prepare_argv(argv) -> argv`, if given, edits the command line first (RLCR: reuse a model's evaluation settings).

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
    if prepare_argv is not None:
        argv = prepare_argv(argv)
    has_accelerator = _accelerator_available()
    argv = cpu_fallback(with_default_config(argv, default_config), has_accelerator)
    # TRL 1.16 (and PEFT) call the model methods transformers 5 renamed (`is_gradient_checkpointing`,
    # `gradient_checkpointing_enable/disable`) around every generation: the warning would name library internals a
    # recipe user cannot change. A config that writes the deprecated `gradient_checkpointing` key still warns.
    warnings.filterwarnings(
        "ignore",
        message=r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated",
        category=FutureWarning,
    )
    parsed = parser.parse_args_and_config(args=argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not has_accelerator and (threads := single_process_cpu_threads(os.environ, _cores())):
        import torch

        torch.set_num_threads(threads)
        print(
            f"trl-ext: the only process of `accelerate launch` on CPU computes on all {threads} cores "
            "(accelerate set OMP_NUM_THREADS=1; limit the cores with `taskset`)",
            file=sys.stderr,
        )
    with logs_under_output_dir(parsed[1]):
        main(*parsed)


@contextmanager
def logs_under_output_dir(training_args, environ=os.environ):
    """Every TensorBoard event file of the run under `<output_dir>/runs/<date_host>`, the evaluation before training
    included (transformers' callback otherwise writes what is logged before `train()` to `./runs`); kept when the
    user set `TENSORBOARD_LOGGING_DIR`. A `report_to` backend whose package is missing is refused here, naming the
    extra that installs it, rather than at the trainer's construction."""
    from transformers.integrations import integration_utils

    report_to = training_args.report_to or []
    if "tensorboard" in report_to and not integration_utils.is_tensorboard_available():
        raise ValueError(
            '--report_to tensorboard needs TensorBoard: pip install ".[tensorboard]" (or pip install tensorboard), '
            "or --report_to none."
        )
    if "TENSORBOARD_LOGGING_DIR" in environ:
        yield
        return
    environ["TENSORBOARD_LOGGING_DIR"] = os.path.join(training_args.output_dir, integration_utils.default_logdir())
    try:
        yield
    finally:
        environ.pop("TENSORBOARD_LOGGING_DIR", None)


def config_path(name: str) -> Path:
    """A YAML shipped with the package (`trl_ext/recipe/configs/<name>`; `recipes/configs` in a clone links there)."""
    from importlib.resources import files

    path = Path(str(files("trl_ext.recipe") / "configs" / name))
    if not path.is_file():
        shipped = sorted(p.name for p in path.parent.glob("*.yaml"))
        raise FileNotFoundError(f"No shipped config {name!r}; the package has {shipped}.")
    return path


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


def single_process_cpu_threads(environ: dict[str, str], cores: int) -> int | None:
    """The thread count for a CPU job that `accelerate launch` started as one process, or `None` to keep torch's.

    accelerate's launcher sets `OMP_NUM_THREADS=1` for the processes it starts unless `--cpu` or an accelerate config
    says CPU: without a GPU, `accelerate launch recipes/rlcr.py` would then train on one core of the machine's `cores`
    (the embedded default's RL step: 24.5 s on one of 2 cores, a median of 16.6 s on both). Several processes
    (`WORLD_SIZE` > 1) share the cores, and keep accelerate's setting.
    """
    launched = "ACCELERATE_DYNAMO_BACKEND" in environ  # set by accelerate's launcher for every process it starts
    if launched and environ.get("WORLD_SIZE", "1") == "1" and environ.get("OMP_NUM_THREADS") == "1" and cores > 1:
        return cores
    return None


def _cores() -> int:
    return len(os.sched_getaffinity(0))


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


# The flags a recipe's evaluation depends on beyond the model, written beside the trained model and reused by
# `--eval_only` on that directory (see `reuse_settings`): the data (which rows, how they are prompted) and the
# generation and scoring shared by every recipe; each recipe adds its own.
SETTINGS_FILE = "evaluation_settings.json"
DATA_SETTINGS = (
    "dataset_name",
    "dataset_config",
    "dataset_path",
    "dataset_train_split",
    "dataset_test_split",
    "question_column",
    "answer_column",
    "answer_delimiter",
    "system_prompt",
    "num_train_samples",
    "train_levels",
    "num_eval_samples",
    "reward_funcs",
    "seed",
    "max_completion_length",
    "chat_template_kwargs",
    "eval_temperature",
    "eval_num_samples",
)


def settings_values(names: Sequence[str], script_args, training_args) -> dict:
    """The values of the settings `names` this run used (script arguments first, then the config)."""
    values = {}
    for name in names:
        source = script_args if hasattr(script_args, name) else training_args
        value = getattr(source, name)
        values[name] = value.value if hasattr(value, "value") else value
    return values


def save_settings(output_dir, names: Sequence[str], script_args, training_args) -> None:
    """Write the settings `names` to `output_dir/evaluation_settings.json`, for a later `--eval_only`."""
    path = Path(output_dir) / SETTINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings_values(names, script_args, training_args), indent=2))


def reuse_settings(argv: list[str], names: Sequence[str]) -> list[str]:
    """For `--eval_only` on a local model directory: its saved settings (`evaluation_settings.json`, written by the
    training run) as flags after `argv`, except those the command line names itself (flags override; they also
    override a `--config`'s values, which describe a run rather than this model), and `--output_dir` the model
    directory unless the command line names one (the report goes beside the model)."""
    named = _flag_names(argv)
    if "eval_only" not in named:
        return argv
    model = _flag_value(argv, "model_name_or_path")
    if model is None or not Path(model).is_dir():
        return argv
    flags = [] if "output_dir" in named else ["--output_dir", model]
    path = Path(model) / SETTINGS_FILE
    if path.is_file():
        for name, value in json.loads(path.read_text()).items():
            if name in named or name not in names or value is None:
                continue
            if isinstance(value, list):
                flags += [f"--{name}", *map(str, value)]
            else:
                flags += [f"--{name}", json.dumps(value) if isinstance(value, (dict, bool)) else str(value)]
    if flags:
        print(
            f"trl-ext: --eval_only on {model}: {' '.join(flags)} (from {SETTINGS_FILE}; flags override)",
            file=sys.stderr,
        )
    return [*argv, *flags]


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    """The value of `--name` on a command line (`--name v` or `--name=v`), else `None`."""
    for i, arg in enumerate(argv):
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def quantization_config(model_args, training_args):
    """`--load_in_4bit` / `--load_in_8bit` (QLoRA with `--use_peft`): TRL's `BitsAndBytesConfig`
    (`trl.get_quantization_config`), for the trainer to load the model with; `None` without either flag. Refused,
    naming bitsandbytes and the device, where bitsandbytes cannot quantize (no CUDA GPU, `--use_cpu`) or is not
    installed: the run would otherwise train in full precision while the user believes it quantized."""
    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return None
    import importlib.util

    import torch
    from trl import get_quantization_config

    flag = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit"
    if training_args.use_cpu or not torch.cuda.is_available():
        device = "the run is on CPU (--use_cpu)" if training_args.use_cpu else "this machine has no CUDA GPU"
        raise ValueError(
            f"{flag}: bitsandbytes quantizes on a CUDA GPU only, and {device}. Run on a CUDA GPU, or drop {flag} "
            "(--use_peft alone trains LoRA on the model in full precision)."
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(
            f"{flag} needs bitsandbytes, which is not installed on this machine (CUDA device "
            f'{torch.cuda.get_device_name()}): pip install bitsandbytes (or pip install ".[quantization]").'
        )
    return get_quantization_config(model_args)


def eval_model(model_path: str, model_args, training_args):
    """What `--eval_only` gives the trainer: the path of a full model (loaded as `ModelConfig` asks), or, for a LoRA
    adapter directory (`adapter_config.json`), its base model with the adapter merged (base named in the adapter's
    config; quantized by `--load_in_4bit`/`--load_in_8bit` for a full model only). Returns
    `(model or path, tokenizer source)`."""
    adapter_config = Path(model_path) / "adapter_config.json"
    quantized = quantization_config(model_args, training_args)
    if not adapter_config.is_file():
        load_models_as(model_args, training_args)
        if quantized is not None:
            training_args.model_init_kwargs["quantization_config"] = quantized
        return model_path, model_path
    if quantized is not None:
        raise ValueError(
            f"--eval_only on the LoRA adapter {model_path}: the adapter is merged into its base model in full "
            "precision; drop --load_in_4bit/--load_in_8bit."
        )
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    base_name = PeftConfig.from_pretrained(model_path).base_model_name_or_path
    print(f"trl-ext: {model_path} is a LoRA adapter: evaluating {base_name} with it merged", file=sys.stderr)
    base = AutoModelForCausalLM.from_pretrained(base_name, dtype=model_args.dtype or "auto")
    model = PeftModel.from_pretrained(base, model_path).merge_and_unload()
    training_args.model_init_kwargs = None  # the model is built here
    tokenizer_source = model_path if (Path(model_path) / "tokenizer_config.json").is_file() else base_name
    return model, tokenizer_source


# `trl.rewards` functions `--reward_funcs` takes by name, as TRL's `trl grpo` does.
TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")


def load_function(path: str, flag: str):
    """The function a command line names as `module.attr` (imported from the working directory or `PYTHONPATH`, as
    TRL's `trl grpo` does); an error names the flag, the module and the attribute."""
    if "." not in path.strip("."):
        raise ValueError(f"{flag} {path!r}: give a dotted import path, module.function (e.g. my_rewards.brevity).")
    module_name, attr = path.rsplit(".", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"{flag} {path!r}: cannot import the module {module_name!r} ({type(error).__name__}: {error}). Run from "
            "the directory that holds it, or add that directory to PYTHONPATH."
        ) from error
    if not hasattr(module, attr):
        raise ValueError(f"{flag} {path!r}: the module {module_name!r} ({module.__file__}) has no attribute {attr!r}.")
    function = getattr(module, attr)
    if not callable(function):
        raise ValueError(f"{flag} {path!r}: {attr!r} in the module {module_name!r} is not a function.")
    return function


def load_reward_funcs(paths: Sequence[str] | None) -> list:
    """`--reward_funcs`: each a `trl.rewards` name or a dotted path (see [`load_function`])."""
    import trl.rewards

    return [
        getattr(trl.rewards, path) if path in TRL_REWARDS else load_function(path, "--reward_funcs")
        for path in paths or []
    ]


def resolve_model(model_name_or_path: str | None) -> str:
    """The model to train: the given Hub id or path, else the embedded default checkpoint."""
    return model_name_or_path or default_model_path()


def load_models_as(model_args, training_args) -> None:
    """The trainer loads the policy (and reference) model from its path as `ModelConfig` asks: dtype, revision,
    attention implementation (`training_args.model_init_kwargs`, the user's own keys kept)."""
    training_args.model_init_kwargs = {
        **(training_args.model_init_kwargs or {}),
        "dtype": model_args.dtype,
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
    }
