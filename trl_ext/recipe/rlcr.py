"""The RLCR recipe (`recipes/rlcr.py`): its flags, data, calibration evaluation and report, and its `main`."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import get_peft_config

from ..evaluation.calibration import plot_reliability_diagrams, reliability_diagram
from ..evaluation.rlcr import calibration_evaluation, evaluate_calibration
from ..models.warmup import rlcr_format_examples
from ..rewards.functions import is_missing, verify_answer
from ..trainers import RLCRMultiTurnTrainer
from .cli import (
    FormatWarmupArguments,
    RecipeScriptArguments,
    _flag_names,
    load_function,
    load_models_as,
    load_reward_funcs,
    resolve_model,
)
from .data import datasets_for, heldout_split
from .outputs import (
    parameters_sharded,
    plot_heldout_curves,
    plot_learning_curves,
    save_final_model,
    time_summary,
    write_json,
    write_model_card,
)


# The model card's data line when no dataset is given.
BUILTIN_DATA = "built-in graded arithmetic questions (`trl_ext.data.graded_arithmetic`)"
# The plots the closing summary lists, with what each shows.
PLOTS = {
    "reliability_before_after.png": "reliability diagrams before and after RL (bars: accuracy of the answers in each "
    "confidence bin; on the dashed diagonal, confidence = accuracy; lower panels: "
    "how many answers stated each confidence)",
    "learning_curves.png": "answer accuracy, Brier score, ECE and confidence parse failures of the sampled "
    "training batches, per step",
    "heldout_curves.png": "the same on the held-out questions (greedy), every --eval_steps",
}
# What learning_curves.png shows: the sampled training batches' answers and confidences, per step.
CURVES = ["answer/accuracy", "calibration/brier", "calibration/ece", "confidence/parse_fail_rate"]
# What heldout_curves.png shows: `evaluate()` on the held-out split under `--eval_strategy steps --eval_steps N`.
HELDOUT_CURVES = [f"eval_{key}" for key in CURVES]


@dataclass
class RLCRScriptArguments(FormatWarmupArguments, RecipeScriptArguments):
    """Recipe arguments; see [`~trl_ext.recipe.RecipeScriptArguments`] for the dataset flags and
    [`~trl_ext.recipe.FormatWarmupArguments`] for the warm-up's.

    Parameters:
        accuracy_func (`str`, *optional*):
            Your own correctness check, as a dotted import path (`my_checks.same_answer`): a function
            `f(gold: str, prediction: str) -> bool` given the gold answer and the text inside the answer tag, used in
            training and in every evaluation. Unset: `trl_ext.rewards.verify_answer` (math_verify, then a normalised
            exact match). If it raises, the row is scored `None` and counted in `errors/accuracy_func_rate`.
        eval_only (`bool`, *optional*, defaults to `False`):
            Only evaluate `--model_name_or_path` (greedy answer + confidence) and write the calibration report.
        rlcr_paper_metrics (`bool`, *optional*, defaults to `False`):
            Also report ECE, Brier and AUROC in the RLCR paper's convention (a confidence on a bin edge in the upper
            bin, unparsable confidences scored as 0), to compare with its numbers; ours are always reported.
        warmup_samples (`int`, *optional*, defaults to `0`):
            Rows taken off the start of the training set (never trained on by RL) for a short supervised format
            warm-up before RL: TRL's `SFTTrainer` on the answer turn (`<answer>gold</answer>`) and the confidence turn
            after it, with stated confidences drawn at random, independently of the question (see
            [`~trl_ext.models.warmup`]), two examples per row. Built once per distinct inputs and cached like the embedded
            default. 0 skips it.
        warmup_confidences (`str`, *optional*, defaults to `"weighted"`):
            How the warm-up's stated confidences are drawn (never from the question): `"weighted"`, mostly high as
            instruction-tuned models state confidence; `"uniform"`, every tenth equally likely, so that RL starts
            from spread confidences (siblings that differ, hence confidence advantages) rather than from a habit.
    """

    warmup_confidences: str = field(
        default="weighted",
        metadata={
            "help": "Draw of the warm-up's stated confidences: 'weighted' (mostly high) or 'uniform'.",
            "choices": ["weighted", "uniform"],
        },
    )
    accuracy_func: str | None = field(
        default=None,
        metadata={"help": "Your correctness check f(gold: str, prediction: str) -> bool, as module.function."},
    )
    eval_only: bool = field(
        default=False, metadata={"help": "Evaluate a checkpoint and write the report, no training."}
    )
    rlcr_paper_metrics: bool = field(
        default=False,
        metadata={
            "help": "Also report calibration in the RLCR paper's convention (bin edges to the upper bin, "
            "unparsable confidences scored as 0), under `rlcr_paper` in metrics.json."
        },
    )


# What a reported evaluation depends on beyond the model: written to `evaluation_settings.json` with the model, and
# reused by `--eval_only` on that directory (see `reuse_evaluation_settings`).
EVALUATION_SETTINGS = (
    # generation: lengths, prompts, the held-out evaluation's sampling (the before/after evaluation is greedy)
    "max_completion_length",
    "max_confidence_length",
    "confidence_prompt",
    "system_prompt",
    "chat_template_kwargs",
    "eval_temperature",
    "eval_num_samples",
    # parsing and scoring
    "answer_tag",
    "confidence_tag",
    "lenient_parsing",
    "rlcr_paper_metrics",
    # which rows
    "num_eval_samples",
    "question_column",
    "answer_column",
    "answer_delimiter",
    "dataset_test_split",
    "seed",
)
SETTINGS_FILE = "evaluation_settings.json"


def evaluation_settings(script_args, training_args) -> dict:
    """The settings of `EVALUATION_SETTINGS` this run evaluated with (script arguments first)."""
    settings = {}
    for name in EVALUATION_SETTINGS:
        source = script_args if hasattr(script_args, name) else training_args
        value = getattr(source, name)
        settings[name] = value.value if hasattr(value, "value") else value
    return settings


def reuse_evaluation_settings(argv: list[str]) -> list[str]:
    """For `--eval_only` on a model directory holding `evaluation_settings.json` (written by a training run): its
    settings as flags after `argv`, except those the command line names itself (flags override). They also override
    a `--config`'s values, which describe a run rather than this model."""
    named = _flag_names(argv)
    if "eval_only" not in named:
        return argv
    model = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--model_name_or_path"), None)
    model = model or next((a.split("=", 1)[1] for a in argv if a.startswith("--model_name_or_path=")), None)
    path = Path(model) / SETTINGS_FILE if model else None
    if path is None or not path.is_file():
        return argv
    saved = json.loads(path.read_text())
    flags = []
    for name, value in saved.items():
        if name in named or name not in EVALUATION_SETTINGS or value is None:
            continue
        flags += [f"--{name}", json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)]
    if flags:
        print(f"trl-ext: --eval_only reuses the evaluation settings of {path}: {' '.join(flags)}", file=sys.stderr)
    return [*argv, *flags]


def check_one_answer_column(training_args):
    """The recipe names the gold-answer column with `--answer_column` (copied to `solution`, the trainer's
    `solution_column`): a second flag for the same thing is refused rather than half-applied."""
    if training_args.solution_column != "solution":
        raise ValueError(
            f"--solution_column {training_args.solution_column!r}: in the recipe, name your gold-answer column with "
            f"--answer_column {training_args.solution_column} (the recipe copies it to `solution`, the column the "
            "trainer reads); --solution_column is for the Python API."
        )


def accuracy_func(script_args):
    """`--accuracy_func`, loaded (`None`: the trainer's default, `verify_answer`)."""
    return load_function(script_args.accuracy_func, "--accuracy_func") if script_args.accuracy_func else None


def write_evaluation(result, output_dir, name):
    """`reliability_<name>.png`, and every answer and confidence in `eval_<name>.json`."""
    output_dir = Path(output_dir)
    reliability_diagram(
        result.report,
        output_dir / f"reliability_{name}.png",
        title=f"{name}: accuracy {result.accuracy:.2f}, parse failures {result.confidence_parse_fail_rate:.0%}",
    )
    write_json(output_dir / f"eval_{name}.json", result.rows)


def heldout_evaluation(trainer, evaluation, name, rlcr_paper_metrics=False, reuse_last=False):
    """The held-out evaluation of the trainer's model (`trainer.evaluate()`, a collective: every process calls it) as
    a calibration report; the main process writes its files. `reuse_last`: the model was evaluated last at this step
    (the final `--eval_steps` evaluation), so its records are reported instead of generating them again."""
    if not reuse_last:
        trainer.evaluate(evaluation)
    k = trainer.args.eval_num_samples
    golds = evaluation[trainer.args.solution_column]
    rows = [
        {"gold": None if is_missing(golds[i // k]) else str(golds[i // k]), **record}
        for i, record in enumerate(trainer.heldout_records)
    ]
    result = calibration_evaluation(rows, rlcr_paper_convention=rlcr_paper_metrics)
    if trainer.accelerator.is_main_process:
        write_evaluation(result, trainer.args.output_dir, name)
    return result


def card_results(report):
    """The model card's headline numbers: greedy accuracy and calibration before and after training."""
    results = {}
    for name in ("before", "after"):
        if name in report:
            r = report[name]
            results.update(
                {
                    f"accuracy ({name})": r.accuracy,
                    f"ECE ({name})": r.report.ece,
                    f"Brier ({name})": r.report.brier,
                    f"AUROC ({name})": r.report.auroc,
                }
            )
    return results


def _num(value):
    """3 decimals; n/a when undefined (AUROC without both classes, any metric without a parsed confidence)."""
    return "n/a" if value is None or value != value else f"{value:.3f}"


def _paper_line(result):
    r = result.paper_report
    if r is None:
        return ""
    return f"\n        RLCR paper's convention: ECE {r.ece:.3f}  Brier {r.brier:.3f}  AUROC {_num(r.auroc)}"


def warm_up(model_path, train, script_args, training_args):
    """Take `warmup_samples` rows off `train` and return `(warmed-up checkpoint, the rest of train, its report)`."""
    n = script_args.warmup_samples
    rows = [row for row in train.select(range(min(n, len(train)))) if not is_missing(row["solution"])]
    if len(train) <= n or not rows:
        raise ValueError(
            f"--warmup_samples {n} leaves no rows: the training set has {len(train)} rows ({len(rows)} of the first "
            f"{n} with a gold answer). Lower --warmup_samples or give more data (--num_train_samples)."
        )
    examples = rlcr_format_examples(
        rows,
        training_args.confidence_prompt,
        seed=training_args.seed,
        answer_tag=training_args.answer_tag,
        confidence_tag=training_args.confidence_tag,
        confidence_draw=script_args.warmup_confidences,
    )
    path, seconds = script_args.build_warmup(model_path, examples, training_args)
    return (
        path,
        train.select(range(n, len(train))),
        {"model": path, "rows": len(rows), "examples": len(examples), "seconds": seconds},
    )


def summary(report, output_dir, seconds):
    """What the run printed last: the evaluations side by side, the time, and where the plots are."""
    names = {"base": "base model", "before": "before RL", "after": "after RL"}
    if "warmup" in report:
        names["before"] = "before RL (after the format warm-up)"
    lines = []
    for key, label in names.items():
        if key in report:
            r = report[key]
            lines.append(
                f"{label:>38}: accuracy {r.accuracy:.3f}  ECE {_num(r.report.ece)}  "
                f"Brier {_num(r.report.brier)}  AUROC {_num(r.report.auroc)}  confidence parse failures "
                f"{r.confidence_parse_fail_rate:.0%}{_paper_line(r)}"
            )
    lines.append(time_summary(seconds))
    lines.append(f"report and plots in {output_dir}:")
    lines += [f"  {name}: {what}" for name, what in PLOTS.items() if (Path(output_dir) / name).is_file()]
    return "\n".join(lines)


def main(script_args, training_args, model_args):
    """`recipes/rlcr.py`: evaluate only (`--eval_only`), or warm up, evaluate, train, evaluate again and report
    (metrics.json, reliability diagrams, learning curves, model card). Every evaluation of the trained model is the
    trainer's held-out evaluation (`trainer.evaluate()`), with the settings saved beside the model."""
    started = time.monotonic()
    seconds = {}
    check_one_answer_column(training_args)
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model(model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    train, evaluation = datasets_for(script_args, training_args)
    dtype = model_args.dtype
    load_models_as(model_args, training_args)

    if script_args.eval_only:
        eval_only(model_path, evaluation, tokenizer, script_args, training_args)
        return

    report = {"model": model_path}
    if script_args.warmup_samples:
        base_path = model_path
        model_path, train, report["warmup"] = warm_up(model_path, train, script_args, training_args)
        seconds["format warm-up"] = report["warmup"]["seconds"]

    trainer = RLCRMultiTurnTrainer(
        model=model_path,
        reward_funcs=load_reward_funcs(script_args.reward_funcs),
        accuracy_func=accuracy_func(script_args),
        args=training_args,
        train_dataset=train,
        # evaluate() on the held-out split every --eval_steps (`eval_*` in the log, heldout_curves.png)
        eval_dataset=heldout_split(evaluation, training_args),
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    # Before training, ZeRO-3 and FSDP hold parameter shards that only the engine built by train() gathers: the
    # model is then evaluated after training only.
    before_log = []  # the evaluation before training, which train() (starting a fresh TrainerState) would not keep
    if evaluation is not None and not parameters_sharded(trainer):
        clock = time.monotonic()
        if "warmup" in report and trainer.accelerator.is_main_process:
            # what the warm-up changed: the base model states no parsable confidence (main process, no trainer)
            base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype, revision=model_args.model_revision)
            report["base"] = evaluate_calibration(
                base,
                tokenizer,
                evaluation,
                training_args,
                batch_size=training_args.per_device_eval_batch_size,
                rlcr_paper_convention=script_args.rlcr_paper_metrics,
                accuracy_func=accuracy_func(script_args) or verify_answer,
            )
            write_evaluation(report["base"], output_dir, "base")
            del base
        report["before"] = heldout_evaluation(trainer, evaluation, "before", script_args.rlcr_paper_metrics)
        before_log = [trainer.state.log_history[-1]]
        seconds["evaluation"] = time.monotonic() - clock
    trainer.accelerator.wait_for_everyone()

    clock = time.monotonic()
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    seconds["RL training"] = time.monotonic() - clock
    save_final_model(trainer, training_args.output_dir)

    if evaluation is not None:
        clock = time.monotonic()
        reuse = trainer.heldout_step == trainer.state.global_step  # the last --eval_steps evaluation
        report["after"] = heldout_evaluation(trainer, evaluation, "after", script_args.rlcr_paper_metrics, reuse)
        seconds["evaluation"] = seconds.get("evaluation", 0.0) + time.monotonic() - clock
    history = before_log + trainer.state.log_history
    if trainer.accelerator.is_main_process:
        if "before" in report and "after" in report:
            plot_reliability_diagrams(
                {k: report[k].report for k in ("before", "after")},
                output_dir / "reliability_before_after.png",
                title="RLCR: before vs after RL",
            )
        plot_learning_curves(
            history, CURVES, output_dir / "learning_curves.png", title="RLCR training (per logging step)"
        )
        plot_heldout_curves(
            history,
            HELDOUT_CURVES,
            output_dir / "heldout_curves.png",
            title="RLCR held-out evaluation (per evaluation step)",
        )
        seconds["total"] = time.monotonic() - started
        write_json(
            output_dir / "metrics.json",
            {
                **{k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in report.items()},
                "seconds": seconds,
                "train_log": history,
            },
        )
        write_json(output_dir / SETTINGS_FILE, evaluation_settings(script_args, training_args))
        print(summary(report, output_dir, seconds))
    write_model_card(trainer, script_args, BUILTIN_DATA, card_results(report))
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


def eval_only(model_path, evaluation, tokenizer, script_args, training_args):
    """`--eval_only`: the held-out evaluation of `model_path` (the trainer's, as in training; nothing is trained)."""
    if evaluation is None:
        raise ValueError("--eval_only needs held-out rows: give --num_eval_samples or a --dataset_test_split.")
    trainer = RLCRMultiTurnTrainer(
        model=model_path,
        reward_funcs=load_reward_funcs(script_args.reward_funcs),
        accuracy_func=accuracy_func(script_args),
        args=training_args,
        train_dataset=evaluation,
        processing_class=tokenizer,
    )
    if parameters_sharded(trainer):
        raise ValueError(
            "--eval_only evaluates without ZeRO-3 or FSDP (their shards are gathered only by train()'s engine): "
            "launch it without the sharded accelerate config."
        )
    result = heldout_evaluation(trainer, evaluation, "eval", script_args.rlcr_paper_metrics)
    if not trainer.accelerator.is_main_process:
        return
    output_dir = Path(training_args.output_dir)
    write_json(output_dir / "metrics.json", {"model": model_path, "eval": result.to_dict()})
    if Path(model_path).resolve() != output_dir.resolve():  # keep the settings a trained model was reported with
        write_json(output_dir / SETTINGS_FILE, evaluation_settings(script_args, training_args))
    print(
        f"accuracy {result.accuracy:.3f}  ECE {_num(result.report.ece)}  Brier {_num(result.report.brier)}  "
        f"AUROC {_num(result.report.auroc)}{_paper_line(result)}  -> {output_dir}"
    )
