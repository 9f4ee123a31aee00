"""RLCR benchmarks on the embedded default (SmolLM2-135M-Instruct), CPU.

    python benchmarks/rlcr_bench.py overhead      # step time vs plain GRPOTrainer on the same generated tokens
    python benchmarks/rlcr_bench.py calibration   # ECE/Brier per step: multi-turn RLCR vs single-turn RLCR
    python benchmarks/rlcr_bench.py calibration --split report   # the published run: the report split

Results: benchmarks/results/rlcr_<part>.json and .png (calibration on the tune split: rlcr_calibration_tune.*), each
JSON with its provenance (commit, packages, device, command line, seeds); calibration's final evaluations' per-sample
records (method, seed, question, level, answer, correct, stated confidence, sampling agreement) in the .jsonl beside.

overhead: both trainers get scripted completions of fixed lengths (generation cost is identical by construction and
excluded), so the ratio measures what RLCR adds per step: the second scoring pass, turn-2 prompts (longer: they
contain the answer), span masks, metrics. RLCR runs twice: with the packed loss forward (`share_prefix=True`, the
default) and with rows scored one by one. GRPO runs twice too: as TRL ships it (on CPU its fused LM head scores
every prompt position, in 4096-token tiles) and on the trainers' CPU log-prob path (labelled positions only, in
`cpu_logprob_tile_tokens` tiles): the ratio to the first is what a user sees, to the second what RLCR's algorithm
costs. The four trainers are built once and run one step each in turn (A B C D A B C D ...), so load on a shared
machine lands on all of them alike; per trainer the min, median and spread of `step_time` after one warm-up step, and
the ratios of the medians and of the mins to each GRPO.

calibration: multi-turn RLCR (the recipe's embedded-default run: G_a answers, then G_c confidences per answer)
against single-turn RLCR (answer and confidence in one completion, reward accuracy + Brier, plain GRPOTrainer), both
from one format warm-up that teaches both formats (so that the single-turn baseline states confidences at all), with
the recipe's learning rate, temperature and step count, and as many generated tokens per step. Both are evaluated
greedily on the recipe's held-out questions before training and every `--evaluate-every` steps, once per seed in
`--seeds` (a seed is the whole pipeline: the warm-up is built per seed, as the recipe's `--seed` builds it); curves
against cumulative generated tokens, mean and min-max over seeds. The held-out questions are the built-in data's
`--split` (`tune` by default: choose settings there; `report` only for the published numbers). Beside accuracy, ECE,
Brier and AUROC: the Brier skill against the best constant and, within difficulty levels, the AUROC and the skill
against each level's accuracy (a confidence that only reads the level scores 0.5 and 0), with bootstrap 95%
intervals at the final evaluation, and the untrained reference: the sampling agreement of `--agreement-samples`
answers at temperature 1 with the greedy answer, and its cost in generated tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from common import (
    device_args,
    device_name,
    fixed_length,
    interleaved_step_times,
    load_model,
    machine_load,
    on_cuda,
    plot_step_times,
    results_dir,
    rlcr_cpu_run,
    summarize,
    write_result,
)
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from trl_ext import default_model_path
from trl_ext.data import graded_arithmetic
from trl_ext.evaluation.agreement import sampling_agreement
from trl_ext.evaluation.calibration import brier_score, expected_calibration_error
from trl_ext.evaluation.greedy import greedy_completions
from trl_ext.evaluation.records import prompt_text
from trl_ext.evaluation.rlcr import calibration_evaluation, evaluate_calibration
from trl_ext.models.logprob_tiles import CPULogprobTiles
from trl_ext.models.warmup import rlcr_format_examples
from trl_ext.rewards import extract_answer, extract_confidence, make_accuracy_reward, verify_answer
from trl_ext.rewards.parsing import completion_text
from trl_ext.testing import ScriptedGeneration, cpu_test_args
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer
from trl_ext.trainers.base import TrlExtGRPOConfig


RESULTS = results_dir()
CONFIDENCE_PROMPT = (
    "How likely is it that your answer above is correct? Reply with a probability between 0 and 1 inside "
    "<confidence></confidence>, for example <confidence>0.7</confidence>."
)


# -- overhead -----------------------------------------------------------------------------------------------------
def overhead(steps: int, model_path: str | None = None) -> dict:
    answer_len, confidence_len, g_a, g_c = 32, 16, 4, 2
    model_path = model_path or default_model_path()
    tok = AutoTokenizer.from_pretrained(model_path)  # each trainer below loads its own model
    answer = fixed_length(tok, "<think>adding</think><answer>7</answer>", answer_len)
    confidence = fixed_length(tok, "<confidence>0.7</confidence>", confidence_len)
    data = graded_arithmetic(64, seed=0)
    common = dict(
        max_steps=steps + 1,
        learning_rate=1e-6,
        activation_checkpointing=False,
        shuffle_dataset=False,
        max_completion_length=answer_len,
        **device_args(),
    )
    runs = {}

    # Plain GRPO on the same generated tokens: one prompt's 4 rows of answer length, two prompts' 8 rows of
    # confidence length (12 rows, 4*32 + 8*16 tokens), with accuracy as the reward; as TRL ships it, and on the
    # trainers' CPU log-prob path (labelled positions only, small tiles): the ratio to the second measures RLCR's
    # algorithm, to the first what a user sees.
    for name, trainer_cls, config_cls in (
        ("grpo", GRPOTrainer, GRPOConfig),
        ("grpo_cpu_tiles", GRPOWithCPULogprobTiles, TrlExtGRPOConfig),
    ):
        model, tok = load_model(model_path)
        args = cpu_test_args(
            tempfile.mkdtemp(), config_cls, per_device_train_batch_size=g_a * (1 + g_c), num_generations=g_a, **common
        )
        grpo = trainer_cls(
            model=model, reward_funcs=make_accuracy_reward(), args=args, train_dataset=data, processing_class=tok
        )
        calls = []

        def grpo_script(prompt_text, k, calls=calls):
            calls.append(prompt_text)
            return answer if (len(calls) - 1) % 12 < g_a else confidence

        runs[name] = (grpo, ScriptedGeneration(grpo, grpo_script))

    # RLCR with the packed loss forward (default) and with rows scored one by one.
    for name, share_prefix in (("rlcr", True), ("rlcr_unpacked", False)):
        model, tok = load_model(model_path)
        args = cpu_test_args(
            tempfile.mkdtemp(),
            RLCRMultiTurnConfig,
            per_device_train_batch_size=g_a,
            num_generations=g_a,
            num_generations_confidence=g_c,
            max_confidence_length=confidence_len,
            confidence_prompt=CONFIDENCE_PROMPT,
            share_prefix=share_prefix,
            **common,
        )
        rlcr = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
        runs[name] = (rlcr, ScriptedGeneration(rlcr, lambda p, k: confidence if CONFIDENCE_PROMPT in p else answer))

    load_before = machine_load()
    times = interleaved_step_times(runs)
    return {
        "model": "SmolLM2-135M-Instruct (embedded default), "
        + ("bfloat16, SDPA, " if on_cuda() else "float32, ")
        + device_name(),
        "rows_per_step": g_a * (1 + g_c),
        "generated_tokens_per_step": g_a * answer_len + g_a * g_c * confidence_len,
        "measured_steps": steps,
        "order": "interleaved: one step of each configuration in turn (grpo, grpo_cpu_tiles, rlcr, rlcr_unpacked), "
        "warm-up dropped",
        "machine_load_before": load_before,
        "machine_load_after": machine_load(),
        "step_times": summarize(times, baseline="grpo"),
        "vs_grpo_cpu_tiles": {
            name: summary["vs_grpo_cpu_tiles"]
            for name, summary in summarize(times, baseline="grpo_cpu_tiles").items()
            if "vs_grpo_cpu_tiles" in summary
        },
    }


class GRPOWithCPULogprobTiles(CPULogprobTiles, GRPOTrainer):
    """Plain GRPO on the trainers' CPU log-prob path, per training step (the benchmark's trainers share a process)."""


# -- calibration curves ---------------------------------------------------------------------------------------------
SINGLE_TURN_SUFFIX = " Then state your confidence that it is correct (0 to 1) inside <confidence></confidence>."


def single_turn_rlcr_reward():
    """Single-turn RLCR (Damani et al.): accuracy + Brier on the same completion; logs batch ECE/Brier."""
    accuracy = make_accuracy_reward()

    def rlcr_single_turn(prompts, completions, completion_ids=None, log_metric=None, **kwargs):
        acc = accuracy(prompts, completions, completion_ids, **kwargs)
        confs = [extract_confidence(completion_text(c), "confidence") for c in completions]
        rewards = [a + (1 - (a - c) ** 2 if c is not None else 0.0) for a, c in zip(acc, confs)]
        pairs = [(c, a) for c, a in zip(confs, acc) if c is not None]
        if log_metric is not None:
            log_metric("confidence/parse_fail_rate", 1 - len(pairs) / len(confs))
            if pairs:
                log_metric("calibration/ece", expected_calibration_error(*zip(*pairs)))
                log_metric("calibration/brier", brier_score(*zip(*pairs)))
        return rewards

    return rlcr_single_turn


@torch.no_grad()
def evaluate_single_turn(model, tokenizer, dataset, max_new_tokens: int, agreement_samples: int = 0, seed: int = 0):
    """Greedy single-turn replies, the answer and the confidence read from the same completion, scored as the
    multi-turn evaluation scores (accuracy over every row, calibration over the parsed confidences; a
    `CalibrationEvaluation`), with the sampling agreement of `agreement_samples` replies when asked for."""
    was_training = model.training
    model.eval()
    rows, sampled_tokens = [], 0
    for start in range(0, len(dataset), 16):
        batch = dataset[start : start + 16]
        prompts = [
            tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
            for p in batch["prompt"]
        ]
        texts = [
            tokenizer.decode(ids, skip_special_tokens=True)
            for ids in greedy_completions(model, tokenizer, prompts, max_new_tokens)
        ]
        agreements = [None] * len(texts)
        if agreement_samples:
            agreements, tokens = sampling_agreement(
                model, tokenizer, prompts, texts, agreement_samples, max_new_tokens, seed=seed + start
            )
            sampled_tokens += tokens
        for prompt, level, gold, text, agreement in zip(
            batch["prompt"], batch["level"], batch["solution"], texts, agreements
        ):
            answer = extract_answer(text, "answer")
            rows.append(
                {
                    "prompt": prompt_text(prompt),
                    "group": level,
                    "gold": gold,
                    "answer": text,
                    "correct": int(bool(answer) and verify_answer(gold, answer)),
                    "confidence": extract_confidence(text, "confidence"),
                    **({"agreement": agreement} if agreement_samples else {}),
                }
            )
    model.train(was_training)
    cost = {"samples_per_question": agreement_samples, "generated_tokens": sampled_tokens}
    return calibration_evaluation(rows, seed=seed, agreement_cost=cost if agreement_samples else None)


class EvaluateEvery(TrainerCallback):
    """Evaluate the model on held-out questions before training and every `every` steps, with the generated tokens
    so far (from TRL's logged mean completion lengths). `evaluate(final)` returns a `CalibrationEvaluation`; the
    final one (at `max_steps`) also gives the sampling agreement, and its per-sample rows are kept (`records`)."""

    def __init__(self, evaluate, every: int, row_counts: dict[str, int]):
        self.evaluate, self.every, self.row_counts, self.points, self.records = evaluate, every, row_counts, [], []

    def _point(self, state):
        tokens = sum(log.get(key, 0.0) * rows for log in state.log_history for key, rows in self.row_counts.items())
        final = state.global_step >= state.max_steps
        result = self.evaluate(final)
        self.points.append({"step": state.global_step, "generated_tokens": tokens, **_evaluation_point(result, final)})
        if final:
            self.records = result.rows

    def on_train_begin(self, args, state, control, **kwargs):
        self._point(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        # after the step's log, so its generated tokens are counted
        if "step_time" in (logs or {}) and state.global_step % self.every == 0:
            self._point(state)


def calibration(steps: int | None, seeds: list[int], every: int, split: str, agreement_samples: int) -> dict:
    """Multi-turn RLCR (the recipe's embedded-default run) against single-turn RLCR on plain GRPOTrainer, both from
    one format warm-up (per seed) that teaches both formats, equal generated tokens per step, one pair of runs per
    seed, evaluated on the built-in data's `split` (`tune` to choose, `report` to publish)."""
    from copy import deepcopy

    script_args, base_args, train, evaluation = rlcr_cpu_run(("--eval_split", split))
    steps = steps or base_args.max_steps
    n = script_args.warmup_samples
    single_turn_prompt = script_args.system_prompt + SINGLE_TURN_SUFFIX

    def warm_up(seed: int) -> str:
        # A seed is the whole pipeline, as the recipe's --seed is: the warm-up's confidence draw and SFT run too.
        examples = rlcr_format_examples(
            train.select(range(n)),
            base_args.confidence_prompt,
            seed=seed,
            single_turn_system_prompt=single_turn_prompt,
            confidence_draw=script_args.warmup_confidences,
        )
        seeded = deepcopy(base_args)
        seeded.seed = seed
        return script_args.build_warmup(default_model_path(), examples, seeded)[0]  # the recipe's build and cache

    warmups = {}
    train = train.select(range(n, len(train)))
    single_train, single_eval = (with_system_prompt(d, single_turn_prompt) for d in (train, evaluation))
    g_c = base_args.num_generations_confidence
    answers = base_args.per_device_train_batch_size * base_args.gradient_accumulation_steps  # per step
    # Equal generated tokens: multi-turn samples `answers` answers and `answers * g_c` confidences of about the same
    # length per step; a single-turn reply holds both, so single-turn gets (1 + g_c) / 2 times as many replies.
    single_rows = answers * (1 + g_c) // 2
    single_length = base_args.max_completion_length + base_args.max_confidence_length
    runs = {"multi_turn": [], "single_turn": []}
    records = []  # the final evaluations' per-sample rows, per method and seed
    for seed in seeds:
        model_path = warmups[seed] = warm_up(seed)
        model, tokenizer = load_model(model_path)
        args = deepcopy(base_args)
        args.__dict__.update(
            output_dir=tempfile.mkdtemp(),
            seed=seed,
            max_steps=steps,
            save_strategy="no",
            eval_strategy="no",  # evaluated by the callback below, as the single-turn run is
            disable_tqdm=True,
        )
        trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
        callback = EvaluateEvery(
            lambda final, t=trainer: evaluate_calibration(
                t.model,
                t.processing_class,
                evaluation,
                t.args,
                batch_size=t.args.per_device_eval_batch_size,
                progress=False,
                agreement_samples=agreement_samples if final else 0,
            ),
            every,
            {"completions/mean_length": answers, "confidence/completions/mean_length": answers * g_c},
        )
        trainer.add_callback(callback)
        trainer.train()
        runs["multi_turn"].append({"seed": seed, "points": callback.points})
        records += [{"method": "multi_turn", "seed": seed, **row} for row in callback.records]

        model, tokenizer = load_model(model_path)
        args = cpu_test_args(
            tempfile.mkdtemp(),
            GRPOConfig,
            seed=seed,
            max_steps=steps,
            bf16=base_args.bf16,
            per_device_train_batch_size=single_rows,
            num_generations=4,
            max_completion_length=single_length,
            temperature=base_args.temperature,
            learning_rate=base_args.learning_rate,
            lr_scheduler_type=base_args.lr_scheduler_type,
            beta=base_args.beta,
            activation_checkpointing=False,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=single_turn_rlcr_reward(),
            args=args,
            train_dataset=single_train,
            processing_class=tokenizer,
        )
        callback = EvaluateEvery(
            lambda final, t=trainer, seed=seed: evaluate_single_turn(
                t.model, t.processing_class, single_eval, single_length, agreement_samples if final else 0, seed
            ),
            every,
            {"completions/mean_length": single_rows},
        )
        trainer.add_callback(callback)
        trainer.train()
        runs["single_turn"].append({"seed": seed, "points": callback.points})
        records += [{"method": "single_turn", "seed": seed, **row} for row in callback.records]
    return {
        "model": "format warm-up (both formats) of SmolLM2-135M-Instruct, bf16 autocast, CPU",
        "warmup_models": warmups,
        "steps": steps,
        "seeds": seeds,
        "evaluate_every": every,
        "evaluation": f"{len(evaluation)} held-out questions of the {split} split, greedy",
        "split": split,
        "agreement_samples": agreement_samples,
        "rows_per_step": {"multi_turn": answers * (1 + g_c), "single_turn": single_rows},
        "summary": calibration_summary(runs),
        "runs": runs,
    }, records


POINT_METRICS = ("ece", "brier", "auroc", "brier_skill", "auroc_within_groups", "brier_skill_groups")


def _evaluation_point(result, final: bool) -> dict:
    """An evaluation's metrics (the final one's with their bootstrap 95% intervals, and the sampling agreement's)."""
    point = {
        "accuracy": result.accuracy,
        **{key: getattr(result.report, key) for key in POINT_METRICS},
        "parse_fail_rate": result.confidence_parse_fail_rate,
    }
    if final:
        point["intervals"] = {**result.report.intervals, "accuracy": result.accuracy_interval}
        if result.agreement_report is not None:
            point["sampling_agreement"] = {**result.agreement_report.to_dict(), **result.agreement_cost}
            point["sampling_agreement"].pop("bins")
    return point


def with_system_prompt(dataset, system_prompt):
    return dataset.map(
        lambda row: {
            "prompt": [
                {"role": "system", "content": system_prompt},
                *(m for m in row["prompt"] if m["role"] != "system"),
            ]
        }
    )


def calibration_summary(runs: dict) -> dict:
    """Final held-out figures per method (mean, min, max over seeds) and the per-seed differences."""
    summary = {}
    for name, seeded in runs.items():
        for key in ("accuracy", "parse_fail_rate", *POINT_METRICS):
            values = [run["points"][-1][key] for run in seeded]
            values = [v for v in values if v is not None and v == v]
            summary.setdefault(name, {})[key] = (
                {"mean": statistics.mean(values), "min": min(values), "max": max(values)} if values else None
            )
    for key in ("accuracy", *POINT_METRICS):
        pairs = [(m["points"][-1][key], s["points"][-1][key]) for m, s in zip(runs["multi_turn"], runs["single_turn"])]
        diffs = [None if a is None or b is None else a - b for a, b in pairs]  # None: undefined (one class)
        summary[f"multi_minus_single_{key}"] = diffs
    return summary


def plot_calibration(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = [
        ("ece", "held-out ECE"),
        ("brier_skill", "held-out Brier skill (0: the best constant)"),
        ("auroc", "held-out AUROC"),
        ("auroc_within_groups", "held-out AUROC within levels"),
        ("parse_fail_rate", "confidence parse failures"),
        ("accuracy", "held-out accuracy"),
    ]
    fig = Figure(figsize=(23, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, (key, title) in zip(fig.subplots(1, len(keys)), keys):
        for color, (name, seeded) in zip(("C0", "C1"), result["runs"].items()):
            tokens = [
                statistics.mean(p["generated_tokens"] for p in points)
                for points in zip(*(run["points"] for run in seeded))
            ]
            values = [[p[key] if p[key] is not None else float("nan") for p in run["points"]] for run in seeded]
            columns = list(zip(*values))
            ax.fill_between(tokens, [min(c) for c in columns], [max(c) for c in columns], color=color, alpha=0.2)
            ax.plot(
                tokens,
                [statistics.mean(c) for c in columns],
                color=color,
                marker="o",
                markersize=3,
                label=f"{name.replace('_', '-')} (mean of {len(seeded)} seeds; band: min-max)",
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("generated tokens (cumulative)")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=7)
    fig.suptitle(
        "RLCR on SmolLM2-135M (CPU), one format warm-up per seed: multi-turn vs single-turn at equal generated "
        f"tokens, greedy evaluation on {result['evaluation']}",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)


def plot_overhead(result: dict, path: Path) -> None:
    load = [result[k]["load_average_1_5_15_min"][0] for k in ("machine_load_before", "machine_load_after")]
    plot_step_times(
        {f"same generated tokens (1-min load {load[0]:.1f} -> {load[1]:.1f})": result["step_times"]},
        "grpo",
        path,
        "RLCR vs GRPOTrainer, interleaved steps",
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["overhead", "calibration"])
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per trainer (overhead: 4 measured steps; calibration: the recipe's max_steps)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44], help="calibration: one pair per seed")
    parser.add_argument("--evaluate-every", type=int, default=4, help="calibration: steps between evaluations")
    parser.add_argument(
        "--split",
        choices=["tune", "report"],
        default="tune",
        help="calibration: held-out questions from the tune split (choosing settings) or the report split (the "
        "published numbers: rlcr_calibration.json; tune: rlcr_calibration_tune.json)",
    )
    parser.add_argument(
        "--agreement-samples",
        type=int,
        default=8,
        help="calibration: answers sampled per question at temperature 1 for the sampling-agreement reference "
        "(final evaluation; 0: off)",
    )
    parser.add_argument("--model", help="overhead: a checkpoint directory instead of the embedded default")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.part == "overhead":
        result = overhead(args.steps or 4, args.model)
        name = "overhead_cuda" if on_cuda() else "overhead"  # CPU and GPU figures side by side
        name += "" if args.model is None else "_tiny"
        write_result(RESULTS / f"rlcr_{name}.json", result)  # before the plot, which may fail
        plot_overhead(result, RESULTS / f"rlcr_{name}.png")
    else:
        result, records = calibration(args.steps, args.seeds, args.evaluate_every, args.split, args.agreement_samples)
        name = "rlcr_calibration" if args.split == "report" else f"rlcr_calibration_{args.split}"
        write_result(RESULTS / f"{name}.json", result, seeds=args.seeds, records=records)
        plot_calibration(result, RESULTS / f"{name}.png")
    print(json.dumps({k: v for k, v in result.items() if k not in ("curves", "runs")}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
