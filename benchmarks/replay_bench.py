"""ReplayGRPOTrainer benchmarks on the embedded default (SmolLM2-135M-Instruct, graded arithmetic), CPU.

    python benchmarks/replay_bench.py overhead    # step time before replay starts vs plain GRPOTrainer
    python benchmarks/replay_bench.py curves      # accuracy per step with and without replay, same seed

Results: benchmarks/results/replay_<part>.json and .png.

overhead: GRPOTrainer and ReplayGRPOTrainer with replay not yet started (it never starts in this run) train on the
same prompts from the same seed with real generation, so both sample the same completions; the replay trainer also
collects (log-probs and entropies of the successful rows, buffer update). Both trainers are built once and run one
step each in turn (A B A B ...), each with its own RNG stream, so load on a shared machine lands on both alike; min,
median and spread of `step_time` after one warm-up step, and the ratios of the medians and of the mins. A second pair
with scripted fixed-length completions excludes generation, the bound on the ratio when generation is free (as with a
fast vLLM server).

curves: the same run with replay (starting at `--replay-start` of the steps) and without (plain GRPOTrainer):
accuracy per step of the fresh rollouts (replayed rows excluded, and its 4-step moving average), fresh tokens generated per
step, steps until the replay run's moving average reaches the no-replay run's final accuracy (mean over the last quarter
of its steps), and buffer bytes per stored token.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import (
    fixed_length,
    interleaved_step_times,
    load_model,
    machine_load,
    plot_step_times,
    summarize,
)
from trl import GRPOConfig, GRPOTrainer

from trl_ext.data import graded_arithmetic
from trl_ext.recipe import write_json
from trl_ext.rewards import make_accuracy_reward, make_format_reward
from trl_ext.testing import ScriptedGeneration, cpu_test_args
from trl_ext.trainers import ReplayGRPOConfig, ReplayGRPOTrainer


RESULTS = Path(__file__).parent / "results"
COMPLETION = "<think>3 plus 4 is 7.</think><answer>7</answer>"  # the scripted completion, filled to 32 tokens
WINDOW = 4


def make_trainer(replay: bool, steps: int, learning_rate: float, **replay_args):
    model, tokenizer = load_model()
    common = dict(max_steps=steps, per_device_train_batch_size=8, num_generations=4, max_completion_length=32,
                  temperature=1.0, learning_rate=learning_rate, lr_scheduler_type="constant", beta=0.0,
                  activation_checkpointing=False, reward_weights=[1.0, 0.5], seed=42)
    rewards = [make_accuracy_reward(lenient=True), make_format_reward()]
    data = graded_arithmetic(500, seed=42)
    if replay:
        args = cpu_test_args(tempfile.mkdtemp(), ReplayGRPOConfig, **common, **replay_args)
        return ReplayGRPOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=data,
                                 processing_class=tokenizer)
    args = cpu_test_args(tempfile.mkdtemp(), GRPOConfig, **common)
    return GRPOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=data, processing_class=tokenizer)


def logged(trainer, key):
    return [log[key] for log in trainer.state.log_history if key in log]


# -- overhead -----------------------------------------------------------------------------------------------------
def overhead(steps: int) -> dict:
    result = {"steps": steps, "order": "interleaved: one step of grpo, then one of replay_before_start, ...; "
                                       "warm-up dropped"}
    for scripted in (False, True):
        runs = {}
        for name in ("grpo", "replay_before_start"):
            trainer = make_trainer(name != "grpo", steps + 1, 1e-6, replay_start_ratio=1.0)
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
            "step_times": summarize(times, baseline="grpo"),
        }
    plot_overhead(result, RESULTS / "replay_overhead.png")
    return result


def plot_overhead(result: dict, path: Path) -> None:
    plot_step_times({part.replace("_", " "): result[part]["step_times"] for part in ("real_generation", "scripted")},
                    "grpo", path, "Replay GRPO before replay starts vs GRPOTrainer, interleaved steps")


# -- curves -------------------------------------------------------------------------------------------------------
def moving_average(values, window=WINDOW):
    return [statistics.mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def curves(steps: int, replay_start: float, learning_rate: float) -> dict:
    runs = {}
    for name in ("no_replay", "replay"):
        trainer = make_trainer(name == "replay", steps, learning_rate, replay_start_ratio=replay_start)
        trainer.train()
        # Fresh rollouts only: replayed rows are stored successes and would inflate the replay run's accuracy.
        accuracy = logged(trainer, "replay/solve_rate" if name == "replay" else "rewards/accuracy/mean")
        run = {"accuracy": accuracy, "accuracy_moving_average": moving_average(accuracy),
               "completion_tokens": [round(m * 8) for m in logged(trainer, "completions/mean_length")]}
        if name == "replay":
            exp = trainer.experience
            run.update(
                fresh_tokens=logged(trainer, "replay/fresh_tokens"),
                replay_groups=logged(trainer, "replay/replay_groups"),
                importance_ratio_mean=logged(trainer, "replay/importance_ratio_mean"),
                buffer_trajectories=logged(trainer, "replay/buffer_trajectories"),
                buffer_bytes=exp.nbytes,
                buffer_tokens=exp.num_tokens,
                buffer_bytes_per_token=exp.nbytes / max(exp.num_tokens, 1),
            )
        else:
            run["fresh_tokens"] = run["completion_tokens"]
        runs[name] = run
    result = {"steps": steps, "replay_start_ratio": replay_start, "learning_rate": learning_rate,
              **compare(runs), "runs": runs}
    plot_curves(result, RESULTS / "replay_curves.png")
    return result


def compare(runs: dict) -> dict:
    """Steps until the replay run's moving average reaches the no-replay run's final accuracy (its mean over the last
    quarter of the steps: one batch of 8 rollouts is too noisy to be "the" final value), and per-run summaries."""
    steps = len(runs["no_replay"]["accuracy"])
    tail = max(WINDOW, steps // 4)
    target = statistics.mean(runs["no_replay"]["accuracy"][-tail:])
    reached = next((i + 1 for i, a in enumerate(runs["replay"]["accuracy_moving_average"]) if a >= target), None)
    return {
        "no_replay_final_accuracy": target,
        "final_accuracy_window": tail,
        "replay_final_accuracy": statistics.mean(runs["replay"]["accuracy"][-tail:]),
        "replay_steps_to_reach_it": reached,
        "steps_ratio": None if reached is None else reached / steps,
        "mean_fresh_tokens_per_step": {k: statistics.mean(v["fresh_tokens"]) for k, v in runs.items()},
        "buffer_bytes_per_token": runs["replay"]["buffer_bytes_per_token"],
    }


def plot_curves(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_acc, ax_tok, ax_buf = fig.subplots(1, 3)
    ax_acc.axhline(result["no_replay_final_accuracy"], color="C0", linestyle=":", linewidth=0.8)
    start = result["replay_start_ratio"] * result["steps"]
    for color, (name, run) in zip(("C0", "C1"), result["runs"].items()):
        steps = range(1, len(run["accuracy"]) + 1)
        ax_acc.plot(steps, run["accuracy_moving_average"], color=color, label=f"{name} ({WINDOW}-step mean)")
        ax_acc.plot(steps, run["accuracy"], color=color, alpha=0.3, linestyle=":")
        ax_tok.plot(steps, run["fresh_tokens"], color=color, label=name)
    replay = result["runs"]["replay"]
    ax_buf.plot(range(1, len(replay["buffer_trajectories"]) + 1), replay["buffer_trajectories"])
    for ax, title in ((ax_acc, "accuracy"), (ax_tok, "fresh tokens generated"), (ax_buf, "buffer trajectories")):
        ax.axvline(start, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ax_acc.legend(fontsize=8)
    ax_tok.legend(fontsize=8)
    fig.suptitle("Replay GRPO vs GRPO on the embedded default (dashed: replay starts)")
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["overhead", "curves"])
    parser.add_argument("--steps", type=int, default=None, help="measured steps (overhead: 4, curves: 24)")
    parser.add_argument("--replay-start", type=float, default=0.25, help="curves: replay_start_ratio")
    parser.add_argument("--learning-rate", type=float, default=1e-5, help="curves: learning rate")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.part == "overhead":
        result = overhead(args.steps or 4)
    else:
        result = curves(args.steps or 24, args.replay_start, args.learning_rate)
    path = write_json(RESULTS / f"replay_{args.part}.json", result)
    print({k: v for k, v in result.items() if k != "runs"})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
