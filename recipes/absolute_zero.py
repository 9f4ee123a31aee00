"""Self-play with AbsoluteZeroTrainer: the model proposes questions from seed prompts and learns to solve the learnable
ones, proposer and solver rows in one update.

    accelerate launch recipes/absolute_zero.py                 # embedded default: SmolLM2-135M, arithmetic, CPU
    accelerate launch recipes/absolute_zero.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --use_vllm \\
        --dataset_path seeds.jsonl --question_column seed --use_peft --push_to_hub --hub_model_id me/az-arithmetic

Seed prompts: the built-in arithmetic seeds, or `--dataset_name` / `--dataset_path` with the seed text in
`--question_column` (or a conversational `prompt` column). The task family (`--task`) provides the question parser,
solver prompt and solver rewards. Writes to `output_dir`: `metrics.json` (summary and training log),
`learning_curves.png` (learnable ratio, repropose attempts, proposer reward, solver accuracy per step), and the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoTokenizer
from trl import get_peft_config

from trl_ext.recipe import (
    RecipeScriptArguments,
    load_recipe_dataset,
    plot_learning_curves,
    resolve_model,
    run_recipe,
    write_json,
    write_model_card,
)
from trl_ext.tasks import arithmetic_task
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


DEFAULT_CONFIG = Path(__file__).parent / "configs" / "absolute_zero_smollm2_cpu.yaml"
TASKS = {"arithmetic": arithmetic_task}


@dataclass
class AbsoluteZeroScriptArguments(RecipeScriptArguments):
    """Recipe arguments; see [`~trl_ext.recipe.RecipeScriptArguments`] for the dataset flags (no answer column is
    needed: gold answers come from the proposals).

    Parameters:
        task (`str`, *optional*, defaults to `"arithmetic"`):
            Task family: question parser, solver prompt and solver rewards.
        lenient_parsing (`bool`, *optional*, defaults to `False`):
            Read untagged proposals (first arithmetic expression) and answers (last number), for models too small
            to follow the tag format.
    """

    task: str = field(default="arithmetic", metadata={"help": "Task family.", "choices": sorted(TASKS)})
    lenient_parsing: bool = field(default=False, metadata={"help": "Read untagged proposals and answers."})


def seed_datasets(script_args, training_args, task):
    train, evaluation = load_recipe_dataset(script_args, script_args.system_prompt, require_answer=False)
    if train is None:
        train = task.seed_prompts(script_args.num_train_samples or 200, training_args.seed)
        evaluation = None
    return train, evaluation


def card_results(log_history, accuracy_key):
    """The model card's headline numbers: means over the run of the learnable ratio, proposal invalid rate and solver
    accuracy."""
    results = {}
    for name, key in (("learnable ratio", "unified_filter/learnable_ratio"), ("invalid proposals",
                      "proposer/invalid_rate"), ("solver accuracy", accuracy_key)):
        values = [log[key] for log in log_history if isinstance(log.get(key), (int, float))]
        results[f"{name} (mean over steps)"] = sum(values) / len(values) if values else None
    return results


def main(script_args, training_args, model_args):
    if script_args.task not in TASKS:
        raise ValueError(f"--task {script_args.task!r} is not one of {sorted(TASKS)}.")
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    task = TASKS[script_args.task](lenient=script_args.lenient_parsing)
    model_path = resolve_model(model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    train, evaluation = seed_datasets(script_args, training_args, task)
    if training_args.reward_weights is None and task.reward_weights is not None:
        training_args.reward_weights = list(task.reward_weights)

    training_args.model_init_kwargs = {
        **(training_args.model_init_kwargs or {}),
        "dtype": model_args.dtype,
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
    }
    trainer = AbsoluteZeroTrainer(
        model=model_path,
        reward_funcs=task.reward_funcs,
        args=training_args,
        train_dataset=train,
        eval_dataset=evaluation if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)

    if trainer.accelerator.is_main_process:
        accuracy = f"solver/{trainer.reward_func_names[0]}_mean"
        curves = ["unified_filter/learnable_ratio", "repropose/total_attempts", "proposer/reward_mean", accuracy]
        plot_learning_curves(trainer.state.log_history, curves, output_dir / "learning_curves.png",
                             title=f"Absolute Zero self-play ({task.name}, per logging step)")
        steps = [log for log in trainer.state.log_history if "unified_filter/learnable_ratio" in log]
        summary = {key: [log.get(key) for log in steps] for key in curves}
        write_json(output_dir / "metrics.json", {"model": model_path, "task": task.name, "per_step": summary,
                                                 "train_log": trainer.state.log_history})
        for key, values in summary.items():
            print(f"{key:>34}: " + " ".join("-" if v is None else f"{v:.2f}" for v in values))
        print(f"report and plots in {output_dir}")
    write_model_card(trainer, script_args, f"self-play from the built-in {task.name} seed prompts (`trl_ext.tasks`)",
                     card_results(trainer.state.log_history, f"solver/{trainer.reward_func_names[0]}_mean"))
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    return trainer.state.log_history


if __name__ == "__main__":
    run_recipe(main, AbsoluteZeroScriptArguments, AbsoluteZeroConfig, DEFAULT_CONFIG)
