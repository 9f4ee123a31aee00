"""AbsoluteZero benchmarks on the embedded default (SmolLM2-135M-Instruct), CPU.

    python benchmarks/absolute_zero_bench.py overhead   # step time vs plain GRPOTrainer on the same generated tokens
    python benchmarks/absolute_zero_bench.py curves     # generation calls/tokens and learnable ratio per step,
                                                        # held-out solver accuracy before and after
    python benchmarks/absolute_zero_bench.py curves --task code   # the same for code reasoning self-play

Results: benchmarks/results/absolute_zero_<part>.json and .png (code: absolute_zero_code_<part>), and for curves the
recipe's held-out plot as absolute_zero[_code]_heldout.png.

overhead: both trainers get scripted completions of one fixed length, so generation cost is identical by
construction and excluded; the ratio measures what self-play adds per step around generation (scoring every
question's responses, the learnability filter, two TRL batch builds) at equal generated tokens. Both trainers are
built once and run one step each in turn (A B A B ...), so load on a shared machine lands on both alike; min, median
and spread of `step_time` after one warm-up step, and the ratios of the medians and of the mins.

curves: the recipe's CPU config of the family (real generation, lenient parsing), for its own number of steps unless
--steps is given; per step the number of generation calls, the generated tokens per role, the learnable ratio and the
repropose attempts; and the solver's greedy accuracy on the family's held-out questions before and after training.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from common import (
    ROOT,
    fixed_length,
    interleaved_step_times,
    load_model,
    machine_load,
    plot_step_times,
    summarize,
)
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser

from trl_ext.recipe import plot_learning_curves, write_json
from trl_ext.recipe.absolute_zero import AbsoluteZeroScriptArguments
from trl_ext.recipe.absolute_zero import main as absolute_zero_main
from trl_ext.self_play import arithmetic_task
from trl_ext.self_play.arithmetic import seed_prompts
from trl_ext.testing import ScriptedGeneration, cpu_test_args
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


RESULTS = Path(__file__).parent / "results"


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
        tempfile.mkdtemp(),
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

    # Plain GRPO generating the same number of tokens: prompts * (K + K * G) completions of the same length.
    rows = prompts * (k + k * g)
    model, tok = load_model()
    args = cpu_test_args(
        tempfile.mkdtemp(),
        GRPOConfig,
        per_device_train_batch_size=rows,
        num_generations=rows // 2,
        reward_weights=[1.0, 0.5],
        **common,
    )
    data = seed_prompts(64, 0).map(lambda row: {"solution": "2"})
    grpo = GRPOTrainer(
        model=model, reward_funcs=task.reward_funcs, args=args, train_dataset=data, processing_class=tok
    )

    load_before = machine_load()
    times = interleaved_step_times(
        {
            "grpo": (grpo, ScriptedGeneration(grpo, lambda p, j: answers["1+1"][j % 2])),
            "absolute_zero": (az, ScriptedGeneration(az, self_play)),
        }
    )
    summary = summarize(times, baseline="grpo")
    ratios = summary["absolute_zero"]["vs_grpo"]
    return {
        "model": "SmolLM2-135M-Instruct (embedded default), float32, CPU",
        "generated_tokens_per_step": generated,
        "absolute_zero_rows_trained_per_step": prompts * g + prompts,
        "grpo_rows_trained_per_step": rows,
        "measured_steps": steps,
        "order": "interleaved: one step of grpo, then one of absolute_zero, ...; warm-up dropped",
        "machine_load_before": load_before,
        "machine_load_after": machine_load(),
        "absolute_zero_generation_calls_per_step": az.state.log_history[0]["generation/calls"],
        "step_times": summary,
        # Self-play trains fewer rows than it generates (one question's responses per prompt, one proposal): per
        # trained row, the cost of the filter and the extra scoring shows.
        "ratio_of_medians_per_trained_row": ratios["ratio_of_medians"] * rows / (prompts * g + prompts),
    }


CPU_CONFIGS = {"arithmetic": "absolute_zero_smollm2_cpu.yaml", "code": "absolute_zero_code_smollm2_cpu.yaml"}
SOLVER_ACCURACY = {"arithmetic": "solver/numeric_match_mean", "code": "solver/code_correct_mean"}


def results_name(task: str, part: str) -> str:
    return f"absolute_zero_{part}" if task == "arithmetic" else f"absolute_zero_{task}_{part}"


def curves(steps: int | None, task: str) -> dict:
    output_dir = Path(tempfile.mkdtemp())
    argv = ["--config", str(ROOT / "recipes" / "configs" / CPU_CONFIGS[task]), "--output_dir", str(output_dir)]
    argv += ["--max_steps", str(steps)] if steps is not None else []
    parser = TrlParser((AbsoluteZeroScriptArguments, AbsoluteZeroConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    training_args.disable_tqdm = True
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
    plot_learning_curves(
        per_step,
        keys[:5],
        RESULTS / f"{results_name(task, 'curves')}.png",
        f"Absolute Zero ({task}) on the CPU default (per step)",
    )
    # The recipe's held-out solver accuracy before and after, with its plot (the learnable ratio beside it).
    shutil.copyfile(output_dir / "heldout_accuracy.png", RESULTS / f"{results_name(task, 'heldout')}.png")
    heldout = json.loads((output_dir / "metrics.json").read_text())["heldout"]
    return {
        "model": f"SmolLM2-135M-Instruct (embedded default), {CPU_CONFIGS[task]}",
        "steps": per_step,
        "heldout": heldout,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("part", choices=["overhead", "curves"])
    parser.add_argument("--steps", type=int, default=None, help="overhead: 4 by default; curves: the config's")
    parser.add_argument("--task", choices=list(CPU_CONFIGS), default="arithmetic", help="curves: the task family")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    if args.part == "overhead":
        result, name = overhead(args.steps or 4), "absolute_zero_overhead"
        panel = f"equal generated tokens ({result['generated_tokens_per_step']} per step)"
        plot_step_times(
            {panel: result["step_times"]},
            "grpo",
            RESULTS / f"{name}.png",
            "Absolute Zero vs GRPOTrainer, interleaved steps",
        )
    else:
        result, name = curves(args.steps, args.task), results_name(args.task, "curves")
    write_json(RESULTS / f"{name}.json", result)
    print({k: v for k, v in result.items() if not isinstance(v, list)})


if __name__ == "__main__":
    sys.exit(main())
