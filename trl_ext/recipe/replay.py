"""The replay GRPO recipe (`recipes/replay_grpo.py`): its flags, per-step summary, model-card numbers and `main`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoTokenizer
from trl import get_peft_config

from ..evaluation.records import write_jsonl
from ..rewards import make_accuracy_reward, make_format_reward
from ..trainers import ReplayGRPOConfig, ReplayGRPOTrainer
from .cli import (
    DATA_SETTINGS,
    RecipeScriptArguments,
    config_path,
    eval_model,
    load_models_as,
    load_reward_funcs,
    quantization_config,
    resolve_model,
    reuse_settings,
    run_recipe,
    save_settings,
    settings_values,
)
from .data import datasets_for, heldout_split
from .outputs import (
    parameters_sharded,
    plot_heldout_curves,
    plot_learning_curves,
    save_final_model,
    write_json,
    write_model_card,
)


# What learning_curves.png shows, per step.
CURVES = [
    "replay/solve_rate",
    "replay/offpolicy_token_ratio",
    "replay/importance_ratio_mean",
    "replay/buffer_trajectories",
]


# The settings `--eval_only` on a trained directory reuses (see `trl_ext.recipe.cli.reuse_settings`).
EVALUATION_SETTINGS = (*DATA_SETTINGS, "lenient_parsing", "format_weight", "success_reward", "success_value")


def reuse_evaluation_settings(argv: list[str]) -> list[str]:
    return reuse_settings(argv, EVALUATION_SETTINGS)


@dataclass
class ReplayScriptArguments(RecipeScriptArguments):
    """Recipe arguments; see [`~trl_ext.recipe.RecipeScriptArguments`] for the dataset flags. `--reward_funcs`
    replaces the built-in accuracy and format rewards (as in TRL's `trl grpo`, they are then the run's rewards);
    success, for the buffer, is read from `--success_reward` (default: the first).

    Parameters:
        lenient_parsing (`bool`, *optional*, defaults to `False`):
            Score an untagged final number as the answer (small models often drop the `<answer>` tag).
        format_weight (`float`, *optional*, defaults to `0.5`):
            Weight of the format reward next to accuracy (weight 1). Success, for the buffer, is accuracy alone. Not
            used with `--reward_funcs` (weigh those with `--reward_weights`).
    """

    lenient_parsing: bool = field(default=False, metadata={"help": "Read untagged final numbers as answers."})
    format_weight: float = field(default=0.5, metadata={"help": "Weight of the format reward (accuracy has 1)."})


def summarize(log_history):
    """One row per training step with the figures the plots show. Accuracy counts fresh rollouts only: replayed
    rows are stored successes and would inflate it."""
    keys = {
        "accuracy": "replay/solve_rate",
        "replay_groups": "replay/replay_groups",
        "offpolicy_token_ratio": "replay/offpolicy_token_ratio",
        "importance_ratio": "replay/importance_ratio_mean",
        "buffer_trajectories": "replay/buffer_trajectories",
        "buffer_bytes": "replay/buffer_bytes",
        "fresh_tokens": "replay/fresh_tokens",
    }
    return [
        {"step": log["step"], **{name: log.get(key) for name, key in keys.items()}}
        for log in log_history
        if "replay/solve_rate" in log
    ]


def card_results(steps, experience):
    """The model card's headline numbers: fresh-rollout accuracy over the first and last quarter of the steps, and
    what the buffer holds at the end."""
    accuracy = [s["accuracy"] for s in steps if s["accuracy"] is not None]
    quarter = max(1, len(accuracy) // 4)
    first, last = accuracy[:quarter], accuracy[-quarter:]
    return {
        "accuracy, first quarter of steps": sum(first) / len(first) if first else None,
        "accuracy, last quarter of steps": sum(last) / len(last) if last else None,
        "replay buffer trajectories": experience.num_trajectories,
        "replay buffer tasks": experience.num_tasks,
    }


def reward_funcs(script_args, training_args):
    """`--reward_funcs` as given, else the built-in accuracy and format rewards, weighted 1 and `--format_weight`
    unless `--reward_weights` says otherwise."""
    if script_args.reward_funcs:
        return load_reward_funcs(script_args.reward_funcs)
    if training_args.reward_weights is None:
        training_args.reward_weights = [1.0, script_args.format_weight]
    return [make_accuracy_reward(lenient=script_args.lenient_parsing), make_format_reward()]


def main(script_args, training_args, model_args):
    """`recipes/replay_grpo.py`: build the data and trainer, train, and report (metrics.json, plots, model card)."""
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # Load the model and tokenizer
    model_path = resolve_model(model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    # Load the dataset: training prompts and the held-out split
    train, evaluation = datasets_for(script_args, training_args)
    if script_args.eval_only:
        eval_only(model_path, evaluation, script_args, training_args, model_args)
        return
    load_models_as(model_args, training_args)
    # Initialize the Replay GRPO trainer
    trainer = ReplayGRPOTrainer(
        model=model_path,
        reward_funcs=reward_funcs(script_args, training_args),
        args=training_args,
        train_dataset=train,
        # evaluate() on the held-out split every --eval_steps (`eval_*` in the log, heldout_curves.png)
        eval_dataset=heldout_split(evaluation, training_args),
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=quantization_config(model_args, training_args),
    )
    # Train and save the model
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    save_final_model(trainer, training_args.output_dir)

    # Report: plots, metrics.json, the model card; push to the Hub if asked
    if trainer.accelerator.is_main_process:
        steps = summarize(trainer.state.log_history)
        plot_learning_curves(
            trainer.state.log_history,
            CURVES,
            output_dir / "learning_curves.png",
            title="Replay GRPO training (per logging step)",
        )
        k = training_args.eval_num_samples
        plot_heldout_curves(
            trainer.state.log_history,
            ["eval_accuracy", f"eval_mean@{k}", f"eval_pass@{k}", "eval_reward"],
            output_dir / "heldout_curves.png",
            title="Replay GRPO held-out evaluation (per evaluation step)",
        )
        write_json(
            output_dir / "metrics.json", {"model": model_path, "steps": steps, "train_log": trainer.state.log_history}
        )
        exp = trainer.experience
        print(
            f"buffer: {exp.num_tasks} tasks, {exp.num_trajectories} trajectories, {exp.nbytes} bytes, "
            f"{len(exp.retired)} retired; accuracy per step: " + " ".join(f"{s['accuracy']:.2f}" for s in steps)
        )
        print(f"report and plots in {output_dir}")
        save_settings(output_dir, EVALUATION_SETTINGS, script_args, training_args)
    write_model_card(
        trainer,
        script_args,
        "built-in graded arithmetic questions (`trl_ext.data.graded_arithmetic`)",
        card_results(summarize(trainer.state.log_history), trainer.experience),
    )
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


def eval_only(model_path, evaluation, script_args, training_args, model_args):
    """`--eval_only`: the trainer's held-out evaluation of `model_path` (a model, or a LoRA adapter merged into its
    base) with the run's rewards: `evaluation.json` (metrics, n, settings) and `evaluation.jsonl` (one line per question: every
    sample's rewards and success)."""
    if evaluation is None:
        raise ValueError("--eval_only needs held-out rows: give --num_eval_samples or a --dataset_test_split.")
    model, tokenizer_source = eval_model(model_path, model_args, training_args)
    trainer = ReplayGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs(script_args, training_args),
        args=training_args,
        train_dataset=evaluation,
        eval_dataset=evaluation,  # a config's eval_strategy (steps) needs one
        processing_class=AutoTokenizer.from_pretrained(tokenizer_source, revision=model_args.model_revision),
    )
    if parameters_sharded(trainer):
        raise ValueError(
            "--eval_only evaluates without ZeRO-3 or FSDP (their shards are gathered only by train()'s engine): "
            "launch it without the sharded accelerate config."
        )
    metrics = trainer.evaluate(evaluation)
    if not trainer.accelerator.is_main_process:
        return
    k = training_args.eval_num_samples
    rows = [
        {
            "prompt": row["prompt"],
            "solution": row.get("solution"),
            "samples": trainer.heldout_records[i * k : (i + 1) * k],
        }
        for i, row in enumerate(evaluation)
    ]
    output_dir = Path(training_args.output_dir)
    write_jsonl(output_dir / "evaluation.jsonl", rows)
    write_json(
        output_dir / "evaluation.json",
        {
            "model": model_path,
            "questions": len(evaluation),
            "samples_per_question": k,
            "metrics": metrics,
            "settings": settings_values(EVALUATION_SETTINGS, script_args, training_args),
        },
    )
    shown = ", ".join(f"{key} {value:.4g}" for key, value in metrics.items() if isinstance(value, (int, float)))
    print(
        f"{len(evaluation)} questions x {k} sample(s): {shown}\nreport in {output_dir}: evaluation.json, evaluation.jsonl"
    )


# The embedded-default run: used when the command line names neither a model nor a config.
DEFAULT_CONFIG = "replay_grpo_smollm2_cpu.yaml"


def run(argv=None) -> None:
    """The replay GRPO recipe's command line (`trl-ext replay`, `recipes/replay_grpo.py`): parse `argv` (default: `sys.argv[1:]`) and run
    [`main`]."""

    run_recipe(
        main, ReplayScriptArguments, ReplayGRPOConfig, config_path(DEFAULT_CONFIG), argv, reuse_evaluation_settings
    )
