"""What the benchmark scripts share: the embedded default model, fixed-length scripted completions, step times
measured with the compared configurations interleaved (A B A B ...), so that load on a shared machine lands on every
configuration alike, and the results' writer: every result JSON records its provenance (commit, package versions,
device, command line, seeds), and an evaluation's per-sample records go beside it as JSONL."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser

from trl_ext import default_model_path
from trl_ext.models.logprob_tiles import CPULogprobTiles
from trl_ext.trainers.base import TrlExtGRPOConfig


ROOT = Path(__file__).resolve().parent.parent
RLCR_CPU_CONFIG = ROOT / "recipes" / "configs" / "rlcr_smollm2_cpu.yaml"  # the RLCR recipe's embedded default


# Checkpoints and recipe outputs of one benchmark process (GBs per run): removed when the process exits.
_SCRATCH = tempfile.TemporaryDirectory(prefix="trl_ext_bench_")


def scratch_dir(prefix: str | None = None) -> str:
    """A new folder for a run's outputs inside this process's scratch folder, which is removed at exit."""
    return tempfile.mkdtemp(prefix=prefix, dir=_SCRATCH.name)


def results_dir() -> Path:
    """Where a benchmark writes its JSON and plots: `benchmarks/results/` (the committed figures), or
    `$TRL_EXT_BENCH_RESULTS` (gpu_check.sh points it at a new folder unless asked to replace them)."""
    return Path(os.environ.get("TRL_EXT_BENCH_RESULTS") or Path(__file__).parent / "results")


def on_cuda() -> bool:
    """Whether the benchmarks run on a CUDA GPU (then in bf16 with SDPA attention) rather than on CPU in float32."""
    return torch.cuda.is_available()


def device_args() -> dict:
    """Training-argument overrides for the machine: none on CPU (the test helpers' float32 CPU settings); on CUDA, the
    GPU with bf16 autocast."""
    return dict(use_cpu=False, bf16=True) if on_cuda() else {}


def device_name() -> str:
    return torch.cuda.get_device_name() if on_cuda() else "CPU"


PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "trl-ext")


def git_commit() -> str | None:
    """`$TRL_EXT_COMMIT` when set: the commit a copy of the tree was made from, named by whoever copied it (a GPU
    machine's copy may carry no `.git`, or a stale one: runs there recorded the session's first commit, `-dirty`,
    for a tree several commits later). Else the checkout's commit, with `-dirty` when tracked files outside
    `benchmarks/results/` differ from it; None outside a git checkout."""
    if os.environ.get("TRL_EXT_COMMIT"):
        return os.environ["TRL_EXT_COMMIT"]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        # the results folder left out: the benchmarks rewrite its files, so a run after another would read dirty
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if dirty else "")


def provenance(seeds=None, argv: list[str] | None = None) -> dict:
    """What a result depends on beyond its numbers: the commit, the package versions, the device, the command line
    and the seeds."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    argv = sys.argv if argv is None else argv
    return {
        "commit": git_commit(),
        "packages": versions,
        "python": platform.python_version(),
        "device": device_name(),
        "cuda": torch.version.cuda if on_cuda() else None,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "command": shlex.join([Path(sys.executable).name, *argv]),
        "seeds": seeds,
    }


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def write_result(path, payload: dict, seeds=None, records: list[dict] | None = None) -> Path:
    """`payload` as JSON at `path` with its `provenance`, and `records` (one dict per evaluated sample) as JSONL
    beside it (`<name>.jsonl`), named in the JSON under `records_file`."""
    from trl_ext.evaluation.records import write_jsonl
    from trl_ext.recipe import write_json

    path = Path(path)
    payload = {**payload, "provenance": provenance(seeds)}
    if records is not None:
        payload["records_file"] = path.with_suffix(".jsonl").name
        write_jsonl(path.with_suffix(".jsonl"), records)
    write_json(path, payload)
    return path


def merge_results(results: dict[str, dict]) -> dict:
    """Results of runs that belong together (`file name -> result JSON`), each a dict of `runs` (name -> entry) plus
    settings, as one result: the runs' union (a name in two files is an error: rename one run), the settings they
    share, and per file its provenance and the settings it does not share (`merged_from`)."""
    if not results:
        raise ValueError("merge_results needs at least one result.")
    seen = {}
    runs = {}
    for file, result in results.items():
        for name, entry in result.get("runs", {}).items():
            if name in seen:
                raise ValueError(f"run {name!r} is in both {seen[name]} and {file}: rename one before merging.")
            seen[name] = file
            runs[name] = entry
    own = ("runs", "provenance", "records_file")
    keys = {key for result in results.values() for key in result if key not in own}
    shared = {
        key: next(iter(results.values()))[key]
        for key in sorted(keys)
        if all(key in r for r in results.values())
        and all(r[key] == next(iter(results.values()))[key] for r in results.values())
    }
    merged_from = [
        {
            "file": file,
            "provenance": result.get("provenance"),
            **{key: value for key, value in result.items() if key not in own and key not in shared},
        }
        for file, result in results.items()
    ]
    return {**shared, "runs": runs, "merged_from": merged_from}


def load_model(path=None, dtype=None):
    """A checkpoint (default: the embedded SmolLM2-135M-Instruct) with its tokenizer and SDPA attention: `dtype`, else
    float32 on CPU and bfloat16 on CUDA."""
    path = path or default_model_path()
    dtype = dtype or (torch.bfloat16 if on_cuda() else torch.float32)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    return model, AutoTokenizer.from_pretrained(path)


def rlcr_cpu_run(flags: tuple[str, ...] = ()):
    """`(script args, training args, train, evaluation)` of `accelerate launch recipes/rlcr.py` on the embedded
    default with `flags` (e.g. `--eval_split tune`): its config parsed and its datasets built as the recipe does."""
    from trl_ext.recipe import with_default_config
    from trl_ext.recipe.data import datasets_for
    from trl_ext.recipe.rlcr import RLCRScriptArguments
    from trl_ext.trainers import RLCRMultiTurnConfig

    parser = TrlParser((RLCRScriptArguments, RLCRMultiTurnConfig, ModelConfig))
    script_args, training_args, _ = parser.parse_args_and_config(
        args=with_default_config(["--output_dir", scratch_dir(), *flags], RLCR_CPU_CONFIG)
    )
    return (script_args, training_args, *datasets_for(script_args, training_args))


# The recipe's warm-up without its second stage, which teaches only the multi-turn confidence turn: what benchmarks
# whose models have no such turn (replay, the single-turn baseline's shared warm-up) start from.
FIRST_STAGE = ("--warmup_confidences", "weighted")


def rlcr_cpu_warmup() -> tuple[str, str]:
    """`(checkpoint, system prompt)` of the RLCR recipe's format warm-up of the embedded default: its first stage, built
    (once, cached) exactly as `accelerate launch recipes/rlcr.py` builds it, so benchmarks start from the same model."""
    from trl_ext.recipe import resolve_model
    from trl_ext.recipe.rlcr import warm_up

    script_args, training_args, train, _ = rlcr_cpu_run(FIRST_STAGE)
    path, _, _ = warm_up(resolve_model(None), train, script_args, training_args)
    return path, script_args.system_prompt


def step_times(trainer) -> list[float]:
    return [log["step_time"] for log in trainer.state.log_history if "step_time" in log]


def fixed_length(tokenizer, text: str, n: int) -> list[int]:
    """`text` as token ids, filled with " ok" or cut to `n - 1` tokens, then EOS: a finished completion of n tokens."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    filler = tokenizer.encode(" ok", add_special_tokens=False)
    return (ids + filler * n)[: n - 1] + [tokenizer.eos_token_id]


def machine_load() -> dict:
    """The load averages (1, 5, 15 min) and the CPU count, to read a timing against."""
    return {"load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count()}


class _Turns(TrainerCallback):
    """Lets one trainer at a time run a step, in round-robin order.

    A trainer waits for its turn at the start of each step and passes it on at the start of its next step (or when
    it finishes), so its whole step, optimizer update and logging included, runs alone. The global RNG state
    (torch, numpy, random) is saved when a trainer passes its turn and restored when it gets the next one, so each
    trainer draws the same random numbers as it would running alone (seeded by `args.seed` at its first step).
    """

    def __init__(self, turns, index):
        self.turns, self.index = turns, index

    def on_step_begin(self, args, state, control, **kwargs):
        self.turns.take(self.index, args.seed)

    def on_train_end(self, args, state, control, **kwargs):
        self.turns.leave(self.index)


class _Rotation:
    def __init__(self, n):
        self.cond = threading.Condition()
        self.active = list(range(n))
        self.current = 0
        self.holder = None
        self.rng = {}

    def _pass_on(self, index):
        if torch.cuda.is_available():  # the step's kernels finish inside its own turn
            torch.cuda.synchronize()
        self.rng[index] = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        self.holder = None
        position = self.active.index(index)
        self.current = self.active[(position + 1) % len(self.active)] if len(self.active) > 1 else index
        self.cond.notify_all()

    def take(self, index, seed):
        with self.cond:
            if self.holder == index:
                self._pass_on(index)
            self.cond.wait_for(lambda: self.current == index and self.holder is None)
            self.holder = index
            if index in self.rng:
                torch_state, numpy_state, python_state = self.rng[index]
                torch.set_rng_state(torch_state)
                np.random.set_state(numpy_state)
                random.setstate(python_state)
            else:
                set_seed(seed)

    def leave(self, index):
        """Drop out of the rotation, then wait for the others to finish: what a trainer does after its last step
        (saving, logging, tearing its thread down) would otherwise run during another trainer's step."""
        with self.cond:
            if self.holder == index:
                self._pass_on(index)
            if index in self.active:
                self.active.remove(index)
            if self.active and self.current == index:
                self.current = self.active[0]
            self.cond.notify_all()
            self.cond.wait_for(lambda: not self.active)


def interleaved_step_times(runs: dict) -> dict[str, list[float]]:
    """Train every trainer of `runs` (`name -> (trainer, context)`, `context` a context manager entered around its
    `train()`, e.g. `ScriptedGeneration`, or None), one step of each in turn, and return each one's step times
    (TRL's `step_time`) with the first (warm-up) step dropped.

    Each trainer runs in its own thread, but only the one whose turn it is computes: the configurations share the
    machine's load step by step instead of one after the other.
    """
    rotation = _Rotation(len(runs))
    errors = []

    def train(index, trainer, context):
        try:
            with context or contextlib.nullcontext():
                trainer.train()
        except BaseException as error:  # re-raised in the calling thread
            errors.append(error)
            rotation.leave(index)

    threads = []
    for index, (trainer, context) in enumerate(runs.values()):
        trainer.add_callback(_Turns(rotation, index))
        threads.append(threading.Thread(target=train, args=(index, trainer, context)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return {name: step_times(trainer)[1:] for name, (trainer, _) in runs.items()}


class GRPOWithCPULogprobTiles(CPULogprobTiles, GRPOTrainer):
    """Plain GRPO on the trainers' CPU log-prob path (labelled positions only, in `cpu_logprob_tile_tokens` tiles),
    per training step (the benchmarks' trainers share a process)."""


# The step-time benchmarks' two plain-GRPO baselines, `name -> (trainer class, config class)`: GRPO as TRL ships it
# (on CPU its fused LM head scores every prompt position, in 4096-token tiles), and on the trainers' CPU log-prob
# path. A method's ratio to the first is what a user sees; to the second, what the method's algorithm costs.
GRPO_BASELINES = {
    "grpo": (GRPOTrainer, GRPOConfig),
    "grpo_cpu_tiles": (GRPOWithCPULogprobTiles, TrlExtGRPOConfig),
}


def summarize(times: dict[str, list[float]], baselines=tuple(GRPO_BASELINES)) -> dict:
    """Per configuration: min, median, max and spread ((max - min) / median) of the step times; against each of
    `baselines` (under `vs_<baseline>`): the ratio of medians, the ratio of mins, and the median of the step-by-step
    ratios (step i of a configuration over step i of the baseline, measured next to each other)."""
    summary = {}
    for name, values in times.items():
        median = statistics.median(values)
        summary[name] = {
            "min_s": min(values),
            "median_s": median,
            "max_s": max(values),
            "spread": (max(values) - min(values)) / median,
            "step_times_s": values,
        }
    for baseline in baselines:
        base = times[baseline]
        for name, values in times.items():
            if name != baseline:
                summary[name]["vs_" + baseline] = {
                    "ratio_of_medians": summary[name]["median_s"] / summary[baseline]["median_s"],
                    "ratio_of_mins": summary[name]["min_s"] / summary[baseline]["min_s"],
                    "median_paired_ratio": statistics.median(a / b for a, b in zip(values, base)),
                }
    return summary


def plot_step_times(panels: dict[str, dict], path, title: str, baselines=tuple(GRPO_BASELINES)) -> None:
    """One panel per `summarize` result (`panel title -> summary`): each configuration's step times (points) and
    median (bar), labelled with its ratios (of medians, of mins) to each of `baselines`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width = sum(1 + 2.0 * len(summary) for summary in panels.values())
    fig = Figure(figsize=(max(width, 5), 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (panel, summary) in zip(axes, panels.items()):
        labels = []
        for x, (name, stats) in enumerate(summary.items()):
            values = stats["step_times_s"]
            ax.scatter([x] * len(values), values, color=f"C{x}", alpha=0.6, s=18)
            ax.hlines(stats["median_s"], x - 0.3, x + 0.3, color=f"C{x}")
            labels.append(
                "\n".join(
                    [name]
                    + [
                        f"vs {baseline}: {ratios['ratio_of_medians']:.2f}x (mins {ratios['ratio_of_mins']:.2f}x)"
                        for baseline in baselines
                        if (ratios := stats.get("vs_" + baseline))
                    ]
                )
            )
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylabel("step time (s)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3, axis="y")
        ax.set_title(panel, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)
