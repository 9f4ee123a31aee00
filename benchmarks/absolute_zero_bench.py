"""AbsoluteZero benchmarks on the embedded default (SmolLM2-135M-Instruct), CPU.

    python benchmarks/absolute_zero_bench.py overhead   # step time vs plain GRPO on the same generated tokens
    python benchmarks/absolute_zero_bench.py curves     # generation calls/tokens and learnable ratio per step,
                                                        # held-out solver accuracy before and after, 3 seeds
    python benchmarks/absolute_zero_bench.py curves --task code   # the same for code reasoning self-play
    python benchmarks/absolute_zero_bench.py curves --quick       # 2 steps, 24 questions: *_quick.json/.png

Results: benchmarks/results/absolute_zero_<part>.json and .png (code: absolute_zero_code_<part>), and for curves the
recipe's held-out plot as absolute_zero[_code]_heldout.png.

overhead: both trainers get scripted completions of one fixed length, so generation cost is identical by
construction and excluded; the ratio measures what self-play adds per step around generation (scoring every
question's responses, the learnability filter, two TRL batch builds) at equal generated tokens. GRPO runs twice: as
TRL ships it (`grpo`; on CPU its fused LM head scores every prompt position) and on the trainers' CPU log-prob path
(`grpo_cpu_tiles`, which AbsoluteZeroTrainer uses): the ratio to the first is what a user sees, to the second what
self-play's algorithm costs. The trainers are built once and run one step each in turn (A B C A B C ...), so load on
a shared machine lands on all alike; min, median and spread of `step_time` after one warm-up step, and the ratios of
the medians and of the mins to each GRPO.

curves: the recipe's CPU config of the family (real generation, lenient parsing), for its own number of steps unless
--steps is given, once per seed in `--seeds` (3 or more; the seed draws the seed prompts' order, the samples and the
held-out questions); per step the number of generation calls, the generated tokens per role, the learnable ratio and
the repropose attempts; and the solver's greedy accuracy on the family's held-out questions before and after training.
The config's learning rate was chosen looking at the held-out questions of its own seed (42): those are the tune set,
and seed 42 is refused here. Each seed's report set is its held-out questions less any that, after normalisation
(whitespace; operand order of `a + b` and `a * b`), is in the tune set or was proposed (parsed) during that seed's
training. Per seed: accuracy before and after on the report set with percentile-bootstrap 95% intervals over the
questions, and the paired difference after - before with its interval; pooled over seeds, the per-question
difference. Every question, reply and score before and after is in the JSON (`runs`), with its provenance (commit,
package versions, device, command line, seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _stats import bootstrap_interval, normalise_question, paired_difference_interval
from common import (
    GRPO_BASELINES,
    ROOT,
    fixed_length,
    interleaved_step_times,
    load_model,
    machine_load,
    plot_step_times,
    results_dir,
    scratch_dir,
    summarize,
    write_result,
)
from trl import ModelConfig, TrlParser

from trl_ext.recipe import plot_learning_curves
from trl_ext.recipe.absolute_zero import AbsoluteZeroScriptArguments
from trl_ext.recipe.absolute_zero import main as absolute_zero_main
from trl_ext.self_play import arithmetic_task
from trl_ext.self_play.arithmetic import seed_prompts
from trl_ext.testing import ScriptedGeneration, cpu_test_args
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


RESULTS = results_dir()


def overhead(steps: int) -> dict:
    length, g, k, prompts = 24, 4, 2, 2
    task = arithmetic_task()
    model, tok = load_model()
    # Per prompt: a learnable question (1 + 1, half the answers right) and a non-learnable one (2 + 2, always
    # right): no repropose, so K * length + K * G * length tokens per prompt.
    proposals = [fixed_length(tok, q, length) for q in ("<question>1+1</question>", "<question>2+2</question>")]
    answers = {
        q: [fixed_length(tok, f"<answer>{a}</answer>", length) for a in options]
        for q, options in (("1+1", ("2", "3")), ("2+2", ("4", "4")))
    }

    def self_play(prompt_text, j):
        if "What is" in prompt_text:
            return answers["1+1" if "1+1" in prompt_text else "2+2"][j % 2]
        return proposals[j]

    common = dict(
        max_steps=steps + 1,
        learning_rate=1e-6,
        activation_checkpointing=False,
        shuffle_dataset=False,
        max_completion_length=length,
    )
    args = cpu_test_args(
        scratch_dir(),
        AbsoluteZeroConfig,
        per_device_train_batch_size=prompts * g,
        num_generations=g,
        num_questions_per_prompt=k,
        max_question_length=length,
        reward_weights=[1.0, 0.5],
        **common,
    )
    az = AbsoluteZeroTrainer(
        model,
        task.reward_funcs,
        args=args,
        train_dataset=seed_prompts(64, 0),
        processing_class=tok,
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
    )
    generated = prompts * (k + k * g) * length

    # Plain GRPO generating the same number of tokens: prompts * (K + K * G) completions of the same length; as TRL
    # ships it, and on the trainers' CPU log-prob path (which AbsoluteZeroTrainer uses).
    rows = prompts * (k + k * g)
    data = seed_prompts(64, 0).map(lambda row: {"solution": "2"})
    runs = {}
    for name, (trainer_cls, config_cls) in GRPO_BASELINES.items():
        model, tok = load_model()
        args = cpu_test_args(
            scratch_dir(),
            config_cls,
            per_device_train_batch_size=rows,
            num_generations=rows // 2,
            reward_weights=[1.0, 0.5],
            **common,
        )
        grpo = trainer_cls(
            model=model, reward_funcs=task.reward_funcs, args=args, train_dataset=data, processing_class=tok
        )
        runs[name] = (grpo, ScriptedGeneration(grpo, lambda p, j: answers["1+1"][j % 2]))
    runs["absolute_zero"] = (az, ScriptedGeneration(az, self_play))

    load_before = machine_load()
    times = interleaved_step_times(runs)
    summary = summarize(times)
    return {
        "model": "SmolLM2-135M-Instruct (embedded default), float32, CPU",
        "generated_tokens_per_step": generated,
        "absolute_zero_rows_trained_per_step": prompts * g + prompts,
        "grpo_rows_trained_per_step": rows,
        "measured_steps": steps,
        "order": "interleaved: one step of grpo, grpo_cpu_tiles, absolute_zero in turn; warm-up dropped",
        "machine_load_before": load_before,
        "machine_load_after": machine_load(),
        "absolute_zero_generation_calls_per_step": az.state.log_history[0]["generation/calls"],
        "step_times": summary,
        # Self-play trains fewer rows than it generates (one question's responses per prompt, one proposal): per
        # trained row, the cost of the filter and the extra scoring shows.
        "ratio_of_medians_per_trained_row": {
            baseline: summary["absolute_zero"]["vs_" + baseline]["ratio_of_medians"] * rows / (prompts * g + prompts)
            for baseline in GRPO_BASELINES
        },
    }


CPU_CONFIGS = {"arithmetic": "absolute_zero_smollm2_cpu.yaml", "code": "absolute_zero_code_smollm2_cpu.yaml"}
SOLVER_ACCURACY = {"arithmetic": "solver/numeric_match_mean", "code": "solver/code_correct_mean"}


def results_name(task: str, part: str) -> str:
    return f"absolute_zero_{part}" if task == "arithmetic" else f"absolute_zero_{task}_{part}"


TUNE_SEED = 42  # the configs' seed: its held-out questions were looked at while choosing the learning rate
PROPOSED: list[str] = []  # normalised questions parsed from proposals during the current run


def _record_proposals():
    """Record every question the trainer parses from a proposal (benchmark instrumentation, at class level)."""
    parse = AbsoluteZeroTrainer._parse

    def recording(self, completion, context=None):
        question = parse(self, completion, context)
        if question is not None:
            PROPOSED.append(question_key(question))
        return question

    AbsoluteZeroTrainer._parse = recording


def question_key(question: dict) -> str:
    """A question's normalised text: its arithmetic expression, else its other fields."""
    text = question.get("expression") or question.get("question")
    if isinstance(text, str):
        return normalise_question(text)
    return json.dumps({k: v for k, v in sorted(question.items()) if k != "level"}, sort_keys=True, default=str)


def curve_run(steps: int | None, task: str, seed: int, heldout_size: int | None) -> dict:
    output_dir = Path(scratch_dir())
    argv = ["--config", str(ROOT / "recipes" / "configs" / CPU_CONFIGS[task]), "--output_dir", str(output_dir)]
    argv += ["--seed", str(seed)]
    argv += ["--max_steps", str(steps)] if steps is not None else []
    argv += ["--heldout_size", str(heldout_size)] if heldout_size is not None else []
    parser = TrlParser((AbsoluteZeroScriptArguments, AbsoluteZeroConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    training_args.disable_tqdm = True
    PROPOSED.clear()
    log = absolute_zero_main(script_args, training_args, model_args)
    keys = [
        "generation/calls",
        "generation/proposer_tokens",
        "generation/solver_tokens",
        "unified_filter/learnable_ratio",
        "repropose/total_attempts",
        "proposer/invalid_rate",
        SOLVER_ACCURACY[task],
        "step_time",
    ]
    per_step = [
        {"step": entry["step"], **{key: entry.get(key) for key in keys}}
        for entry in log
        if "unified_filter/learnable_ratio" in entry
    ]
    rows = {
        when: json.loads((output_dir / f"heldout_{when}.json").read_text())["rows"] for when in ("before", "after")
    }
    return {
        "seed": seed,
        "steps": per_step,
        "questions": [row["question"] for row in rows["before"]],
        "proposed": sorted(set(PROPOSED)),
        **{f"score_{when}": [row["score"] for row in rows[when]] for when in rows},
        **{f"reply_{when}": [row["reply"] for row in rows[when]] for when in rows},
    }


def report(runs: list[dict], tune: set[str]) -> dict:
    """Per seed and pooled: accuracy before/after on the report set (held-out less tune set and proposals), with
    bootstrap intervals."""
    per_seed, pooled = [], []
    for run in runs:
        excluded = tune | set(run["proposed"])
        keep = [i for i, q in enumerate(run["questions"]) if question_key(q) not in excluded]
        before = [run["score_before"][i] for i in keep]
        after = [run["score_after"][i] for i in keep]
        per_seed.append(
            {
                "seed": run["seed"],
                "heldout_questions": len(run["questions"]),
                "report_questions": len(keep),
                "dropped_in_tune_set": sum(question_key(q) in tune for q in run["questions"]),
                "dropped_proposed_in_training": sum(
                    question_key(q) in set(run["proposed"]) and question_key(q) not in tune for q in run["questions"]
                ),
                "accuracy_before": bootstrap_interval(before),
                "accuracy_after": bootstrap_interval(after),
                "after_minus_before": paired_difference_interval(after, before),
            }
        )
        pooled += [a - b for a, b in zip(after, before, strict=True)]
    return {
        "per_seed": per_seed,
        "pooled_after_minus_before": bootstrap_interval(pooled),
        "mean_accuracy_before": sum(s["accuracy_before"]["value"] for s in per_seed) / len(per_seed),
        "mean_accuracy_after": sum(s["accuracy_after"]["value"] for s in per_seed) / len(per_seed),
    }


def plot_report(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    seeds = result["report"]["per_seed"]
    for offset, (when, color) in zip((-0.15, 0.15), (("before", "C0"), ("after", "C1"))):
        stats = [s[f"accuracy_{when}"] for s in seeds]
        xs = [i + offset for i in range(len(seeds))]
        values = [s["value"] for s in stats]
        errors = [[v - s["low"] for v, s in zip(values, stats)], [s["high"] - v for v, s in zip(values, stats)]]
        ax.bar(xs, values, 0.3, yerr=errors, capsize=3, color=color, label=when)
    ax.set_xticks(range(len(seeds)), [f"seed {s['seed']}\n(n={s['report_questions']})" for s in seeds])
    ax.set_ylabel("greedy accuracy (95% bootstrap interval)")
    ax.set_title(
        f"Absolute Zero ({result['task']}), held-out report questions, {result['steps_run']} steps", fontsize=10
    )
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.savefig(path, dpi=110)


def curves(steps: int | None, task: str, seeds: list[int], heldout_size: int | None, quick: bool) -> dict:
    _record_proposals()
    runs = [curve_run(steps, task, seed, heldout_size) for seed in seeds]
    family = {"arithmetic": arithmetic_task}.get(task)
    tune_questions = []
    if family is not None and family().heldout_questions is not None:
        tune_questions = family().heldout_questions(None, TUNE_SEED)  # the config's 50, as looked at
    tune = {question_key(q) for q in tune_questions}
    suffix = "_quick" if quick else ""
    plot_learning_curves(
        runs[0]["steps"],
        [
            "generation/calls",
            "generation/proposer_tokens",
            "generation/solver_tokens",
            "unified_filter/learnable_ratio",
            "repropose/total_attempts",
        ],
        RESULTS / f"{results_name(task, 'curves')}{suffix}.png",
        f"Absolute Zero ({task}) on the CPU default (per step, seed {seeds[0]})",
    )
    result = {
        "model": f"SmolLM2-135M-Instruct (embedded default), {CPU_CONFIGS[task]}",
        "task": task,
        "quick": quick,
        "steps_run": len(runs[0]["steps"]),
        "tune_set": f"held-out questions of seed {TUNE_SEED} ({len(tune)}), excluded from every report set",
        "report": report(runs, tune),
        "runs": runs,
    }
    plot_report(result, RESULTS / f"{results_name(task, 'heldout')}{suffix}.png")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["overhead", "curves"])
    parser.add_argument("--steps", type=int, default=None, help="overhead: 4 by default; curves: the config's")
    parser.add_argument("--task", choices=list(CPU_CONFIGS), default="arithmetic", help="curves: the task family")
    parser.add_argument("--seeds", type=int, nargs="+", default=[43, 44, 45], help="curves: one run per seed")
    parser.add_argument("--heldout-size", type=int, default=None, help="curves: held-out questions (the config's)")
    parser.add_argument("--quick", action="store_true", help="curves: 2 steps, 24 questions, *_quick.json/.png")
    args = parser.parse_args()
    if args.part == "curves":
        if len(args.seeds) < 3:
            parser.error("--seeds: a comparison needs 3 or more seeds.")
        if TUNE_SEED in args.seeds:
            parser.error(f"--seeds: seed {TUNE_SEED} draws the held-out questions the config was tuned on.")
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.part == "overhead":
        result, name = overhead(args.steps or 4), "absolute_zero_overhead"
        seeds = [0]  # every trainer: cpu_test_args' seed
        panel = f"equal generated tokens ({result['generated_tokens_per_step']} per step)"
        plot_step_times(
            {panel: result["step_times"]},
            RESULTS / f"{name}.png",
            "Absolute Zero vs GRPOTrainer (as TRL ships it; on the CPU log-prob path), interleaved steps",
        )
    else:
        steps = args.steps or (2 if args.quick else None)
        heldout_size = args.heldout_size or (24 if args.quick else None)
        result = curves(steps, args.task, args.seeds, heldout_size, args.quick)
        name = results_name(args.task, "curves") + ("_quick" if args.quick else "")
        seeds = args.seeds
    write_result(RESULTS / f"{name}.json", result, seeds=seeds)
    print({k: v for k, v in result.items() if k != "runs"})


if __name__ == "__main__":
    sys.exit(main())
