"""The Absolute Zero recipe (`recipes/absolute_zero.py`): its flags, the task family they choose, and its `main`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoTokenizer
from trl import get_peft_config

from ..evaluation.solver import plot_heldout_accuracy
from ..models.chat_template import use_tool_chat_template
from ..rewards import LLMJudge
from ..self_play import arithmetic_task, code_reasoning_task, workspace_task
from ..self_play.workspace import render_judge_request
from ..trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer
from .cli import (
    DATA_SETTINGS,
    FormatWarmupArguments,
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
from .data import load_recipe_dataset
from .outputs import (
    parameters_sharded,
    plot_learning_curves,
    save_final_model,
    time_summary,
    write_json,
    write_model_card,
)
from .self_play_heldout import evaluate_heldout, heldout_lines, heldout_set


TASKS = ("arithmetic", "workspace", "code")  # --task choices
# The settings `--eval_only` on a trained directory reuses (see `trl_ext.recipe.cli.reuse_settings`).
EVALUATION_SETTINGS = (
    *DATA_SETTINGS,
    "task",
    "heldout_size",
    "lenient_parsing",
    "tool_chat_template",
    "sandbox_timeout_s",
    "sandbox_memory_mb",
    "num_references",
)


def reuse_evaluation_settings(argv: list[str]) -> list[str]:
    return reuse_settings(argv, EVALUATION_SETTINGS)


@dataclass
class AbsoluteZeroScriptArguments(FormatWarmupArguments, RecipeScriptArguments):
    """Recipe arguments; see [`~trl_ext.recipe.RecipeScriptArguments`] for the dataset flags (no answer column is
    needed: gold answers come from the proposals) and [`~trl_ext.recipe.FormatWarmupArguments`] for the warm-up's.
    `--reward_funcs` are added to the task family's solver rewards (which decide correctness, learnability and the
    held-out accuracy), each weighted 1 unless `--reward_weights` gives every solver reward its weight.

    Parameters:
        task (`str`, *optional*, defaults to `"arithmetic"`):
            Task family: question parser, solver prompt and solver rewards.
        lenient_parsing (`bool`, *optional*, defaults to `False`):
            Read untagged proposals (arithmetic: the first expression, workspace: the outermost JSON object) and
            answers (last number), for models too small to follow the tag format.
        tool_chat_template (`bool`, *optional*):
            Give the tokenizer TRL's Qwen2.5 tool-calling chat template (`trl_ext.use_tool_chat_template`), for
            ChatML models whose own template renders no tools (SmolLM2). Unset: on for the embedded default when the
            family has an environment, off otherwise (a tool-capable model keeps its own template). Refused for a
            family without tools and for seed prompts without a system message (the template would give them
            Qwen's).
        completion_evaluator (`str`, *optional*, defaults to `"rule"`):
            Workspace family: `"rule"` scores completion with the task's goal predicate, `"llm"` with an LLM judge
            at `judge_base_url` (an OpenAI-compatible chat endpoint; `pip install "trl-ext[judge]"`).
        judge_base_url (`str`, *optional*):
            The judge's endpoint, e.g. `http://judge-host:8000/v1`.
        judge_model (`str`, *optional*):
            The judge model's name at that endpoint.
        judge_api_key_env (`str`, *optional*, defaults to `"JUDGE_API_KEY"`):
            Environment variable holding the judge's API key (never logged).
        judge_max_concurrency (`int`, *optional*, defaults to `16`):
            Judge requests in flight at most.
        judge_timeout (`float`, *optional*, defaults to `30.0`):
            Seconds per judge request attempt.
        judge_max_retries (`int`, *optional*, defaults to `2`):
            Retries of a failed judge request (exponential backoff).
        judge_max_reply_bytes (`int`, *optional*, defaults to `1000000`):
            Largest HTTP body read from the judge endpoint; a larger reply is a failed judgement.
        sandbox_timeout_s (`float`, *optional*, defaults to `5.0`):
            Code family: wall-clock limit of each sandboxed execution (proposals and answers).
        sandbox_memory_mb (`int`, *optional*, defaults to `512`):
            Code family: address-space limit of each sandboxed execution.
        num_references (`int`, *optional*, defaults to `4`):
            Code family: buffer triplets shown to each deduction/abduction proposer.
        heldout_size (`int`, *optional*):
            Questions of the family's fixed held-out set (drawn with `seed`) that the solver answers greedily before
            and after training, scored by the family's correctness reward. Unset: the family's default (arithmetic
            50 of at most 600, code all 24 built-in tasks). 0 skips the evaluation; the workspace family has none
            (its solver needs TRL's tool loop).
        warmup_samples (`int`, *optional*, defaults to `0`):
            Workspace family: generated task configs for a supervised format warm-up before self-play, two examples
            each (proposer: the task config in `<question>` tags; solver: an episode of one tool call, the goal action
            (probability 0.7) or a look drawn independently of safety, and a short answer; see
            [`~trl_ext.self_play.workspace_warmup`]). Built once per distinct inputs and cached like the embedded
            default. 0 skips it.
    """

    task: str = field(default="arithmetic", metadata={"help": "Task family.", "choices": list(TASKS)})
    lenient_parsing: bool = field(default=False, metadata={"help": "Read untagged proposals and answers."})
    tool_chat_template: bool | None = field(
        default=None, metadata={"help": "Use TRL's Qwen2.5 tool-calling template (default: for the embedded model)."}
    )
    completion_evaluator: str = field(
        default="rule", metadata={"help": "Workspace completion score: rule or llm.", "choices": ["rule", "llm"]}
    )
    judge_base_url: str | None = field(default=None, metadata={"help": "OpenAI-compatible judge endpoint."})
    judge_model: str | None = field(default=None, metadata={"help": "Judge model name."})
    judge_api_key_env: str = field(default="JUDGE_API_KEY", metadata={"help": "Env var with the judge API key."})
    judge_max_concurrency: int = field(default=16, metadata={"help": "Judge requests in flight at most."})
    judge_timeout: float = field(default=30.0, metadata={"help": "Seconds per judge request attempt."})
    judge_max_retries: int = field(default=2, metadata={"help": "Retries of a failed judge request."})
    judge_max_reply_bytes: int = field(default=1_000_000, metadata={"help": "Largest judge reply body read."})
    sandbox_timeout_s: float = field(default=5.0, metadata={"help": "Code: seconds per sandboxed execution."})
    sandbox_memory_mb: int = field(default=512, metadata={"help": "Code: memory limit per sandboxed execution."})
    num_references: int = field(default=4, metadata={"help": "Code: buffer triplets shown to a proposer."})
    heldout_size: int | None = field(
        default=None,
        metadata={
            "help": "Held-out solver questions evaluated before and after training (default: arithmetic 50, "
            "code 24); 0 skips the evaluation."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.heldout_size is not None and self.heldout_size < 0:
            raise ValueError(f"--heldout_size must be 0 (no held-out evaluation) or more (got {self.heldout_size}).")


def build_task(script_args):
    """The `TaskFamily` named by `--task`, with the completion evaluator chosen by `--completion_evaluator`."""
    if script_args.task not in TASKS:
        raise ValueError(f"--task {script_args.task!r} is not one of {list(TASKS)}.")
    if script_args.task != "workspace" and script_args.completion_evaluator != "rule":
        raise ValueError("--completion_evaluator applies to --task workspace only.")
    task = _family(script_args)
    if script_args.warmup_samples and task.format_warmup_examples is None:
        raise ValueError(f"--warmup_samples: the {task.name} family has no format warm-up (the workspace family has).")
    return task


def _family(script_args):
    if script_args.task == "arithmetic":
        return arithmetic_task(lenient=script_args.lenient_parsing)
    if script_args.task == "code":
        return code_reasoning_task(
            lenient=script_args.lenient_parsing,
            timeout_s=script_args.sandbox_timeout_s,
            memory_mb=script_args.sandbox_memory_mb,
            num_references=script_args.num_references,
        )
    judge = None
    if script_args.completion_evaluator == "llm":
        if not script_args.judge_base_url or not script_args.judge_model:
            raise ValueError("--completion_evaluator llm needs --judge_base_url and --judge_model.")
        judge = LLMJudge(
            script_args.judge_base_url,
            script_args.judge_model,
            name="completion_score",
            render=render_judge_request,
            api_key_env=script_args.judge_api_key_env,
            max_concurrency=script_args.judge_max_concurrency,
            timeout=script_args.judge_timeout,
            max_retries=script_args.judge_max_retries,
            max_reply_bytes=script_args.judge_max_reply_bytes,
        )
    return workspace_task(
        lenient=script_args.lenient_parsing, completion_evaluator=script_args.completion_evaluator, judge=judge
    )


def seed_datasets(script_args, training_args, task, tool_template=False):
    """`(train, None)`: the given dataset's seed prompts, every row of its training split (the held-out evaluation
    asks the family's own questions, so none is held out), else the family's built-in seeds."""
    seeds_only = dataclasses.replace(script_args, num_eval_samples=0)
    train, evaluation = load_recipe_dataset(seeds_only, script_args.system_prompt, require_answer=False)
    if train is None:
        train = task.seed_prompts(script_args.num_train_samples or 200, training_args.seed)
        evaluation = None
    if tool_template:
        check_tool_template_prompts(task, train, evaluation)
    return train, evaluation


def check_tool_template_prompts(task, *datasets):
    """Refuse what TRL's Qwen2.5 template would open with Qwen's default system turn ("You are Qwen, created by
    Alibaba Cloud"): a conversation without a system message. The families without tools have proposer prompts
    (code: solver prompts too) without one, and gain nothing from the template."""
    if task.environment_factory is None:
        raise ValueError(
            f"--tool_chat_template is for a family whose solver uses tools (workspace); the "
            f"{task.name} family has none."
        )
    for dataset in datasets:
        for i, prompt in enumerate(dataset["prompt"] if dataset is not None else []):
            if not prompt or prompt[0].get("role") != "system":
                raise ValueError(
                    f"--tool_chat_template: seed prompt {i} has no system message, so TRL's Qwen2.5 template would "
                    "give it Qwen's default one; set --system_prompt (for a question column or string prompts) or "
                    "start each `prompt` conversation with a system message."
                )


def warm_up(model_path, tokenizer, task, script_args, training_args):
    """The family's format warm-up of `model_path` (examples rendered with `tokenizer`'s chat template):
    `(checkpoint, report)`. [`build_task`] has checked that the family has one."""
    examples = task.format_warmup_examples(tokenizer, script_args.warmup_samples, training_args.seed)
    path, seconds = script_args.build_warmup(model_path, examples, training_args)
    return path, {"model": path, "tasks": script_args.warmup_samples, "examples": len(examples), "seconds": seconds}


def card_results(log_history, task, heldout=None):
    """The model card's headline numbers: means over the run of the learnable ratio, proposal invalid rate and the
    family's solver metrics; the held-out accuracy before and after training, overall and per group."""
    results = {}
    for name, key in (
        ("learnable ratio", "unified_filter/learnable_ratio"),
        ("invalid proposals", "proposer/invalid_rate"),
        *task.card_metrics.items(),
    ):
        values = [log[key] for log in log_history if isinstance(log.get(key), (int, float))]
        results[f"{name} (mean over steps)"] = sum(values) / len(values) if values else None
    for when, result in (heldout or {}).items():
        results[f"held-out solver accuracy ({when})"] = result.accuracy
        for group, accuracy in result.by_group.items():
            results[f"held-out accuracy, {result.breakdown} {group} ({when})"] = accuracy
    return results


def main(script_args, training_args, model_args):
    """`recipes/absolute_zero.py`: build the task family and trainer, evaluate the held-out solver questions, self-play,
    evaluate again, and report (metrics.json, plots, model card); returns the training log."""
    started = time.monotonic()
    # Build the task family and its held-out solver questions
    task = build_task(script_args)
    questions = heldout_set(task, script_args, training_args.seed)
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # Load the model and tokenizer
    model_path = resolve_model(model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    tool_template = script_args.tool_chat_template
    if tool_template is None:
        tool_template = task.environment_factory is not None and model_args.model_name_or_path is None
    if tool_template:
        use_tool_chat_template(tokenizer)
    # Load the dataset: the family's seed prompts
    train, evaluation = seed_datasets(script_args, training_args, task, tool_template)
    own_rewards = load_reward_funcs(script_args.reward_funcs)
    if training_args.reward_weights is None and task.reward_weights is not None:
        training_args.reward_weights = [*task.reward_weights, *[1.0] * len(own_rewards)]
    if training_args.learnability_criteria is None and task.learnability_criteria is not None:
        training_args.learnability_criteria = [dict(c) for c in task.learnability_criteria]
    trainer_kwargs = dict(
        reward_funcs=[*task.reward_funcs, *own_rewards],
        args=training_args,
        train_dataset=train,
        processing_class=tokenizer,
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
        environment_factory=task.environment_factory,
        task_state=task.state,
    )
    if script_args.eval_only:
        return eval_only(model_path, task, questions, trainer_kwargs, script_args, training_args, model_args)
    warmup = None
    if script_args.warmup_samples:
        model_path, warmup = warm_up(model_path, tokenizer, task, script_args, training_args)

    load_models_as(model_args, training_args)
    # Initialize the Absolute Zero trainer
    trainer = AbsoluteZeroTrainer(
        model=model_path,
        # evaluate() answers the family's held-out solver questions (`--eval_strategy steps --eval_steps N`)
        heldout_questions=questions if training_args.eval_strategy != "no" else None,
        peft_config=get_peft_config(model_args),
        quantization_config=quantization_config(model_args, training_args),
        **trainer_kwargs,
    )
    # Evaluate before training. Before training, ZeRO-3 and FSDP hold parameter shards that only the engine built by
    # train() gathers: the solver is then evaluated after training only.
    heldout = {}
    if questions is not None and not parameters_sharded(trainer):
        heldout["before"] = evaluate_heldout(trainer, task, questions, "before")
    trainer.accelerator.wait_for_everyone()

    # Train (self-play) and save the model
    clock = time.monotonic()
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    seconds = {"self-play": time.monotonic() - clock}
    save_final_model(trainer, training_args.output_dir)
    # Evaluate after training
    if questions is not None:
        reuse = trainer.heldout_step == trainer.state.global_step  # the last --eval_steps evaluation
        heldout["after"] = evaluate_heldout(trainer, task, questions, "after", reuse)

    # Report: plots, metrics.json, the model card; push to the Hub if asked
    if trainer.accelerator.is_main_process:
        if "before" in heldout:
            plot_heldout_accuracy(
                heldout,
                trainer.state.log_history,
                output_dir / "heldout_accuracy.png",
                title=f"Absolute Zero ({task.name}): held-out solver accuracy, before vs after",
            )
        curves = list(task.learning_curves)
        plot_learning_curves(
            trainer.state.log_history,
            curves,
            output_dir / "learning_curves.png",
            title=f"Absolute Zero self-play ({task.name}, per logging step)",
        )
        steps = [log for log in trainer.state.log_history if "unified_filter/learnable_ratio" in log]
        per_type = sorted({key for log in steps for key in log if key.count("/") == 2 and key.startswith("task/")})
        summary = {key: [log.get(key) for log in steps] for key in curves + per_type}
        report = {"model": model_path, "task": task.name, "per_step": summary}
        if warmup is not None:
            report["warmup"] = warmup
            seconds["format warm-up"] = warmup["seconds"]
        seconds["total"] = time.monotonic() - started
        report["seconds"] = seconds
        if heldout:
            report["heldout"] = {"seed": training_args.seed, **{k: v.to_dict() for k, v in heldout.items()}}
        write_json(output_dir / "metrics.json", {**report, "train_log": trainer.state.log_history})
        for key, values in summary.items():
            print(f"{key:>34}: " + " ".join("-" if v is None else f"{v:.2f}" for v in values))
        if task.state is not None:
            write_json(output_dir / "task_state.json", task.state.state_dict())
        save_settings(output_dir, EVALUATION_SETTINGS, script_args, training_args)
        plots = ["learning_curves.png (self-play metrics per step)"]
        if "before" in heldout:
            print("\n".join(heldout_lines(heldout)))
            plots.append("heldout_accuracy.png (held-out accuracy before/after, learnable ratio per step)")
        elif questions is not None:
            print("held-out evaluation before training skipped: under ZeRO-3 or FSDP only train() gathers the shards")
        print(time_summary(seconds))
        print(f"report and plots in {output_dir}: " + ", ".join(plots))
    write_model_card(
        trainer,
        script_args,
        f"self-play from the built-in {task.name} seed prompts (`trl_ext.self_play`)",
        card_results(trainer.state.log_history, task, heldout),
    )
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    return trainer.state.log_history


def eval_only(model_path, task, questions, trainer_kwargs, script_args, training_args, model_args):
    """`--eval_only`: the solver's accuracy on the family's held-out questions, answered by `model_path` (a model, or
    a LoRA adapter merged into its base) through the trainer's held-out evaluation: `evaluation.json` (accuracy
    overall and per group, n, settings) and `evaluation.jsonl` (every question, reply and score, one line each)."""
    if questions is None:
        raise ValueError(
            f"--eval_only evaluates the family's held-out solver questions: the {task.name} family has none"
            if task.heldout_questions is None
            else "--eval_only evaluates the held-out solver questions: --heldout_size 0 leaves none."
        )
    model, _ = eval_model(model_path, model_args, training_args)
    trainer = AbsoluteZeroTrainer(model=model, heldout_questions=questions, **trainer_kwargs)
    if parameters_sharded(trainer):
        raise ValueError(
            "--eval_only evaluates without ZeRO-3 or FSDP (their shards are gathered only by train()'s engine): "
            "launch it without the sharded accelerate config."
        )
    result = evaluate_heldout(trainer, task, questions, "eval", rows_file="evaluation.jsonl")
    if not trainer.accelerator.is_main_process:
        return None
    output_dir = Path(training_args.output_dir)
    write_json(
        output_dir / "evaluation.json",
        {
            "model": model_path,
            "questions": len(questions),
            "samples_per_question": training_args.eval_num_samples,
            **result.to_dict(),
            "settings": settings_values(EVALUATION_SETTINGS, script_args, training_args),
        },
    )
    groups = ", ".join(f"{result.breakdown} {g} (n={result.counts[g]}) {a:.3f}" for g, a in result.by_group.items())
    print(
        f"held-out solver accuracy, {len(questions)} questions x {training_args.eval_num_samples} sample(s): "
        f"{result.accuracy:.3f}" + (f"; {groups}" if groups else "") + f"\nreport in {output_dir}: evaluation.json, "
        "evaluation.jsonl"
    )
    return None


# The embedded-default run: used when the command line names neither a model nor a config.
DEFAULT_CONFIG = "absolute_zero_smollm2_cpu.yaml"


def run(argv=None) -> None:
    """The Absolute Zero recipe's command line (`trl-ext absolute_zero`, `recipes/absolute_zero.py`): parse `argv` (default: `sys.argv[1:]`) and run
    [`main`]."""

    run_recipe(
        main,
        AbsoluteZeroScriptArguments,
        AbsoluteZeroConfig,
        config_path(DEFAULT_CONFIG),
        argv,
        reuse_evaluation_settings,
    )
