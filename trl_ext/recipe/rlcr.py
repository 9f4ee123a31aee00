"""The RLCR recipe (`recipes/rlcr.py`): its flags, data, calibration evaluation and report, and its `main`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import get_peft_config

from ..evaluation.agreement import sampling_agreement
from ..evaluation.calibration import plot_reliability_diagrams, reliability_diagram
from ..evaluation.confidence_samples import mean_confidence, sampled_confidences
from ..evaluation.records import write_jsonl
from ..evaluation.rlcr import calibration_evaluation, evaluate_calibration
from ..models.agreement_warmup import agreement_examples, balanced_by_share, share_distribution
from ..models.probability_warmup import probability_examples
from ..models.warmup import rlcr_format_examples
from ..rewards.functions import is_missing, verify_answer
from ..trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer
from .cli import (
    DATA_SETTINGS,
    FormatWarmupArguments,
    RecipeScriptArguments,
    config_path,
    eval_model,
    load_function,
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
            from spread confidences (siblings that differ, hence confidence advantages) rather than from a habit;
            `"agreement"`, the model's own sampling agreement distilled into the stated confidence: after the
            `"weighted"` warm-up (the same rows, with gold answers), `warmup_agreement_samples` answers are sampled
            per warm-up row at temperature 1, and a second warm-up of the same settings trains the confidence turn to
            state, for up to two of the distinct answers sampled, the share of the samples that gave it (as many
            examples per stated value), beside the first stage's answer turns (gold) again (see
            [`~trl_ext.models.agreement_warmup`]); the samples are drawn once and cached; `"answer_probability"`,
            after the `"weighted"` warm-up too, the first stage's checkpoint answers each RL row greedily, and a
            second warm-up trains the confidence turn to state, after that answer, the chance that it is right read
            off the probability the model gave it (a logistic fit of the rows' correctness on its log-odds, rounded
            to a tenth; as many examples per stated value), beside the first stage's answer turns, repeated to about
            as many (see [`~trl_ext.models.probability_warmup`]); computed once and cached. The embedded default's
            CPU config uses it.
        warmup_agreement_samples (`int`, *optional*, defaults to `8`):
            Answers sampled per warm-up row at temperature 1 by `warmup_confidences="agreement"` (its stated
            confidences are multiples of 1/k rounded to a tenth). Unused by the other draws.
        agreement_samples (`int`, *optional*, defaults to `0`):
            With k > 0, every report evaluation also samples k answers per held-out question at temperature 1 and
            scores the share that agree with the greedy answer as a confidence: the untrained reference point beside
            the stated confidence, with its cost in generated tokens (`sampling_agreement` in the report). About k
            times the answers' generation time; greedy evaluations in one process only.
        confidence_samples (`int`, *optional*, defaults to `0`):
            With k > 0, every report evaluation also samples k confidence-turn replies per held-out greedy answer at
            temperature 1 (on the greedy confidence turn's own prompt) and scores the mean of the confidences that
            parse as a second confidence column beside the greedy one (`stated_confidence_mean_of_k` in the report;
            per answer `sampled_confidences` and `confidence_mean`, `None` when none of the k parsed): whether the
            stated-confidence distribution, not only its mode, knows which answers are right. Costs k short replies
            per question (reported in generated tokens); greedy evaluations in one process only.
        group_column (`str`, *optional*, defaults to `"level"`):
            The held-out rows' column that groups the questions (the built-in data's difficulty level, or a column of
            your file). The report then adds the AUROC within groups (right/wrong pairs of the same group only) and
            the Brier skill against each group's accuracy: what the stated confidence knows beyond the group. Rows
            without the column get no group metrics.
    """

    warmup_confidences: str = field(
        default="weighted",
        metadata={
            "help": "Draw of the warm-up's stated confidences: 'weighted' (mostly high), 'uniform', or 'agreement' "
            "(then a second warm-up on the share of sampled answers agreeing with each answer, beside the first "
            "warm-up's gold answer turns), or 'answer_probability' (a second warm-up stating the chance, read off its "
            "probability, that the model's greedy answer to each RL row is right).",
            "choices": ["weighted", "uniform", "agreement", "answer_probability"],
        },
    )
    warmup_agreement_samples: int = field(
        default=8,
        metadata={"help": "Answers sampled per warm-up row by --warmup_confidences agreement."},
    )
    accuracy_func: str | None = field(
        default=None,
        metadata={"help": "Your correctness check f(gold: str, prediction: str) -> bool, as module.function."},
    )
    rlcr_paper_metrics: bool = field(
        default=False,
        metadata={
            "help": "Also report calibration in the RLCR paper's convention (bin edges to the upper bin, "
            "unparsable confidences scored as 0), under `rlcr_paper` in metrics.json."
        },
    )
    agreement_samples: int = field(
        default=0,
        metadata={
            "help": "Also score the held-out answers with the model's sampling agreement (k answers sampled at "
            "temperature 1, the share agreeing with the greedy one) as an untrained reference; 0: off."
        },
    )
    confidence_samples: int = field(
        default=0,
        metadata={
            "help": "Also score the held-out answers with the mean of k stated confidences sampled at temperature 1 "
            "on the greedy confidence turn's prompt, beside the greedy confidence; 0: off."
        },
    )
    group_column: str | None = field(
        default="level",
        metadata={
            "help": "Held-out rows' column grouping the questions (the built-in data's level): AUROC within groups "
            "and Brier skill against each group's accuracy. Rows without it: no group metrics."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        for name in ("agreement_samples", "confidence_samples"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be 0 (off) or more (got {getattr(self, name)}).")
        if self.warmup_agreement_samples < 1:
            raise ValueError(
                f"--warmup_agreement_samples must be at least 1 (got {self.warmup_agreement_samples}); 8 or more "
                "give shares that tell answers apart."
            )


# What a reported evaluation depends on beyond the model and the data: written to `evaluation_settings.json` with the
# model, and reused by `--eval_only` on that directory (see `reuse_evaluation_settings`).
EVALUATION_SETTINGS = (
    *DATA_SETTINGS,
    "max_confidence_length",
    "confidence_prompt",
    "answer_tag",
    "confidence_tag",
    "lenient_parsing",
    "rlcr_paper_metrics",
    "group_column",
    "agreement_samples",
    "confidence_samples",
    "eval_split",
    "accuracy_func",
)


def evaluation_settings(script_args, training_args) -> dict:
    """The settings of `EVALUATION_SETTINGS` this run evaluated with."""
    return settings_values(EVALUATION_SETTINGS, script_args, training_args)


def reuse_evaluation_settings(argv: list[str]) -> list[str]:
    """`--eval_only` on a directory this recipe trained: its settings, flags overriding (see `reuse_settings`)."""
    return reuse_settings(argv, EVALUATION_SETTINGS)


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


def write_evaluation(result, output_dir, name, files=None, header=None):
    """`reliability_<name>.png`, the metrics with their intervals in `eval_<name>.json`, and every question, answer
    and confidence in `eval_<name>.jsonl` (one line per answer). `files`: the plot's name and the other two's stem;
    `header`: fields written in the JSON before the metrics."""
    plot, stem = files or (f"reliability_{name}.png", f"eval_{name}")
    output_dir = Path(output_dir)
    reliability_diagram(
        result.report,
        output_dir / plot,
        title=f"{name}: accuracy {result.accuracy:.2f}, parse failures {result.confidence_parse_fail_rate:.0%}"
        + _group_caption(result.report),
    )
    write_json(output_dir / f"{stem}.json", {**(header or {}), **result.to_dict()})
    write_jsonl(output_dir / f"{stem}.jsonl", result.rows)


def _group_caption(report) -> str:
    """The plot title's second line: what a constant or a group-only confidence would not score."""
    line = f"\nBrier skill {_num(report.brier_skill)}"
    if report.auroc_within_groups is not None:
        line += f", AUROC within groups {_num(report.auroc_within_groups)}"
    return line


def heldout_evaluation(
    trainer,
    evaluation,
    name,
    rlcr_paper_metrics=False,
    reuse_last=False,
    agreement_samples=0,
    files=None,
    header=None,
    confidence_samples=0,
):
    """The held-out evaluation of the trainer's model (`trainer.heldout_evaluate()`, a collective: every process calls
    it) as a calibration report; the main process writes its files (see `write_evaluation`). `reuse_last`: the model
    was evaluated last at this step (the final `--eval_steps` evaluation), so its records are reported instead of
    generating them again. `agreement_samples`: also the sampling agreement of the greedy answers
    (`--agreement_samples`); `confidence_samples`: also the mean of that many sampled stated confidences per answer
    (`--confidence_samples`). `files`, `header`: see `write_evaluation`."""
    if not reuse_last:
        trainer.heldout_evaluate(evaluation)
    k = trainer.args.eval_num_samples
    golds = evaluation[trainer.args.solution_column]
    rows = [
        {**record, "gold": None if is_missing(golds[i // k]) else str(golds[i // k])}
        for i, record in enumerate(trainer.heldout_records)
    ]
    cost = confidence_cost = None
    with trainer.accelerator.autocast():  # the training's precision, before train() as after (see evaluate_base)
        if agreement_samples:
            cost = add_sampling_agreement(trainer, evaluation, rows, agreement_samples)
        if confidence_samples:
            confidence_cost = add_confidence_samples(trainer, rows, confidence_samples)
    result = calibration_evaluation(
        rows,
        rlcr_paper_convention=rlcr_paper_metrics,
        seed=trainer.args.seed,
        agreement_cost=cost,
        confidence_samples_cost=confidence_cost,
    )
    if trainer.accelerator.is_main_process:
        write_evaluation(result, trainer.args.output_dir, name, files, header)
    return result


def evaluate_base(base_path, tokenizer, evaluation, trainer, script_args, model_args):
    """The base model (before the format warm-up) evaluated greedily on `evaluation`, by every process on its own
    training device (`trainer.accelerator.device`): each answers the same rows, so none waits on another in a
    collective (one process evaluating alone on CPU would keep the others waiting past the collective timeout at
    1.5B). The main process writes `reliability_base.png`, `eval_base.json` and `eval_base.jsonl`. It generates
    under the trainer's mixed precision, as the trainer's own evaluations do."""
    accelerator = trainer.accelerator
    base = AutoModelForCausalLM.from_pretrained(
        base_path, dtype=model_args.dtype, revision=model_args.model_revision
    ).to(accelerator.device)
    with accelerator.autocast():
        result = evaluate_calibration(
            base,
            tokenizer,
            evaluation,
            trainer.args,
            batch_size=trainer.args.per_device_eval_batch_size,
            rlcr_paper_convention=script_args.rlcr_paper_metrics,
            accuracy_func=accuracy_func(script_args) or verify_answer,
            progress=accelerator.is_main_process,
            group_column=script_args.group_column,
            agreement_samples=script_args.agreement_samples,
            confidence_samples=script_args.confidence_samples,
        )
    del base
    if accelerator.is_main_process:
        write_evaluation(result, trainer.args.output_dir, "base")
    return result


def add_sampling_agreement(trainer, evaluation, rows, k) -> dict:
    """Each row's `agreement`: the share of k answers sampled at temperature 1 (the trainer's model, its prompt
    rendering) that agree with the row's greedy answer; returns the cost (`samples_per_question`,
    `generated_tokens`)."""
    args = trainer.args
    check_greedy_one_process(trainer, "agreement_samples")
    prompt_ids = trainer._heldout_prompt_ids(list(evaluation["prompt"]))
    shares, tokens = sampling_agreement(
        trainer.accelerator.unwrap_model(trainer.model),
        trainer.processing_class,
        prompt_ids,
        [row["answer"] for row in rows],
        k,
        args.max_completion_length,
        args.answer_tag,
        args.lenient_parsing,
        rows_per_call=args.per_device_eval_batch_size,
        seed=args.seed,
    )
    for row, share in zip(rows, shares, strict=True):
        row["agreement"] = share
    return {"samples_per_question": k, "generated_tokens": tokens}


def add_confidence_samples(trainer, rows, k) -> dict:
    """Each row's `sampled_confidences`: the confidences of k confidence-turn replies sampled at temperature 1 on the
    prompt the row's greedy confidence turn had (the trainer's model; `None`: unparsable), and their mean
    `confidence_mean` over those that parse; returns the cost (`samples_per_question`, `generated_tokens`)."""
    args = trainer.args
    check_greedy_one_process(trainer, "confidence_samples")
    prompts = trainer.heldout_confidence_prompt_ids or []
    if len(prompts) != len(rows):
        raise RuntimeError(f"{len(prompts)} confidence-turn prompts kept for {len(rows)} held-out answers.")
    values, tokens = sampled_confidences(
        trainer.accelerator.unwrap_model(trainer.model),
        trainer.processing_class,
        prompts,
        k,
        args.max_confidence_length,
        args.confidence_tag,
        args.lenient_parsing,
        rows_per_call=args.per_device_eval_batch_size,
        seed=args.seed,
    )
    for row, sampled in zip(rows, values, strict=True):
        row["sampled_confidences"], row["confidence_mean"] = sampled, mean_confidence(sampled)
    return {"samples_per_question": k, "generated_tokens": tokens}


def check_greedy_one_process(trainer, flag):
    """`--<flag>` samples again from the greedy evaluation's records: one process, one greedy answer per question."""
    args = trainer.args
    if trainer.accelerator.num_processes > 1 or args.eval_num_samples != 1 or args.eval_temperature > 0:
        raise ValueError(
            f"--{flag} needs a greedy evaluation (--eval_num_samples 1, --eval_temperature 0) in one "
            f"process; run the evaluation without accelerate's multi-process launch, or set --{flag} 0."
        )


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
                    f"Brier skill ({name})": r.report.brier_skill,
                    **(
                        {f"AUROC within groups ({name})": r.report.auroc_within_groups}
                        if r.report.auroc_within_groups is not None
                        else {}
                    ),
                }
            )
    return results


def _num(value):
    """3 decimals; n/a when undefined (AUROC without both classes, any metric without a parsed confidence)."""
    return "n/a" if value is None or value != value else f"{value:.3f}"


def _ci(report, name, value) -> str:
    """A metric with its bootstrap 95% interval when the report has one: `0.500 [0.430, 0.570]`."""
    interval = report.intervals.get(name)
    return _num(value) + (f" [{_num(interval[0])}, {_num(interval[1])}]" if interval else "")


def metrics_line(result, indent: str = "") -> str:
    """n, accuracy, ECE, Brier, AUROC, Brier skill (and within groups) with their intervals, on two lines."""
    r = result.report
    accuracy = _num(result.accuracy)
    if result.accuracy_interval:
        accuracy += f" [{_num(result.accuracy_interval[0])}, {_num(result.accuracy_interval[1])}]"
    line = (
        f"n {len(result.rows)}  accuracy {accuracy}  ECE {_ci(r, 'ece', r.ece)}  Brier {_ci(r, 'brier', r.brier)}  "
        f"AUROC {_ci(r, 'auroc', r.auroc)}  confidence parse failures {result.confidence_parse_fail_rate:.0%}"
        f"\n{indent}Brier skill {_ci(r, 'brier_skill', r.brier_skill)}"
    )
    if r.auroc_within_groups is not None:
        line += (
            f"  AUROC within groups {_ci(r, 'auroc_within_groups', r.auroc_within_groups)}  Brier skill against "
            f"the groups' accuracies {_ci(r, 'brier_skill_groups', r.brier_skill_groups)}"
        )
    a = result.agreement_report
    if a is not None:
        cost = result.agreement_cost or {}
        line += (
            f"\n{indent}reference, sampling agreement of {cost.get('samples_per_question')} answers at temperature 1 "
            f"({cost.get('generated_tokens')} generated tokens): AUROC {_ci(a, 'auroc', a.auroc)}  Brier skill "
            f"{_ci(a, 'brier_skill', a.brier_skill)}"
        )
        if a.auroc_within_groups is not None:
            line += f"  AUROC within groups {_ci(a, 'auroc_within_groups', a.auroc_within_groups)}"
    m = result.mean_report
    if m is not None:
        cost = result.mean_cost or {}
        line += (
            f"\n{indent}stated confidence, mean of {cost.get('samples_per_question')} samples at temperature 1 "
            f"({cost.get('generated_tokens')} generated tokens, none parsed for {result.mean_parse_fail_rate:.0%}): "
            f"ECE {_ci(m, 'ece', m.ece)}  AUROC {_ci(m, 'auroc', m.auroc)}  Brier skill "
            f"{_ci(m, 'brier_skill', m.brier_skill)}"
        )
        if m.auroc_within_groups is not None:
            line += f"  AUROC within groups {_ci(m, 'auroc_within_groups', m.auroc_within_groups)}"
    return line


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
    second = script_args.warmup_confidences if script_args.warmup_confidences in SECOND_STAGES else None
    examples = rlcr_format_examples(
        rows,
        training_args.confidence_prompt,
        seed=training_args.seed,
        answer_tag=training_args.answer_tag,
        confidence_tag=training_args.confidence_tag,
        # the two-stage draws start from the "weighted" warm-up: the same examples, hence the same cached checkpoint
        confidence_draw="weighted" if second else script_args.warmup_confidences,
    )
    path, seconds = script_args.build_warmup(model_path, examples, training_args)
    report = {"model": path, "rows": len(rows), "examples": len(examples), "seconds": seconds}
    rest = train.select(range(n, len(train)))
    if second:
        # The answer turns: the examples whose prompt holds no assistant message yet (the others are confidence turns).
        answer_turns = [e for e in examples if all(m["role"] != "assistant" for m in e["prompt"])]
        stage = SECOND_STAGES[second]
        # the agreement stage samples the warm-up rows again; the answer-probability stage answers the RL rows, whose
        # gold answers the first stage never saw (it would be right on its own warm-up rows far more often)
        report[second] = stage(path, rows if second == "agreement" else rest, answer_turns, script_args, training_args)
        path = report["model"] = report[second]["model"]
        report["seconds"] += report[second]["seconds"]
    return path, rest, report


def agreement_stage(stage1, rows, answer_turns, script_args, training_args) -> dict:
    """`--warmup_confidences agreement`'s second stage: `stage1` fine-tuned again, with the same settings, on
    confidence turns stating the share of `--warmup_agreement_samples` sampled answers that agree with each answer
    (sampled once and cached), beside the first stage's `answer_turns` again. Without them the stage trained only
    confidence turns, most of them stating 0.1, and that reached the answer turn through the shared weights: the
    embedded default then answered `<answer>0.1</answer>` (0 of 200 tune questions right). Returns its report: the
    checkpoint, what was sampled, the examples' stated confidences (`shares`: examples per value) and the seconds
    this call took (`sampling_seconds`: the sampling's when it ran, possibly in an earlier run)."""
    started = time.monotonic()
    built = agreement_examples(
        stage1,
        rows,
        script_args.warmup_agreement_samples,
        training_args.confidence_prompt,
        seed=training_args.seed,
        max_new_tokens=training_args.max_completion_length,
        answer_tag=training_args.answer_tag,
        confidence_tag=training_args.confidence_tag,
        lenient=training_args.lenient_parsing,
        chat_template_kwargs=training_args.chat_template_kwargs,
        use_cpu=training_args.use_cpu,
    )
    stats = built["stats"]
    if not built["examples"]:
        raise ValueError(
            f"--warmup_confidences agreement: none of the {stats['samples_per_row']} answers sampled for each of "
            f"{stats['rows_sampled']} warm-up rows had a parsable <{training_args.answer_tag}> tag, so there is no "
            "share to state. Use --warmup_confidences weighted, more --warmup_samples or --warmup_epochs, or "
            "--lenient_parsing."
        )
    return second_stage(stage1, built["examples"], stats, answer_turns, script_args, training_args, started)


def probability_stage(stage1, rows, answer_turns, script_args, training_args, twins=None) -> dict:
    """`--warmup_confidences answer_probability`'s second stage: `stage1` fine-tuned again, with the same settings, on
    confidence turns stating the chance that its greedy answer to each of `rows` (those with a gold answer) is right,
    read off the probability it gives that answer (computed once and cached, [`~trl_ext.models.probability_warmup`]),
    beside the first stage's `answer_turns` (gold) again. Returns its report, as [`agreement_stage`]'s. `twins`: as
    [`second_stage`]'s."""
    started = time.monotonic()
    judged = [row for row in rows if not is_missing(row[training_args.solution_column])]
    if not judged:
        raise ValueError(
            f"--warmup_confidences answer_probability: none of the {len(rows)} RL rows has a gold answer in "
            f"'{training_args.solution_column}' to judge the model's answers by. Give gold answers, or use "
            "--warmup_confidences weighted."
        )
    built = probability_examples(
        stage1,
        judged,
        training_args.confidence_prompt,
        solution_column=training_args.solution_column,
        max_new_tokens=training_args.max_completion_length,
        answer_tag=training_args.answer_tag,
        confidence_tag=training_args.confidence_tag,
        lenient=training_args.lenient_parsing,
        accuracy_func=script_args.accuracy_func,
        chat_template_kwargs=training_args.chat_template_kwargs,
        use_cpu=training_args.use_cpu,
    )
    return second_stage(
        stage1, built["examples"], built["stats"], answer_turns, script_args, training_args, started, twins
    )


def second_stage(
    stage1, confidence_turns, stats, answer_turns, script_args, training_args, started, twins=None
) -> dict:
    """`stage1` fine-tuned on `confidence_turns` (as many per stated value) beside `answer_turns`, repeated to about
    as many (the answers are trained as much as the confidence); its report. `twins`: a function of the balanced
    confidence turns giving more examples to train beside them (the calibration benchmark's single-turn format,
    benchmarks/rlcr_bench.py); the recipe has none."""
    balanced = balanced_by_share(confidence_turns, training_args.seed, training_args.confidence_tag)
    # The embedded default's stage states 800 confidences beside 200 answer turns: with each answer turn once, the
    # greedy accuracy after the stage fell in each of three seeds (0.255 -> 0.125, 0.275 -> 0.24, 0.145 -> 0.085 on
    # the tune split, against 400 confidences; docs/benchmarks.md, RLCR ablations).
    repeats = max(1, round(len(balanced) / len(answer_turns)))
    examples = [*answer_turns * repeats, *balanced, *(twins(balanced) if twins else ())]
    path, sft_seconds = script_args.build_warmup(stage1, examples, training_args)
    return {
        "model": path,
        **stats,
        "answer_turn_repeats": repeats,
        "balanced_shares": share_distribution(balanced, training_args.confidence_tag),
        "sft_seconds": sft_seconds,
        "seconds": time.monotonic() - started,
    }


# The two-stage warm-up draws: `--warmup_confidences` -> the second stage, after the "weighted" warm-up.
SECOND_STAGES = {"agreement": agreement_stage, "answer_probability": probability_stage}


def summary(report, output_dir, seconds):
    """What the run printed last: the evaluations side by side, the time, and where the plots are."""
    names = {"base": "base model", "before": "before RL", "after": "after RL"}
    if "warmup" in report:
        names["before"] = "before RL (after the format warm-up)"
    lines = []
    for key, label in names.items():
        if key in report:
            r = report[key]
            lines.append(f"{label:>38}: {metrics_line(r, ' ' * 40)}{_paper_line(r)}")
    if lines:
        lines.append(f"{'':>40}(bootstrap 95% intervals in brackets)")
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
    # Load the model and tokenizer
    model_path = resolve_model(model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    # Load the dataset: training questions and the held-out split
    train, evaluation = datasets_for(script_args, training_args)
    if script_args.eval_only:
        eval_only(model_path, evaluation, script_args, training_args, model_args)
        return
    load_models_as(model_args, training_args)

    # Format warm-up: a short SFT so the base model states a parsable confidence
    report = {"model": model_path}
    if script_args.warmup_samples:
        base_path = model_path
        model_path, train, report["warmup"] = warm_up(model_path, train, script_args, training_args)
        seconds["format warm-up"] = report["warmup"]["seconds"]

    # Initialize the RLCR trainer
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
        quantization_config=quantization_config(model_args, training_args),
    )
    trainer.heldout_group_column = script_args.group_column
    # Evaluate before training. Before training, ZeRO-3 and FSDP hold parameter shards that only the engine built by
    # train() gathers: the model is then evaluated after training only.
    before_log = []  # the evaluation before training, which train() (starting a fresh TrainerState) would not keep
    if evaluation is not None and not parameters_sharded(trainer):
        clock = time.monotonic()
        if "warmup" in report:  # what the warm-up changed: the base model states no parsable confidence
            report["base"] = evaluate_base(base_path, tokenizer, evaluation, trainer, script_args, model_args)
        report["before"] = heldout_evaluation(
            trainer,
            evaluation,
            "before",
            script_args.rlcr_paper_metrics,
            agreement_samples=script_args.agreement_samples,
            confidence_samples=script_args.confidence_samples,
        )
        before_log = [trainer.state.log_history[-1]]
        seconds["evaluation"] = time.monotonic() - clock
    trainer.accelerator.wait_for_everyone()

    # Train and save the model
    clock = time.monotonic()
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    seconds["RL training"] = time.monotonic() - clock
    save_final_model(trainer, training_args.output_dir)

    # Evaluate after training
    if evaluation is not None:
        clock = time.monotonic()
        reuse = trainer.heldout_step == trainer.state.global_step  # the last --eval_steps evaluation
        report["after"] = heldout_evaluation(
            trainer,
            evaluation,
            "after",
            script_args.rlcr_paper_metrics,
            reuse,
            script_args.agreement_samples,
            confidence_samples=script_args.confidence_samples,
        )
        seconds["evaluation"] = seconds.get("evaluation", 0.0) + time.monotonic() - clock
    # Report: plots, metrics.json, the model card; push to the Hub if asked
    history = before_log + trainer.state.log_history
    if trainer.accelerator.is_main_process:
        if "before" in report and "after" in report:
            plot_reliability_diagrams(
                {k: report[k].report for k in ("before", "after")},
                output_dir / "reliability_before_after.png",
                title="RLCR: before vs after RL (held-out; Brier skill "
                f"{_num(report['before'].report.brier_skill)} -> {_num(report['after'].report.brier_skill)}"
                + (
                    f", AUROC within groups {_num(report['before'].report.auroc_within_groups)} -> "
                    f"{_num(report['after'].report.auroc_within_groups)})"
                    if report["after"].report.auroc_within_groups is not None
                    else ")"
                ),
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
        save_settings(output_dir, EVALUATION_SETTINGS, script_args, training_args)
        print(summary(report, output_dir, seconds))
    write_model_card(trainer, script_args, BUILTIN_DATA, card_results(report))
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


# What `--eval_only` writes (beside the model unless --output_dir says otherwise): never a training run's files.
# The plot, and the stem of the metrics (.json) and the per-answer records (.jsonl).
EVAL_ONLY_FILES = ("evaluation_reliability.png", "evaluation")


def eval_only(model_path, evaluation, script_args, training_args, model_args):
    """`--eval_only`: the held-out evaluation of `model_path` (a model, or a LoRA adapter merged into its base; the
    trainer's evaluation, as in training; nothing is trained): `evaluation.json` (metrics, n, settings),
    `evaluation.jsonl` (every answer and confidence) and `evaluation_reliability.png`."""
    if evaluation is None:
        raise ValueError("--eval_only needs held-out rows: give --num_eval_samples or a --dataset_test_split.")
    model, tokenizer_source = eval_model(model_path, model_args, training_args)
    trainer = RLCRMultiTurnTrainer(
        model=model,
        reward_funcs=load_reward_funcs(script_args.reward_funcs),
        accuracy_func=accuracy_func(script_args),
        args=training_args,
        train_dataset=evaluation,
        eval_dataset=evaluation,  # a config's eval_strategy (steps) needs one
        processing_class=AutoTokenizer.from_pretrained(tokenizer_source, revision=model_args.model_revision),
    )
    trainer.heldout_group_column = script_args.group_column
    if parameters_sharded(trainer):
        raise ValueError(
            "--eval_only evaluates without ZeRO-3 or FSDP (their shards are gathered only by train()'s engine): "
            "launch it without the sharded accelerate config."
        )
    result = heldout_evaluation(
        trainer,
        evaluation,
        "eval",
        script_args.rlcr_paper_metrics,
        agreement_samples=script_args.agreement_samples,
        confidence_samples=script_args.confidence_samples,
        files=EVAL_ONLY_FILES,
        header={
            "model": model_path,
            "questions": len(evaluation),
            "samples_per_question": training_args.eval_num_samples,
            "settings": evaluation_settings(script_args, training_args),
        },
    )
    if not trainer.accelerator.is_main_process:
        return
    output_dir = Path(training_args.output_dir)
    k = training_args.eval_num_samples
    print(
        f"{len(evaluation)} questions x {k} sample(s), {result.report.n} with a parsed confidence:\n"
        f"{metrics_line(result)}{_paper_line(result)}\n(bootstrap 95% intervals in brackets)\n"
        f"report in {output_dir}: evaluation.json, evaluation.jsonl (one line per answer), {EVAL_ONLY_FILES[0]}"
    )


# The embedded-default run: used when the command line names neither a model nor a config.
DEFAULT_CONFIG = "rlcr_smollm2_cpu.yaml"


def run(argv=None) -> None:
    """The RLCR recipe's command line (`trl-ext rlcr`, `recipes/rlcr.py`): parse `argv` (default: `sys.argv[1:]`) and run
    [`main`]."""

    run_recipe(
        main, RLCRScriptArguments, RLCRMultiTurnConfig, config_path(DEFAULT_CONFIG), argv, reuse_evaluation_settings
    )
