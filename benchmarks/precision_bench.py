"""bf16 autocast against float32 for the RLCR recipe's embedded default on this machine's CPU: the held-out greedy
evaluation and the RL step times, each precision in its own process (accelerate keeps one mixed-precision setting per
process), the two alternated `--repeats` times so that load lands on both alike.

    python benchmarks/precision_bench.py                 # 2 repeats of: evaluation (200 tune questions), 3 RL steps

Both start from the same warm-up checkpoint (the recipe's, as the default config builds it) and evaluate on the tune
split. Writes `benchmarks/results/precision_cpu.json` and `precision_cpu.png`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from common import machine_load, results_dir, rlcr_cpu_run, rlcr_cpu_warmup, step_times, write_result


PRECISIONS = {"float32": "false", "bf16 autocast": "true"}


def one_run(bf16: str, steps: int) -> dict:
    from transformers import AutoTokenizer

    from trl_ext.recipe.rlcr import accuracy_func
    from trl_ext.trainers import RLCRMultiTurnTrainer

    path, _ = rlcr_cpu_warmup()
    flags = ("--eval_split", "tune", "--bf16", bf16, "--max_steps", str(steps), "--logging_steps", "1")
    script_args, args, train, evaluation = rlcr_cpu_run((*flags, "--save_strategy", "no", "--eval_strategy", "no"))
    trainer = RLCRMultiTurnTrainer(
        model=path,
        reward_funcs=[],
        accuracy_func=accuracy_func(script_args),
        args=args,
        train_dataset=train.select(range(script_args.warmup_samples, len(train))),  # the recipe's RL rows
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    clock = time.monotonic()
    metrics = trainer.heldout_evaluate(evaluation)
    evaluation_seconds = time.monotonic() - clock
    trainer.train()
    return {
        "evaluation_seconds": evaluation_seconds,
        "step_seconds": step_times(trainer)[1:],  # the first step warms up
        "accuracy": metrics["eval_answer/accuracy"],
        "load": machine_load(),
    }


def plot(summary: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    for ax, key, label in zip(
        axes, ("evaluation_seconds", "step_seconds"), ("held-out evaluation (s)", "RL step (s)")
    ):
        names = list(summary)
        ax.bar(names, [summary[name][key] for name in names], color=["tab:blue", "tab:orange"])
        ax.set_ylabel(label + ", median")
    fig.suptitle("RLCR embedded default on this CPU: float32 vs bf16 autocast")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="RL steps per run (the first is not timed)")
    parser.add_argument("--one", choices=list(PRECISIONS.values()), help=argparse.SUPPRESS)  # a child run
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.steps)))
        return
    rlcr_cpu_warmup()  # built once, before the timed runs
    runs = {name: [] for name in PRECISIONS}
    for repeat in range(args.repeats):
        for name, flag in PRECISIONS.items():
            command = [sys.executable, __file__, "--one", flag, "--steps", str(args.steps)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(f"repeat {repeat} {name}: {runs[name][-1]}", flush=True)
    summary = {
        name: {
            "evaluation_seconds": statistics.median(r["evaluation_seconds"] for r in entries),
            "step_seconds": statistics.median(t for r in entries for t in r["step_seconds"]),
        }
        for name, entries in runs.items()
    }
    for key in ("evaluation_seconds", "step_seconds"):
        summary[f"bf16 / float32, {key}"] = summary["bf16 autocast"][key] / summary["float32"][key]
    out = results_dir() / "precision_cpu.json"
    write_result(out, {"summary": summary, "runs": runs, "repeats": args.repeats, "steps": args.steps})
    plot({name: summary[name] for name in PRECISIONS}, out.with_suffix(".png"))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
