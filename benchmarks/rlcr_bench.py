"""RLCR benchmarks on the embedded default (SmolLM2-135M-Instruct), CPU.

    python benchmarks/rlcr_bench.py overhead      # step time vs plain GRPOTrainer on the same generated tokens
    python benchmarks/rlcr_bench.py calibration   # ECE/Brier per step: multi-turn RLCR vs single-turn RLCR

Results: benchmarks/results/rlcr_<part>.json and .png.

overhead: both trainers get scripted completions of fixed lengths (generation cost is identical by construction and
excluded), so the ratio measures what RLCR adds per step: the second scoring pass, turn-2 prompts (longer: they
contain the answer), span masks, metrics. RLCR runs twice: with the packed loss forward (`share_prefix=True`, the
default) and with rows scored one by one. The three trainers are built once and run one step each in turn (A B C A B
C ...), so load on a shared machine lands on all of them alike; per trainer the min, median and spread of
`step_time` after one warm-up step, and the ratios to GRPO of the medians and of the mins.

calibration: multi-turn RLCR (G_a answers, then G_c confidences per answer) against single-turn RLCR (answer and
confidence in one completion, reward accuracy + Brier, plain GRPOTrainer), same prompts, seed and learning rate.
Curves are plotted against cumulative generated tokens, so the comparison is at equal sampled tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
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
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from trl_ext import default_model_path
from trl_ext.calibration import brier_score, expected_calibration_error
from trl_ext.data import graded_arithmetic
from trl_ext.data.arithmetic import ANSWER_FORMAT
from trl_ext.recipe import write_json
from trl_ext.rewards import extract_confidence, make_accuracy_reward
from trl_ext.rewards.parsing import completion_text
from trl_ext.testing import ScriptedGeneration, cpu_test_args
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


RESULTS = Path(__file__).parent / "results"
CONFIDENCE_PROMPT = (
    "How likely is it that your answer above is correct? Reply with a probability between 0 and 1 inside "
    "<confidence></confidence>, for example <confidence>0.7</confidence>."
)
SINGLE_TURN_FORMAT = ANSWER_FORMAT + " Then say how likely your answer is correct, as <confidence>0.7</confidence>."


# -- overhead -----------------------------------------------------------------------------------------------------
def overhead(steps: int) -> dict:
    answer_len, confidence_len, g_a, g_c = 32, 16, 4, 2
    tok = AutoTokenizer.from_pretrained(default_model_path())  # each trainer below loads its own model
    answer = fixed_length(tok, "<think>adding</think><answer>7</answer>", answer_len)
    confidence = fixed_length(tok, "<confidence>0.7</confidence>", confidence_len)
    data = graded_arithmetic(64, seed=0)
    common = dict(max_steps=steps + 1, learning_rate=1e-6, activation_checkpointing=False, shuffle_dataset=False,
                  max_completion_length=answer_len)
    runs = {}

    # Plain GRPO on the same generated tokens: one prompt's 4 rows of answer length, two prompts' 8 rows of
    # confidence length (12 rows, 4*32 + 8*16 tokens), with accuracy as the reward.
    model, tok = load_model()
    args = cpu_test_args(tempfile.mkdtemp(), GRPOConfig, per_device_train_batch_size=g_a * (1 + g_c),
                         num_generations=g_a, **common)
    grpo = GRPOTrainer(model=model, reward_funcs=make_accuracy_reward(), args=args, train_dataset=data,
                       processing_class=tok)
    calls = []

    def grpo_script(prompt_text, k):
        calls.append(prompt_text)
        return answer if (len(calls) - 1) % 12 < g_a else confidence

    runs["grpo"] = (grpo, ScriptedGeneration(grpo, grpo_script))

    # RLCR with the packed loss forward (default) and with rows scored one by one.
    for name, share_prefix in (("rlcr", True), ("rlcr_unpacked", False)):
        model, tok = load_model()
        args = cpu_test_args(tempfile.mkdtemp(), RLCRMultiTurnConfig, per_device_train_batch_size=g_a,
                             num_generations=g_a, num_generations_confidence=g_c, max_confidence_length=confidence_len,
                             confidence_prompt=CONFIDENCE_PROMPT, share_prefix=share_prefix, **common)
        rlcr = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
        runs[name] = (rlcr, ScriptedGeneration(rlcr, lambda p, k: confidence if CONFIDENCE_PROMPT in p else answer))

    load_before = machine_load()
    times = interleaved_step_times(runs)
    return {
        "model": "SmolLM2-135M-Instruct (embedded default), float32, CPU",
        "rows_per_step": g_a * (1 + g_c),
        "generated_tokens_per_step": g_a * answer_len + g_a * g_c * confidence_len,
        "measured_steps": steps,
        "order": "interleaved: one step of each configuration in turn (grpo, rlcr, rlcr_unpacked), warm-up dropped",
        "machine_load_before": load_before,
        "machine_load_after": machine_load(),
        "step_times": summarize(times, baseline="grpo"),
    }


# -- calibration curves ---------------------------------------------------------------------------------------------
def single_turn_rlcr_reward():
    """Single-turn RLCR (Damani et al.): accuracy + Brier on the same completion; logs batch ECE/Brier."""
    accuracy = make_accuracy_reward(lenient=True)

    def rlcr_single_turn(prompts, completions, completion_ids=None, log_metric=None, **kwargs):
        acc = accuracy(prompts, completions, completion_ids, **kwargs)
        confs = [extract_confidence(completion_text(c), "confidence", lenient=False) for c in completions]
        rewards = [a + (1 - (a - c) ** 2 if c is not None else 0.0) for a, c in zip(acc, confs)]
        pairs = [(c, a) for c, a in zip(confs, acc) if c is not None]
        if log_metric is not None:
            log_metric("confidence/parse_fail_rate", 1 - len(pairs) / len(confs))
            if pairs:
                log_metric("calibration/ece", expected_calibration_error(*zip(*pairs)))
                log_metric("calibration/brier", brier_score(*zip(*pairs)))
        return rewards

    return rlcr_single_turn


def calibration(steps: int) -> dict:
    g_a, g_c, answer_len, confidence_len = 4, 2, 32, 16
    common = dict(max_steps=steps, learning_rate=2e-6, lr_scheduler_type="constant", activation_checkpointing=False,
                  per_device_train_batch_size=g_a, num_generations=g_a, seed=0)
    runs = {}

    model, tok = load_model()
    args = cpu_test_args(tempfile.mkdtemp(), RLCRMultiTurnConfig, num_generations_confidence=g_c,
                         max_completion_length=answer_len, max_confidence_length=confidence_len,
                         confidence_prompt=CONFIDENCE_PROMPT, lenient_parsing=True, **common)
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=graded_arithmetic(500, seed=0),
                                   processing_class=tok)
    trainer.train()
    runs["multi_turn"] = trainer.state.log_history

    # Single turn at equal sampled tokens per step: G_a completions of answer + confidence length, plus the tokens
    # multi-turn spends on its extra G_a * (G_c - 1) confidence samples.
    model, tok = load_model()
    single_len = answer_len + g_c * confidence_len
    args = cpu_test_args(tempfile.mkdtemp(), GRPOConfig, max_completion_length=single_len, **common)
    trainer = GRPOTrainer(model=model, reward_funcs=single_turn_rlcr_reward(), args=args,
                          train_dataset=graded_arithmetic(500, seed=0, system_prompt=SINGLE_TURN_FORMAT),
                          processing_class=tok)
    trainer.train()
    runs["single_turn"] = trainer.state.log_history

    curves = {}
    for name, logs in runs.items():
        logs = [log for log in logs if "step_time" in log]
        lengths = [("completions/mean_length", g_a)]
        if name == "multi_turn":
            lengths.append(("confidence/completions/mean_length", g_a * g_c))
        tokens, total = [], 0.0
        for log in logs:
            total += sum(log.get(key, 0.0) * rows for key, rows in lengths)
            tokens.append(total)
        curves[name] = {
            "generated_tokens": tokens,
            **{key: [log.get(key) for log in logs] for key in
               ("calibration/ece", "calibration/brier", "confidence/parse_fail_rate", "step_time")},
        }
    return {"model": "SmolLM2-135M-Instruct (embedded default), float32, CPU", "steps": steps, "curves": curves}


def plot_calibration(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = ["calibration/ece", "calibration/brier", "confidence/parse_fail_rate"]
    fig = Figure(figsize=(13, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, key in zip(fig.subplots(1, len(keys)), keys):
        for name, curve in result["curves"].items():
            points = [(t, v) for t, v in zip(curve["generated_tokens"], curve[key]) if v is not None]
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, label=name.replace("_", "-"))
        ax.set_title(key)
        ax.set_xlabel("cumulative generated tokens")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("RLCR on SmolLM2-135M (CPU): multi-turn vs single-turn, at equal sampled tokens")
    fig.savefig(path, dpi=110)


def plot_overhead(result: dict, path: Path) -> None:
    load = [result[k]["load_average_1_5_15_min"][0] for k in ("machine_load_before", "machine_load_after")]
    plot_step_times({f"same generated tokens (1-min load {load[0]:.1f} -> {load[1]:.1f})": result["step_times"]},
                    "grpo", path, "RLCR vs GRPOTrainer, interleaved steps")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["overhead", "calibration"])
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per trainer (overhead: 4, calibration: 12; the README quotes 4 and 36)")
    args = parser.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    if args.part == "overhead":
        result = overhead(args.steps or 4)
        plot_overhead(result, RESULTS / "rlcr_overhead.png")
    else:
        result = calibration(args.steps or 12)
        plot_calibration(result, RESULTS / "rlcr_calibration.png")
    write_json(RESULTS / f"rlcr_{args.part}.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "curves"}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
