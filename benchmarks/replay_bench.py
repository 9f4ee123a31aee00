"""ReplayGRPOTrainer benchmarks on the embedded default (SmolLM2-135M-Instruct, graded arithmetic), CPU (curves: a GPU
where there is one).

    python benchmarks/replay_bench.py overhead    # step time before replay starts vs plain GRPO
    python benchmarks/replay_bench.py curves      # accuracy per step with and without replay, 3 seeds
    python benchmarks/replay_bench.py curves --levels 4 5   # the same on the hardest levels (rare successes)
    python benchmarks/replay_bench.py curves --quick        # 4 steps, 32 questions: a pipeline check

Results: benchmarks/results/replay_<part>.json and .png.

overhead: plain GRPO and ReplayGRPOTrainer with replay not yet started (it never starts in this run) train on the
same prompts from the same seed with real generation, so all sample the same completions; the replay trainer also
collects (log-probs and entropies of the successful rows, buffer update). GRPO runs twice: as TRL ships it (`grpo`; on
CPU its fused LM head scores every prompt position) and on the trainers' CPU log-prob path (`grpo_cpu_tiles`, which
ReplayGRPOTrainer uses): the ratio to the first is what a user sees, to the second what collecting costs. The
trainers are built once and run one step each in turn (A B C A B C ...), each with its own RNG stream, so load on a
shared machine lands on all alike; min, median and spread of `step_time` after one warm-up step, and the ratios of
the medians and of the mins to each GRPO. A second set with scripted fixed-length completions excludes generation,
the bound on the ratio when generation is free (as with a fast vLLM server).

curves: with replay (starting at `--replay-start` of the steps) and without (the replay trainer with replay never
starting: plain GRPO updates, as `overhead` checks), once per seed in `--seeds` (3 or more), both from the RLCR
recipe's format warm-up of the embedded default (short `<answer>` replies, so that a 135M model gets some answers right
and some wrong, which replay needs): accuracy per step of the fresh rollouts (replayed rows excluded) with its 4-step
moving average, mean and min-max over seeds, fresh tokens generated per step, steps until the replay run's moving
average reaches the no-replay run's final accuracy (mean over the last quarter of its steps; per seed and on the seed
means), and buffer bytes per stored token. `--levels 4 5` trains on the hardest levels only, where a 135M model's
successes are rare: the setting replay's mechanism (re-using rare successes) is for.

Both runs also answer `--heldout-size` report questions (of the same levels), greedily, before training and every
quarter of the steps (`trainer.evaluate()`): training accuracy mixes which questions replay asks with what the model
learnt, held-out accuracy measures only the latter. The report questions come from the built-in data's `report` split
(generator seed 9000), which shares no question with the `train` split that the warm-up and every seed's training
draw from (after normalisation: whitespace, operand order of `a + b` and `a * b`); the JSON records the overlap, 0. Per seed: held-out accuracy before and after with
percentile-bootstrap 95% intervals over the questions, and the paired difference replay - no replay after training
(same questions) with its interval; pooled over seeds, the per-question mean difference with its interval. The JSON
records its provenance (commit, package versions, device, command line, seeds) and the report questions.

Results: `replay_curves.json`/`.png`, `replay_curves_levels45.*` with `--levels 4 5`. `--quick` (3 seeds, 4 steps, 32
report questions, evaluated before and after only) writes `*_quick.json`/`.png`, never the full run's files.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _stats import bootstrap_interval, normalise_question, paired_difference_interval
from common import (
    GRPO_BASELINES,
    device_args,
    device_name,
    fixed_length,
    interleaved_step_times,
    load_model,
    machine_load,
    plot_step_times,
    results_dir,
    rlcr_cpu_run,
    rlcr_cpu_warmup,
    scratch_dir,
    summarize,
    write_result,
)

from trl_ext.data import graded_arithmetic
from trl_ext.rewards import make_accuracy_reward, make_format_reward
from trl_ext.testing import ScriptedGeneration, cpu_test_args
from trl_ext.trainers import ReplayGRPOConfig, ReplayGRPOTrainer


RESULTS = results_dir()
COMPLETION = "<think>3 plus 4 is 7.</think><answer>7</answer>"  # the scripted completion, filled to 32 tokens
WINDOW = 4


def make_trainer(
    replay: bool,
    steps: int,
    learning_rate: float,
    model_path=None,
    seed=42,
    system_prompt=None,
    batch_size=8,
    heldout=None,
    levels=None,
    eval_steps=None,
    grpo="grpo",
    **replay_args,
):
    """GRPO (`grpo`: a name of `GRPO_BASELINES`) or Replay GRPO on graded arithmetic. Without `model_path`: the embedded default with lenient parsing, the
    `<think>` answer format and a format reward (the step-time benchmark); with it (the format warm-up of the RLCR
    recipe): its short answer format, strict parsing and the accuracy reward alone."""
    if model_path is None:
        model, tokenizer = load_model()
        rewards, weights = [make_accuracy_reward(lenient=True), make_format_reward()], [1.0, 0.5]
        data = graded_arithmetic(500, seed=seed)
        length = 32
    else:
        model, tokenizer = load_model(model_path)
        rewards, weights = [make_accuracy_reward()], [1.0]
        data = training_questions(seed, system_prompt, levels)
        length = 16
    common = dict(
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        num_generations=4,
        max_completion_length=length,
        temperature=1.0,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        beta=0.0,
        activation_checkpointing=False,
        reward_weights=weights,
        seed=seed,
        bf16=model_path is not None,
    )
    if model_path is not None:  # the curves: on a GPU where there is one (bf16), else CPU
        common.update(device_args())
    if heldout is not None:  # greedy held-out accuracy every `eval_steps` (default: every quarter of the run)
        common.update(
            eval_strategy="steps", eval_steps=eval_steps or max(steps // 4, 1), per_device_eval_batch_size=32
        )
    if replay or heldout is not None:
        args = cpu_test_args(scratch_dir(), ReplayGRPOConfig, **common, **replay_args)
        return ReplayGRPOTrainer(
            model=model,
            reward_funcs=rewards,
            args=args,
            train_dataset=data,
            eval_dataset=heldout,
            processing_class=tokenizer,
        )
    trainer_cls, config_cls = GRPO_BASELINES[grpo]
    args = cpu_test_args(scratch_dir(), config_cls, **common)
    return trainer_cls(model=model, reward_funcs=rewards, args=args, train_dataset=data, processing_class=tokenizer)


def logged(trainer, key):
    return [log[key] for log in trainer.state.log_history if key in log]


# -- overhead -----------------------------------------------------------------------------------------------------
def overhead(steps: int) -> dict:
    result = {
        "steps": steps,
        "order": "interleaved: one step of grpo, grpo_cpu_tiles, replay_before_start in turn; warm-up dropped",
    }
    for scripted in (False, True):
        runs = {}
        for name in (*GRPO_BASELINES, "replay_before_start"):
            if name in GRPO_BASELINES:
                trainer = make_trainer(False, steps + 1, 1e-6, grpo=name)
            else:  # replay never starts in this run
                trainer = make_trainer(True, steps + 1, 1e-6, replay_start_ratio=1.0)
            context = None
            if scripted:
                completion = fixed_length(trainer.processing_class, COMPLETION, 32)
                context = ScriptedGeneration(trainer, lambda p, k, completion=completion: completion)
            runs[name] = (trainer, context)
        load_before = machine_load()
        times = interleaved_step_times(runs)
        result["scripted" if scripted else "real_generation"] = {
            "machine_load_before": load_before,
            "machine_load_after": machine_load(),
            "num_tokens": {name: logged(trainer, "num_tokens")[-1] for name, (trainer, _) in runs.items()},
            "step_times": summarize(times),
        }
    plot_overhead(result, RESULTS / "replay_overhead.png")
    return result


def plot_overhead(result: dict, path: Path) -> None:
    plot_step_times(
        {part.replace("_", " "): result[part]["step_times"] for part in ("real_generation", "scripted")},
        path,
        "Replay GRPO before replay starts vs GRPOTrainer (as TRL ships it; on the CPU log-prob path), interleaved steps",
    )


# -- curves -------------------------------------------------------------------------------------------------------
def moving_average(values, window=WINDOW):
    return [statistics.mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def training_questions(seed: int, system_prompt, levels=None):
    """A seed's training questions (the built-in data's `train` split, a generator seed the warm-up does not use), of
    `levels` only when given."""
    return graded_arithmetic(500, seed=1000 + seed, system_prompt=system_prompt, levels=levels)


def heldout_questions(n: int, system_prompt: str, exclude, levels=None) -> tuple[list[dict], dict]:
    """`n` questions of the built-in data's `report` split (generator seed 9000, of `levels` when given), distinct
    and the same for every run: unseen in the warm-up and every seed's training (`exclude`, all `train` split) by
    construction, which the overlap count returned beside them checks."""
    rows = graded_arithmetic(n, seed=9000, system_prompt=system_prompt, split="report", levels=levels).to_list()
    keys = [normalise_question(row["question"]) for row in rows]
    trained = {normalise_question(row["question"]) for row in exclude}
    if len(set(keys)) < n:
        raise ValueError(f"only {len(set(keys))} distinct report questions of levels {levels}; lower --heldout-size.")
    return rows, {"overlap_with_training": len(trained & set(keys))}


def run_curves(
    replay: bool,
    steps: int,
    replay_start: float,
    learning_rate: float,
    seed: int,
    model_path,
    system_prompt,
    heldout,
    levels=None,
    eval_steps=None,
) -> dict:
    # Without replay: the replay trainer with replay never starting (plain GRPO updates, as `overhead` checks), so
    # that both runs get the same held-out evaluation (`trainer.evaluate()`).
    trainer = make_trainer(
        True,
        steps,
        learning_rate,
        model_path=model_path,
        seed=seed,
        system_prompt=system_prompt,
        batch_size=16,
        heldout=heldout,
        levels=levels,
        eval_steps=eval_steps,
        replay_start_ratio=replay_start if replay else 1.0,
    )
    before = trainer.evaluate()
    correct_before = [record["success"] for record in trainer.heldout_records]
    trainer.train()
    if trainer.heldout_step != steps:
        raise RuntimeError(f"the last held-out evaluation ran at step {trainer.heldout_step}, not {steps}.")
    evaluations = [(0, before["eval_accuracy"])]
    evaluations += [(log["step"], log["eval_accuracy"]) for log in trainer.state.log_history if "eval_accuracy" in log]
    # Fresh rollouts only: replayed rows are stored successes and would inflate the replay run's accuracy.
    accuracy = logged(trainer, "replay/solve_rate")
    run = {
        "accuracy": accuracy,
        "accuracy_moving_average": moving_average(accuracy),
        "fresh_tokens": logged(trainer, "replay/fresh_tokens"),
        "heldout_steps": [step for step, _ in evaluations],
        "heldout_accuracy": [value for _, value in evaluations],
        "heldout_seconds": logged(trainer, "eval_seconds"),
        # Per report question (greedy, one sample each), 1.0 right, 0.0 wrong, None not judged
        "heldout_correct_before": correct_before,
        "heldout_correct_after": [record["success"] for record in trainer.heldout_records],
    }
    if replay:
        exp = trainer.experience
        run.update(
            replay_groups=logged(trainer, "replay/replay_groups"),
            importance_ratio_mean=logged(trainer, "replay/importance_ratio_mean"),
            buffer_trajectories=logged(trainer, "replay/buffer_trajectories"),
            buffer_bytes_per_token=exp.nbytes / max(exp.num_tokens, 1),
        )
    return run


def curves(
    steps: int,
    replay_start: float,
    learning_rate: float,
    seeds: list[int],
    heldout_size: int,
    levels=None,
    quick: bool = False,
    model=None,
) -> dict:
    """Both configurations from the RLCR recipe's format warm-up of the embedded default (or from `model`), once per
    seed (the seed draws the questions, the samples and the replay decisions)."""
    rlcr_args, _, rlcr_train, _ = rlcr_cpu_run()  # the warm-up's questions are its first rows
    model_path, system_prompt = (model, rlcr_args.system_prompt) if model else rlcr_cpu_warmup()
    seen = list(rlcr_train) + [row for seed in seeds for row in training_questions(seed, system_prompt, levels)]
    heldout, overlap = heldout_questions(heldout_size, system_prompt, exclude=seen, levels=levels)
    eval_steps = steps if quick else None  # quick: before and after only
    runs = {name: [] for name in ("no_replay", "replay")}
    for seed in seeds:
        for name in runs:
            runs[name].append(
                run_curves(
                    name == "replay",
                    steps,
                    replay_start,
                    learning_rate,
                    seed,
                    model_path,
                    system_prompt,
                    heldout,
                    levels=levels,
                    eval_steps=eval_steps,
                )
            )
    result = {
        "model": model
        or f"format warm-up of SmolLM2-135M-Instruct (the RLCR recipe's), bf16 autocast, {device_name()}",
        "quick": quick,
        "steps": steps,
        "seeds": seeds,
        "levels": levels or "all",
        "replay_start_ratio": replay_start,
        "learning_rate": learning_rate,
        "rollouts_per_step": 16,
        "heldout": f"{len(heldout)} questions of the graded arithmetic's report split (generator seed 9000, levels "
        f"{levels or 'all'}), disjoint from the warm-up's and every seed's training questions (train split) after "
        "normalisation (whitespace, operand order of + and *), greedy, before training and "
        + ("after it" if quick else "every quarter of the steps")
        + " (trainer.evaluate())",
        "heldout_overlap": overlap,
        "heldout_questions": [row["question"] for row in heldout],
        "heldout_levels": [row["level"] for row in heldout],
        **compare(runs),
        "runs": runs,
    }
    plot_curves(result, RESULTS / f"{curves_name(levels, quick)}.png")
    return result


def curves_name(levels, quick: bool) -> str:
    """`replay_curves`, with `_levels45` for `--levels 4 5` and `_quick` for `--quick`."""
    return "replay_curves" + (f"_levels{''.join(map(str, levels))}" if levels else "") + ("_quick" if quick else "")


def final_accuracy(accuracy: list[float]) -> float:
    """Mean over the last quarter of the steps: one batch of rollouts is too noisy to be "the" final value."""
    return statistics.mean(accuracy[-max(WINDOW, len(accuracy) // 4) :])


def steps_to_reach(moving: list[float], target: float) -> int | None:
    return next((i + 1 for i, a in enumerate(moving) if a >= target), None)


def mean_curve(curves: list[list[float]]) -> list[float]:
    return [statistics.mean(values) for values in zip(*curves)]


def compare(runs: dict) -> dict:
    """Per seed and on the seed-mean curves: each run's final accuracy, and the steps until the replay run's moving
    average reaches the no-replay run's final accuracy (None: never)."""
    per_seed = []
    for base, replay in zip(runs["no_replay"], runs["replay"]):
        target = final_accuracy(base["accuracy"])
        per_seed.append(
            {
                "no_replay_final_accuracy": target,
                "replay_final_accuracy": final_accuracy(replay["accuracy"]),
                "replay_steps_to_reach_it": steps_to_reach(replay["accuracy_moving_average"], target),
            }
        )
    means = {name: mean_curve([run["accuracy"] for run in seeded]) for name, seeded in runs.items()}
    target = final_accuracy(means["no_replay"])
    finals = {name: [final_accuracy(run["accuracy"]) for run in seeded] for name, seeded in runs.items()}
    return {
        "per_seed": per_seed,
        "final_accuracy": {
            name: {"mean": statistics.mean(v), "min": min(v), "max": max(v)} for name, v in finals.items()
        },
        "mean_curve_no_replay_final_accuracy": target,
        "mean_curve_replay_steps_to_reach_it": steps_to_reach(moving_average(means["replay"]), target),
        "mean_fresh_tokens_per_step": {
            name: statistics.mean(t for run in seeded for t in run["fresh_tokens"]) for name, seeded in runs.items()
        },
        "buffer_bytes_per_token": statistics.mean(run["buffer_bytes_per_token"] for run in runs["replay"]),
        "heldout_accuracy": {
            name: {
                "before": statistics.mean(run["heldout_accuracy"][0] for run in seeded),
                "after": statistics.mean(run["heldout_accuracy"][-1] for run in seeded),
                "after_per_seed": [run["heldout_accuracy"][-1] for run in seeded],
            }
            for name, seeded in runs.items()
        },
        "heldout_intervals": heldout_intervals(runs),
    }


def heldout_intervals(runs: dict) -> dict:
    """Percentile-bootstrap 95% intervals over the report questions: per seed, each run's accuracy before and after
    and the paired difference replay - no replay after; pooled, the per-question difference averaged over seeds."""
    per_seed = []
    for base, replay in zip(runs["no_replay"], runs["replay"]):
        per_seed.append(
            {
                **{
                    f"{name}_{when}": bootstrap_interval(run[f"heldout_correct_{when}"])
                    for name, run in (("no_replay", base), ("replay", replay))
                    for when in ("before", "after")
                },
                "replay_minus_no_replay_after": paired_difference_interval(
                    replay["heldout_correct_after"], base["heldout_correct_after"]
                ),
            }
        )
    differences = [
        None if None in values else statistics.mean(values)
        for values in zip(
            *(
                [
                    None if r is None or b is None else r - b
                    for r, b in zip(rep["heldout_correct_after"], base["heldout_correct_after"], strict=True)
                ]
                for base, rep in zip(runs["no_replay"], runs["replay"])
            )
        )
    ]
    return {"per_seed": per_seed, "pooled_replay_minus_no_replay_after": bootstrap_interval(differences)}


def plot_curves(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(17, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_acc, ax_held, ax_tok, ax_buf = fig.subplots(1, 4)
    start = result["replay_start_ratio"] * result["steps"] + 0.5
    for color, (name, seeded) in zip(("C0", "C1"), result["runs"].items()):
        smoothed = [run["accuracy_moving_average"] for run in seeded]
        steps = range(1, len(smoothed[0]) + 1)
        low, high = [min(v) for v in zip(*smoothed)], [max(v) for v in zip(*smoothed)]
        ax_acc.fill_between(steps, low, high, color=color, alpha=0.2)
        ax_acc.plot(
            steps,
            mean_curve(smoothed),
            color=color,
            label=f"{name}: mean of {len(seeded)} seeds ({WINDOW}-step average), band: min-max",
        )
        ax_tok.plot(steps, mean_curve([run["fresh_tokens"] for run in seeded]), color=color, label=name)
        held = [run["heldout_accuracy"] for run in seeded]
        ax_held.fill_between(
            seeded[0]["heldout_steps"], *zip(*[(min(v), max(v)) for v in zip(*held)]), color=color, alpha=0.2
        )
        ax_held.plot(seeded[0]["heldout_steps"], mean_curve(held), "o-", color=color, label=f"{name}: mean, min-max")
    ax_acc.axhline(result["mean_curve_no_replay_final_accuracy"], color="C0", linestyle=":", linewidth=0.8)
    for run in result["runs"]["replay"]:
        ax_buf.plot(range(1, len(run["buffer_trajectories"]) + 1), run["buffer_trajectories"], color="C1", alpha=0.6)
    for ax, title in (
        (ax_acc, "accuracy of the fresh rollouts"),
        (ax_held, "held-out accuracy (greedy, unseen questions)"),
        (ax_tok, "fresh tokens generated per step"),
        (ax_buf, "buffer trajectories (each seed)"),
    ):
        ax.axvline(start, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ax_acc.legend(fontsize=7)
    ax_held.legend(fontsize=7)
    ax_tok.legend(fontsize=8)
    fig.suptitle(
        "Replay GRPO vs GRPO from the format warm-up of the embedded default (dashed: replay starts; "
        "dotted: no-replay final accuracy)",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["overhead", "curves"])
    parser.add_argument("--steps", type=int, default=None, help="measured steps (overhead: 4, curves: 24, quick: 4)")
    parser.add_argument("--replay-start", type=float, default=0.25, help="curves: replay_start_ratio")
    parser.add_argument("--learning-rate", type=float, default=1e-5, help="curves: learning rate")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44], help="curves: one run per seed")
    parser.add_argument("--heldout-size", type=int, default=None, help="curves: report questions (64; quick: 32)")
    parser.add_argument("--levels", type=int, nargs="+", default=None, help="curves: train and report on these levels")
    parser.add_argument("--quick", action="store_true", help="curves: 4 steps, 32 questions, *_quick.json/.png")
    parser.add_argument("--model", default=None, help="curves: start from this checkpoint, not the format warm-up")
    args = parser.parse_args(argv)
    if args.part == "curves" and len(args.seeds) < 3:
        parser.error("--seeds: a comparison between methods needs 3 or more seeds.")
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.part == "overhead":
        result, name = overhead(args.steps or 4), "replay_overhead"
        seeds = [42]  # make_trainer's default seed, every trainer
    else:
        steps = args.steps or (4 if args.quick else 24)
        heldout_size = args.heldout_size or (32 if args.quick else 64)
        result = curves(
            steps,
            args.replay_start,
            args.learning_rate,
            args.seeds,
            heldout_size,
            args.levels,
            quick=args.quick,
            model=args.model,
        )
        name = curves_name(args.levels, args.quick)
        seeds = args.seeds
    path = write_result(RESULTS / f"{name}.json", result, seeds=seeds)
    print({k: v for k, v in result.items() if k not in ("runs", "heldout_questions", "heldout_levels")})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
