"""RLCR ablation: the main job (`recipes/rlcr.py`, embedded default) with one setting changed per row, each row a
held-out greedy evaluation before and after RL.

    python benchmarks/rlcr_ablation.py                                # every variant, one at a time (CPU: ~10 min each)
    python benchmarks/rlcr_ablation.py --parallel 16 --tag h200 -- --use_cpu false   # all at once on one GPU
    python benchmarks/rlcr_ablation.py --only base,gc4 -- --max_steps 48 --num_eval_samples 100
    python benchmarks/rlcr_ablation.py --only base,kl_answers0.5 --seeds 42,1   # each variant once per seed
    python benchmarks/rlcr_ablation.py --only base -- --confidence_samples 8   # + the mean of 8 sampled confidences

Arguments after `--` go to every run (they override the recipe's YAML). Every run evaluates on the built-in data's
tune split (`--eval_split tune`, unless given after `--`): settings are chosen there, never on the report split.
Results: benchmarks/results/rlcr_ablation_<tag>.json (per variant: its flags, before/after accuracy, ECE, Brier,
AUROC, Brier skill, AUROC within levels, skill against the levels' accuracies, their bootstrap 95% intervals, mean
confidence, confidence-bin counts, with `--confidence_samples k` the same for the stated confidence's mean of k
samples (`stated_confidence_mean_of_k`), and the training log; the provenance: commit, packages, device, command
line, seeds), .jsonl beside it (every evaluated answer of every run: run, before/after, question, level, answer, correct,
stated confidence) and .png (AUROC after against the accuracy change; shaded: AUROC >= 0.65).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import results_dir, write_result

from trl_ext.evaluation.calibration import INTERVAL_METRICS
from trl_ext.evaluation.records import read_jsonl
from trl_ext.evaluation.rlcr import MEAN_OF_K


ROOT = Path(__file__).resolve().parent.parent
RESULTS = results_dir()
_CALIBRATION = (*INTERVAL_METRICS, "mean_confidence", "confidence_parse_fail_rate")
METRICS = (*_CALIBRATION, "accuracy_all_interval", "intervals")
# The stated confidence's mean of k samples (`--confidence_samples k` after `--`), a second column beside the greedy one
MEAN_OF_K_METRICS = (
    "n",
    *_CALIBRATION,
    "sample_parse_fail_rate",
    "samples_per_question",
    "generated_tokens",
    "intervals",
)
LOGGED = ("step", "kl", "answer/", "calibration/", "confidence/")  # the training-log columns kept per step
_LORA = ["--use_peft", "true", "--lora_r", "16", "--lora_alpha", "32"]
_PROMPT_NORM_KL = ["--confidence_normalization", "answer_then_prompt", "--beta", "0.5", "--confidence_beta", "0"]
VARIANTS = {
    "base": [],
    # the warm-up's stated confidences distilled from the warmed-up model's own sampling agreement (8 answers per row)
    "agreement_warmup": ["--warmup_confidences", "agreement"],
    "beta0": ["--beta", "0"],
    "beta0.1": ["--beta", "0.1"],
    "beta0.2": ["--beta", "0.2"],
    "lans0": ["--lambda_ans", "0"],
    "lans0_beta0.1": ["--lambda_ans", "0", "--beta", "0.1"],
    "lr5e-5": ["--learning_rate", "5e-5"],
    "lr5e-5_beta0.1": ["--learning_rate", "5e-5", "--beta", "0.1"],
    "lora_lr5e-4": [*_LORA, "--learning_rate", "5e-4"],
    "lora_lr1e-3_beta0": [*_LORA, "--learning_rate", "1e-3", "--beta", "0"],
    "gc4": ["--num_generations_confidence", "4"],
    # both turns sampled (and scored) at temperature 1: the YAMLs' setting now (the CPU YAML had 0.5 when these were
    # added; over the current one they repeat `base` and `gc4`)
    "t1": ["--temperature", "1.0"],
    "t1_gc4": ["--temperature", "1.0", "--num_generations_confidence", "4"],
    "ga4": ["--num_generations", "4", "--per_device_train_batch_size", "16"],  # x 2 micro-batches: 8 prompts
    # a KL anchor on the answer rows only (`confidence_beta 0`): the answers held, the confidences free
    "kl_answers0.2": ["--beta", "0.2", "--confidence_beta", "0"],
    "kl_answers0.5": ["--beta", "0.5", "--confidence_beta", "0"],
    "kl_answers1": ["--beta", "1", "--confidence_beta", "0"],
    "kl_answers0.5_gc4": ["--beta", "0.5", "--confidence_beta", "0", "--num_generations_confidence", "4"],
    "kl_answers0.5_lans0": ["--beta", "0.5", "--confidence_beta", "0", "--lambda_ans", "0"],
    "kl_answers0.5_lr5e-5": ["--beta", "0.5", "--confidence_beta", "0", "--learning_rate", "5e-5"],
    "kl_answers0.5_prompt_norm": [
        "--beta",
        "0.5",
        "--confidence_beta",
        "0",
        "--confidence_normalization",
        "answer_then_prompt",
    ],
    "kl_answers0.5_conf_t1": [
        "--beta",
        "0.5",
        "--confidence_beta",
        "0",
        "--confidence_generation_kwargs",
        '{"temperature": 1.0}',
    ],
    # confidence advantages standardised over the prompt (order 1, where the siblings' Brier differences are ~0.02)
    "prompt_norm": ["--confidence_normalization", "answer_then_prompt"],
    "prompt_norm_kl_answers0.5_lr5e-5": [*_PROMPT_NORM_KL, "--learning_rate", "5e-5"],
    "prompt_norm_kl_answers0.5_gc4": [*_PROMPT_NORM_KL, "--num_generations_confidence", "4"],
    "prompt_norm_kl_answers0.5_uniform_warmup": [*_PROMPT_NORM_KL, "--warmup_confidences", "uniform"],
    "prompt_norm_uniform_warmup_lr5e-5": [
        "--confidence_normalization",
        "answer_then_prompt",
        "--warmup_confidences",
        "uniform",
        "--learning_rate",
        "5e-5",
    ],
    "prompt_norm_lora_lr2e-3": [*_LORA, "--confidence_normalization", "answer_then_prompt", "--learning_rate", "2e-3"],
    # over the current default (confidence advantages on one batch-wide scale): the previous default's per-prompt
    # standardisation, a heavier confidence turn, the uniform warm-up
    "lconf3": ["--lambda_conf", "3"],
    "prompt_norm_lconf3": ["--confidence_normalization", "answer_then_prompt", "--lambda_conf", "3"],
    "uniform_warmup": ["--warmup_confidences", "uniform"],
    # issue 34's levers for answer-level discrimination (choose on the tune split): training questions whose
    # difficulty is not written on them (one level's form; the three levels a 135M model gets partly right), more
    # answers or more confidences per answer, a longer run
    "level2": ["--train_levels", "2"],
    "levels123": ["--train_levels", "1", "2", "3"],
    "gc8": [
        "--num_generations_confidence",
        "8",
        "--per_device_train_batch_size",
        "2",
        "--gradient_accumulation_steps",
        "8",
    ],
    "steps48": ["--max_steps", "48"],
    "own_answer_prompt": [
        "--confidence_prompt",
        "How likely is it that the answer you just gave is correct? Give a probability from 0 to 1.",
    ],
    # DAPO-style refill: prompts whose answers are all right or all wrong are answered again (up to 4 more calls)
    # until one of them is right and another wrong, so the confidence turn sees answers with different labels
    "refill4": ["--answer_refill_rounds", "4"],
    "refill2": ["--answer_refill_rounds", "2"],  # half the extra generation calls
    "refill0": ["--answer_refill_rounds", "0"],  # no refill, whatever the config says
    # both: one level's questions, so the form tells nothing, and groups refilled until their answers differ
    "level2_refill4": ["--train_levels", "2", "--answer_refill_rounds", "4"],
    # the confidence turn sampled hotter than the answers: its siblings keep disagreeing (their advantages nonzero)
    # for longer, so RL keeps a signal to learn the readout from (benchmarks/rlcr_probe.py: the hidden state at the
    # confidence turn separates right from wrong within levels, the stated confidence does not)
    "conf_t1.5": ["--confidence_temperature", "1.5"],
    # the warm-up's stated confidences read off the probability of the model's own answer (a chance of being right,
    # fitted on the RL rows' gold answers); with a KL anchor on the confidence turn too, so RL keeps what it taught
    "probability_warmup": ["--warmup_confidences", "answer_probability"],
    "probability_warmup_conf_kl0.5": ["--warmup_confidences", "answer_probability", "--confidence_beta", "0.5"],
    "base_s1": ["--seed", "1"],
    "beta0.1_s1": ["--beta", "0.1", "--seed", "1"],
    "lans0_beta0.1_s1": ["--lambda_ans", "0", "--beta", "0.1", "--seed", "1"],
}


def run_name(variant: str, seed: str | None) -> str:
    return variant if seed is None else f"{variant}@{seed}"


def run_all(names: list[str], extra: list[str], parallel: int, workdir: Path, seeds: list[str | None], save) -> dict:
    """Run the variants (once per seed), `parallel` at a time (one CPU thread each when several), and read their
    metrics.json; `save(results)` after each run ends, so a sweep cut short keeps the runs that finished."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if parallel > 1:
        env["OMP_NUM_THREADS"] = "1"
    runs = [(run_name(n, seed), n, seed) for n in names for seed in seeds]
    pending, running, results = list(runs), {}, {}
    while pending or running:
        while pending and len(running) < parallel:
            name, variant, seed = pending.pop(0)
            flags = [*VARIANTS[variant], *([] if seed is None else ["--seed", seed]), *extra]
            cmd = [
                sys.executable,
                str(ROOT / "recipes" / "rlcr.py"),
                "--output_dir",
                str(workdir / name),
                "--save_strategy",
                "no",
                *flags,
            ]
            log = open(workdir / f"{name}.log", "w")
            running[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT), flags)
            print(f"started {name}: {' '.join(flags)}", flush=True)
        for name, (proc, flags) in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                results[name] = read_run(name, flags, proc.returncode, workdir)
                print(f"{name}: {summary_line(results[name])}", flush=True)
                save(results)
        time.sleep(2)
    return {name: results[name] for name, _, _ in runs}


def read_run(name: str, flags: list[str], returncode: int, workdir: Path) -> dict:
    entry = {"flags": flags, "returncode": returncode}
    metrics = workdir / name / "metrics.json"
    if not metrics.is_file():
        entry["log_tail"] = (workdir / f"{name}.log").read_text()[-3000:]
        return entry
    report = json.loads(metrics.read_text())
    for key in ("before", "after"):
        entry[key] = {k: report[key].get(k) for k in METRICS}
        entry[key]["bin_counts"] = [b["count"] for b in report[key]["bins"]]
        if MEAN_OF_K in report[key]:
            entry[key][MEAN_OF_K] = {k: report[key][MEAN_OF_K].get(k) for k in MEAN_OF_K_METRICS}
    entry["records"] = [
        {"run": name, "evaluation": key, **record}
        for key in ("before", "after")
        if (workdir / name / f"eval_{key}.jsonl").is_file()
        for record in read_jsonl(workdir / name / f"eval_{key}.jsonl")
    ]
    entry["seconds"] = report.get("seconds")
    entry["train_log"] = [
        {k: v for k, v in row.items() if k.startswith(LOGGED)} for row in report.get("train_log", [])
    ]
    return entry


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def summary_line(entry: dict) -> str:
    if "after" not in entry:
        return f"failed (exit {entry['returncode']})"
    b, a = entry["before"], entry["after"]
    line = (
        f"accuracy {_fmt(b['accuracy'])} -> {_fmt(a['accuracy'])}, ECE {_fmt(b['ece'])} -> {_fmt(a['ece'])}, "
        f"AUROC {_fmt(b['auroc'])} -> {_fmt(a['auroc'])}, within levels {_fmt(b['auroc_within_groups'])} -> "
        f"{_fmt(a['auroc_within_groups'])}, Brier skill {_fmt(b['brier_skill'])} -> {_fmt(a['brier_skill'])}, "
        f"confidence bins {a['bin_counts']}"
    )
    if MEAN_OF_K in a:
        within = [_fmt(e.get(MEAN_OF_K, {}).get("auroc_within_groups")) for e in (b, a)]
        line += f", mean of {a[MEAN_OF_K]['samples_per_question']} confidences within levels {' -> '.join(within)}"
    return line


def plot(result: dict, path: Path) -> None:
    """AUROC after RL against the change in accuracy, one labelled point per variant; shaded: AUROC >= 0.65."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    ax.axhspan(0.65, 1.0, xmin=0, xmax=1, color="tab:green", alpha=0.08)
    ax.axvline(-0.03, color="tab:green", linestyle="--", linewidth=1)
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    for name, entry in result["runs"].items():
        if "after" not in entry or entry["after"]["auroc"] is None:
            continue
        x = entry["after"]["accuracy"] - entry["before"]["accuracy"]
        ax.scatter(x, entry["after"]["auroc"], color="tab:blue")
        ax.annotate(name, (x, entry["after"]["auroc"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("held-out accuracy after RL - before")
    ax.set_ylabel("held-out AUROC after RL (0.5: one constant confidence)")
    ax.set_title(
        f"RLCR ablation ({result['tag']}): shaded, AUROC >= 0.65; right of the dashed line, accuracy kept", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated variant names (default: all)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (GPU: as many as fit)")
    parser.add_argument("--tag", default="cpu", help="results file suffix, e.g. the machine")
    parser.add_argument("--seeds", help="comma-separated seeds: each variant runs once per seed (default: its own)")
    args = parser.parse_args(own)
    names = args.only.split(",") if args.only else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    RESULTS.mkdir(exist_ok=True)

    if "--eval_split" not in extra:
        extra = [*extra, "--eval_split", "tune"]

    def save(runs):
        records = [record for entry in runs.values() for record in entry.get("records", [])]
        runs = {name: {k: v for k, v in entry.items() if k != "records"} for name, entry in runs.items()}
        result = {"tag": args.tag, "extra_flags": extra, "runs": runs}
        seeds = args.seeds.split(",") if args.seeds else "each variant's own (the recipe's --seed)"
        write_result(RESULTS / f"rlcr_ablation_{args.tag}.json", result, seeds=seeds, records=records)
        plot(result, RESULTS / f"rlcr_ablation_{args.tag}.png")

    with tempfile.TemporaryDirectory() as workdir:
        seeds = args.seeds.split(",") if args.seeds else [None]
        save(run_all(names, extra, args.parallel, Path(workdir), seeds, save))
    print(f"-> {RESULTS / f'rlcr_ablation_{args.tag}.json'}")


if __name__ == "__main__":
    main()
