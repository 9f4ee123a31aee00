"""Peak memory of training steps: each trainer against plain `GRPOTrainer` on the same model, prompts and generated
tokens, with where it goes; and the peak of each CPU recipe run. Plain GRPO runs with the trainers' CPU log-prob tile
(`cpu_logprob_tile_tokens`), so a pair differs only in its algorithm.

    python benchmarks/memory_bench.py steps                  # embedded default: CPU float32, CUDA bf16 + SDPA
    python benchmarks/memory_bench.py steps --model tiny     # a tiny random model: the plumbing's own cost
    python benchmarks/memory_bench.py configs                # each recipes/configs/*_cpu.yaml run, whole
    python benchmarks/memory_bench.py configs --max_steps 2 --only absolute_zero_code_smollm2_cpu

steps: every configuration runs in a process of its own (peak RSS is per process), in interleaved order over
`--repeats`. Generation is scripted with fixed-length completions, so each pair generates the same tokens: RLCR's
answers and confidences against GRPO rows of the same lengths and count; replay against GRPO on the same prompts and
rewards; Absolute Zero's solver and proposer rows against GRPO rows of the same count and length. A thread samples
the memory (CPU: resident set size of the process and its children; CUDA: `torch.cuda.memory_allocated`, plus
`torch.cuda.max_memory_allocated` for the whole run) every 10 ms with the phase the main thread is in, read off its
stack: generation, the rest of building a batch (rewards, old/reference log-probs), loss forward, loss backward, optimizer, sandbox, other. "after init" is
the memory once the trainer is built (weights, reference model, buffers), before the first step.

configs: each recipe run under a sampler of its process tree's resident memory; `--max_steps` shortens the runs.

Results: benchmarks/results/memory_<part>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import psutil


ROOT = Path(__file__).resolve().parent.parent
PAIRS = {"rlcr": "grpo_rlcr", "replay": "grpo_replay", "absolute_zero": "grpo_absolute_zero"}
# Innermost phase first: a frame's function name (or file) that puts the main thread in that phase.
PHASES = (
    ("sandbox", ("execute_many", "/sandbox/")),
    ("generation", ("_generate_single_turn",)),
    ("rewards, old/ref log-probs", ("_generate_and_score_completions",)),
    ("loss backward", ("backward",)),
    ("loss forward", ("compute_loss", "_compute_loss")),
    ("optimizer", ("/optim/",)),
)


def phase_of(stack: list[traceback.FrameSummary]) -> str:
    for phase, marks in PHASES:
        for frame in stack:
            if any(mark in (frame.filename if mark.startswith("/") else frame.name) for mark in marks):
                return phase
    return "other"


def tree_rss_mb(process: psutil.Process) -> float:
    """Resident memory of `process` and its children (those that exit while being read are skipped)."""
    rss = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            rss += p.memory_info().rss
        except psutil.Error:
            pass
    return rss / 2**20


class PhaseSampler:
    """Samples memory and the main thread's phase every `interval` seconds while running."""

    def __init__(self, interval: float = 0.01):
        import torch

        self.interval, self.cuda = interval, torch.cuda.is_available()
        self.process, self.main = psutil.Process(), threading.main_thread().ident
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def memory_mb(self) -> float:
        if self.cuda:
            import torch

            return torch.cuda.memory_allocated() / 2**20
        return tree_rss_mb(self.process)

    def _run(self):
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.main)
            phase = phase_of(traceback.extract_stack(frame)) if frame is not None else "other"
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), self.memory_mb())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def build(name: str, model_kind: str):
    """`(trainer, script)` for one configuration; see the module docstring for how pairs match."""
    from common import device_args, fixed_length, load_model, scratch_dir
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trl_ext.data import graded_arithmetic
    from trl_ext.testing import cpu_test_args, tiny_causal_lm
    from trl_ext.trainers import (
        AbsoluteZeroConfig,
        AbsoluteZeroTrainer,
        ReplayGRPOConfig,
        ReplayGRPOTrainer,
        RLCRMultiTurnConfig,
        RLCRMultiTurnTrainer,
    )

    model, tok = tiny_causal_lm() if model_kind == "tiny" else load_model()
    length, short, g = 64, 16, 4
    common = dict(
        max_steps=3, learning_rate=1e-6, activation_checkpointing=False, shuffle_dataset=False, **device_args()
    )
    long_text, short_text = fixed_length(tok, "<answer>7</answer>", length), fixed_length(tok, "0.7", short)
    data = graded_arithmetic(64, seed=0)

    def first_good(completions, **kwargs):  # half the rows succeed: replay stores and replays
        return [float(i % 2 == 0) for i in range(len(completions))]

    out = scratch_dir()
    if name == "rlcr":  # 2 prompts x 4 answers (64 tokens) x 2 confidences (16 tokens): 8 + 16 rows
        args = cpu_test_args(
            out,
            RLCRMultiTurnConfig,
            per_device_train_batch_size=8,
            num_generations=g,
            num_generations_confidence=2,
            max_completion_length=length,
            max_confidence_length=short,
            **common,
        )
        trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
        return trainer, lambda p, k: short_text if "onfidence" in p.split("<|im_start|>user")[-1] else long_text
    if name == "grpo_rlcr":  # 24 rows: 8 of 64 tokens, 16 of 16 tokens
        args = cpu_test_args(
            out, GRPOConfig, per_device_train_batch_size=24, num_generations=g, max_completion_length=length, **common
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=first_good, args=args, train_dataset=data, processing_class=tok
        )
        calls = []

        def script(p, k):
            calls.append(p)
            return long_text if (len(calls) - 1) % 24 < 8 else short_text

        return trainer, script
    if name in ("replay", "grpo_replay"):  # 4 prompts x 4 rollouts of 64 tokens, half succeed
        rows = Dataset.from_list([{**r, "task_id": f"t{i}"} for i, r in enumerate(data)])
        config_cls, trainer_cls = (
            (ReplayGRPOConfig, ReplayGRPOTrainer) if name == "replay" else (GRPOConfig, GRPOTrainer)
        )
        extra = dict(replay_start_ratio=0.0, experience_lbound=0) if name == "replay" else {}
        args = cpu_test_args(
            out,
            config_cls,
            per_device_train_batch_size=16,
            num_generations=g,
            max_completion_length=length,
            **extra,
            **common,
        )
        trainer = trainer_cls(
            model=model, reward_funcs=first_good, args=args, train_dataset=rows, processing_class=tok
        )
        return trainer, lambda p, k: long_text
    seeds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Propose a sum, {i}"}]} for i in range(16)])
    if name == "absolute_zero":  # 4 seed prompts: 4 x 2 proposals + 4 x 4 solver rows, all 64 tokens
        args = cpu_test_args(
            out,
            AbsoluteZeroConfig,
            per_device_train_batch_size=16,
            num_generations=g,
            num_questions_per_prompt=2,
            max_repropose_attempts=0,
            proposer_rows="all",
            max_completion_length=length,
            max_question_length=length,
            **common,
        )

        def parse(text):
            return {"question": "What is 3+4?"}

        trainer = AbsoluteZeroTrainer(
            model, [first_good], args=args, train_dataset=seeds, processing_class=tok, parse_question=parse
        )
        return trainer, lambda p, k: long_text
    if name == "grpo_absolute_zero":  # 24 rows of 64 tokens
        args = cpu_test_args(
            out, GRPOConfig, per_device_train_batch_size=24, num_generations=6, max_completion_length=length, **common
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=first_good, args=args, train_dataset=seeds, processing_class=tok
        )
        return trainer, lambda p, k: long_text
    raise ValueError(name)


def run_one(name: str, model_kind: str) -> dict:
    """Build one configuration, train it under the sampler, return its memory figures."""
    import torch

    from trl_ext.models.logprob_tiles import cpu_logprob_tiles
    from trl_ext.testing import ScriptedGeneration

    trainer, script = build(name, model_kind)
    # Plain GRPO gets the trainers' CPU log-prob tile (`cpu_logprob_tile_tokens`), so each pair differs only in its
    # algorithm; with TRL's own tile GRPO's CPU backward alone holds about 4 GB more.
    tile = getattr(trainer.args, "cpu_logprob_tile_tokens", 256)
    sampler = PhaseSampler()
    after_init = sampler.memory_mb()
    if sampler.cuda:
        torch.cuda.reset_peak_memory_stats()
    with sampler, ScriptedGeneration(trainer, script), cpu_logprob_tiles(tile, trainer.accelerator.device):
        trainer.train()
    tokens = [log["num_tokens"] for log in trainer.state.log_history if "num_tokens" in log]
    result = {
        "after_init_mb": after_init,
        "peak_mb": max(sampler.peaks.values()),
        "phases_mb": sampler.peaks,
        "num_tokens": tokens[-1] if tokens else None,
        "steps": trainer.state.global_step,
    }
    if sampler.cuda:
        result["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def steps(model_kind: str, repeats: int, only: list[str] | None) -> dict:
    names = [n for pair in PAIRS.items() for n in reversed(pair) if not only or pair[0] in only]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for repeat in range(repeats):
        for name in names:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                cmd = [sys.executable, __file__, "_one", name, "--model", model_kind, "--out", out.name]
                subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
                runs[name].append(json.loads(Path(out.name).read_text()))
            print(f"repeat {repeat}: {name} peak {runs[name][-1]['peak_mb']:.0f} MB", flush=True)
    summary = {}
    for trainer, grpo in PAIRS.items():
        if trainer in runs:
            peak = statistics.median(r["peak_mb"] for r in runs[trainer])
            base = statistics.median(r["peak_mb"] for r in runs[grpo])
            summary[trainer] = {"peak_mb": peak, "grpo_peak_mb": base, "ratio": peak / base}
    from common import device_name, on_cuda

    return {
        "model": model_kind,
        "device": "cuda" if on_cuda() else "cpu",
        "device_name": device_name(),
        "repeats": repeats,
        "summary": summary,
        "runs": runs,
    }


def configs(max_steps: int | None, only: list[str] | None) -> dict:
    results = {}
    for path in sorted((ROOT / "recipes" / "configs").glob("*_cpu.yaml")):
        if only and path.stem not in only:
            continue
        recipe = path.stem.split("_smollm2")[0]
        script = {"absolute_zero_code": "absolute_zero", "absolute_zero_workspace": "absolute_zero"}.get(
            recipe, recipe
        )
        output_dir = tempfile.TemporaryDirectory(prefix=f"{path.stem}_")  # the recipe's checkpoints: GBs
        cmd = [
            sys.executable,
            str(ROOT / "recipes" / f"{script}.py"),
            "--config",
            str(path),
            "--output_dir",
            output_dir.name,
            "--save_strategy",
            "no",
        ]
        if max_steps:
            cmd += ["--max_steps", str(max_steps)]
        started, peak, timeline = time.monotonic(), 0.0, []
        with output_dir, open(os.devnull, "w") as sink:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
            root = psutil.Process(proc.pid)
            while proc.poll() is None:
                rss = tree_rss_mb(root)
                peak = max(peak, rss)
                timeline.append((round(time.monotonic() - started, 1), round(rss)))
                time.sleep(0.1)
        results[path.stem] = {
            "returncode": proc.returncode,
            "peak_mb": peak,
            "seconds": time.monotonic() - started,
            "max_steps": max_steps,
            "timeline": timeline[::10],
        }
        print(f"{path.stem}: peak {peak:.0f} MB in {results[path.stem]['seconds']:.0f} s", flush=True)
    return {"configs": results}


def plot_steps(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = ["after init"] + [p for p, _ in PHASES] + ["other"]
    names = [n for pair in PAIRS.items() for n in reversed(pair) if n in result["runs"]]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        runs = result["runs"][name]
        values = [statistics.median(r["after_init_mb"] for r in runs)]
        values += [statistics.median(r["phases_mb"].get(p, 0.0) for r in runs) for p in phases[1:]]
        ax.bar([x + i * width for x in range(len(phases))], values, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(phases))], phases, rotation=20)
    ax.set_ylabel("peak memory in the phase (MB)")
    device = result.get("device_name", result["device"])
    ax.set_title(f"Peak memory per phase, {result['model']} model on {device} (each trainer vs GRPO)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["steps", "configs", "_one"])
    parser.add_argument("name", nargs="?", help="(internal) the configuration _one runs")
    parser.add_argument("--model", choices=["embedded", "tiny"], default="embedded")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", help="comma-separated trainers (steps) or config names (configs)")
    parser.add_argument("--max_steps", type=int, help="configs: shorten each recipe run")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    if args.part == "_one":
        Path(args.out).write_text(json.dumps(run_one(args.name, args.model)))
        return
    from common import results_dir, write_result

    results = results_dir()
    results.mkdir(parents=True, exist_ok=True)
    if args.part == "steps":
        result = steps(args.model, args.repeats, only)
        stem = f"memory_steps_{args.model}_{result['device']}"
    else:
        result = configs(args.max_steps, only)
        stem = "memory_configs"
    # before the plot, which may fail; steps: every trainer has cpu_test_args' seed, configs: each config's own
    write_result(results / f"{stem}.json", result, seeds=[0] if args.part == "steps" else None)
    if args.part == "steps":
        plot_steps(result, results / f"{stem}.png")
    print(json.dumps(result.get("summary", {k: v["peak_mb"] for k, v in result.get("configs", {}).items()}), indent=1))


if __name__ == "__main__":
    main()
