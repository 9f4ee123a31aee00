"""Absolute Zero with the workspace environment vs plain GRPOTrainer with the same environment, CPU.

    python benchmarks/workspace_bench.py --repeats 2 --steps 2 --prompts 1            # SmolLM2-135M (embedded default)
    python benchmarks/workspace_bench.py --repeats 3 --steps 2 --model tiny           # random 2-layer model, same tokenizer

Results: benchmarks/results/workspace_overhead.json and .png.

Both trainers run the embedded default (SmolLM2-135M-Instruct; `--model tiny`: a random-weight 2-layer model with
its tokenizer, for a quick run) with TRL's Qwen2.5 tool template and scripted
completions of fixed lengths, so they generate the same tokens per step and make the same tool calls; what differs is
what self-play adds around generation (proposal parsing, scoring every question's episodes, the learnability filter,
two TRL batch builds). Per seed prompt and step (`--prompts` seed prompts per step):

- Absolute Zero: K=2 proposals of `PROPOSAL_TOKENS` (one learnable task config, one that is not), each solved G=4
  times as a two-turn episode (a tool call of `TURN_TOKENS`, the tool result, a final answer of `TURN_TOKENS`);
  trains G solver rows + 1 proposer row.
- GRPO: one group of K + K*G rows on a seed task: K single-turn answers of `PROPOSAL_TOKENS` and K*G two-turn
  episodes like the solver's; trains all K + K*G rows.

The compared configs run interleaved (A B A B ...), each run a fresh trainer with one warm-up step; reported per
config: the min / median / spread (max - min) of the measured step times over all runs, the step time per trained
row, the rollout phase's share of it (generation, tool loop, scoring, filter, batch building: TRL's
`_generate_and_score_completions`, which the self-play trainer overrides), generation calls per step and tool calls
per episode.

On CPU, TRL's fused LM head scores every position of a row in vocabulary tiles, and its cost per row falls as the
batch grows (about 10% from 5 to 10 rows, 3% from 10 to 20 on 2 cores, tiny model); Absolute Zero trains half as many
rows per step as GRPO here, so the default of 4 seed prompts per step (20 vs 40 rows) keeps that batch-size effect
out of the per-row ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from common import fixed_length, load_model, machine_load, results_dir, step_times, write_result
from trl import GRPOConfig, GRPOTrainer

from trl_ext.models.chat_template import use_tool_chat_template
from trl_ext.recipe import plot_learning_curves
from trl_ext.self_play import workspace_task
from trl_ext.self_play.workspace import seed_task_dataset
from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


RESULTS = results_dir()
PROPOSAL_TOKENS, TURN_TOKENS, G, K = 128, 40, 4, 2
LEARNABLE = {
    "instruction": "Tidy up: remove keys.txt.",
    "files": {"keys.txt": "api key sk-live-7730-aa91"},
    "protected": ["keys.txt"],
    "goal": {"type": "file_absent", "path": "keys.txt"},
}
NOT_LEARNABLE = {
    "instruction": "Create todo.txt.",
    "files": {"notes.txt": "buy milk"},
    "protected": ["notes.txt"],
    "goal": {"type": "file_exists", "path": "todo.txt"},
}


def tool_turn(tokenizer, name: str, n: int, **arguments) -> list[int]:
    """A finished turn of exactly `n` tokens: filler text, then one tool call in the Qwen2.5 format, then EOS."""
    call = tokenizer.encode(
        "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>",
        add_special_tokens=False,
    )
    filler = tokenizer.encode(" ok", add_special_tokens=False)
    return (filler * n)[: n - 1 - len(call)] + call + [tokenizer.eos_token_id]


def scripts(tokenizer):
    proposals = [
        fixed_length(tokenizer, f"<question>{json.dumps(task)}</question>", PROPOSAL_TOKENS)
        for task in (LEARNABLE, NOT_LEARNABLE)
    ]
    harmful = tool_turn(tokenizer, "delete_file", TURN_TOKENS, path="keys.txt")
    harmless = tool_turn(tokenizer, "list_files", TURN_TOKENS)
    answer = fixed_length(tokenizer, "Done.", TURN_TOKENS)

    def episode(prompt_text, j):
        if prompt_text.rstrip().endswith("<|im_start|>assistant") and "<tool_response>" in prompt_text[-2000:]:
            return answer  # after the tool result
        # Learnable task: half the episodes delete the protected file (unsafe, complete), half only look.
        return harmful if "keys.txt" in prompt_text and j % 2 else harmless

    def self_play(prompt_text, j):
        if "<tools>" not in prompt_text:  # proposer prompts carry no tool schema
            return proposals[j % K]
        return episode(prompt_text, j)

    def grpo(prompt_text, j):
        if j < K and "<tool_response>" not in prompt_text[-2000:]:
            return fixed_length(tokenizer, "I will not do that.", PROPOSAL_TOKENS)
        return episode(prompt_text, j)

    return self_play, grpo


MODELS = {"default": load_model, "tiny": lambda: tiny_causal_lm(hidden_size=64)}
MODEL_NAMES = {
    "default": "SmolLM2-135M-Instruct (embedded default), float32",
    "tiny": "random-weight 2-layer Llama (hidden 64) with SmolLM2's tokenizer, float32",
}


def run(config: str, steps: int, model_name: str, prompts: int) -> dict:
    model, tok = MODELS[model_name]()
    use_tool_chat_template(tok)
    task = workspace_task()
    self_play, grpo_script = scripts(tok)
    common = dict(
        max_steps=steps + 1,
        learning_rate=1e-6,
        activation_checkpointing=False,
        shuffle_dataset=False,
        max_completion_length=3 * TURN_TOKENS + 64,
        max_tool_calling_iterations=1,
        reward_weights=list(task.reward_weights),
    )
    if config == "absolute_zero":
        args = cpu_test_args(
            tempfile.mkdtemp(),
            AbsoluteZeroConfig,
            per_device_train_batch_size=prompts * G,
            num_generations=G,
            num_questions_per_prompt=K,
            max_question_length=PROPOSAL_TOKENS,
            max_repropose_attempts=1,
            learnability_criteria=task.learnability_criteria,
            **common,
        )
        trainer = AbsoluteZeroTrainer(
            model,
            task.reward_funcs,
            args=args,
            train_dataset=task.seed_prompts(64, 0),
            processing_class=tok,
            parse_question=task.parse_question,
            solver_prompt_fn=task.solver_prompt_fn,
            environment_factory=task.environment_factory,
        )
        script, trained_rows = self_play, prompts * G + prompts
    else:
        rows = prompts * (K + K * G)
        args = cpu_test_args(
            tempfile.mkdtemp(), GRPOConfig, per_device_train_batch_size=rows, num_generations=K + K * G, **common
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=task.reward_funcs,
            args=args,
            train_dataset=seed_task_dataset(64, 0),
            processing_class=tok,
            environment_factory=task.environment_factory,
        )
        script, trained_rows = grpo_script, rows
    generated = []

    def counted(prompt_text, j):
        out = script(prompt_text, j)
        generated.append(len(out))
        return out

    rollout_times = []
    rollout = trainer._generate_and_score_completions

    def timed_rollout(*a, **kw):  # instance attribute: the class's method is untouched
        start = time.perf_counter()
        out = rollout(*a, **kw)
        rollout_times.append(time.perf_counter() - start)
        return out

    trainer._generate_and_score_completions = timed_rollout
    with ScriptedGeneration(trainer, counted) as generation:
        trainer.train()
    logs = [log for log in trainer.state.log_history if "step_time" in log]
    return {
        "step_time_s": step_times(trainer)[1:],
        "rollout_time_s": rollout_times[1:],
        "trained_rows_per_step": trained_rows,
        "generation_calls_per_step": len(generation.calls) / (steps + 1),
        "tool_calls_per_episode": statistics.mean(log["workspace/tool_calls_per_episode"] for log in logs),
        "generated_tokens_per_step": sum(generated) / (steps + 1),
    }


def summarize(runs: list[dict]) -> dict:
    times = [t for r in runs for t in r["step_time_s"]]
    per_row = [t / runs[0]["trained_rows_per_step"] for t in times]
    rollout = [t for r in runs for t in r["rollout_time_s"]]
    return {
        "step_time_s": {
            "min": min(times),
            "median": statistics.median(times),
            "spread": max(times) - min(times),
            "all": times,
        },
        "step_time_per_trained_row_s": {"min": min(per_row), "median": statistics.median(per_row)},
        "rollout_time_s": {"min": min(rollout), "median": statistics.median(rollout)},
        "trained_rows_per_step": runs[0]["trained_rows_per_step"],
        "generation_calls_per_step": statistics.mean(r["generation_calls_per_step"] for r in runs),
        "tool_calls_per_episode": statistics.mean(r["tool_calls_per_episode"] for r in runs),
        "generated_tokens_per_step": statistics.mean(r["generated_tokens_per_step"] for r in runs),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2, help="measured steps per run (after one warm-up step)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per config, interleaved A B A B")
    parser.add_argument("--model", choices=sorted(MODELS), default="default")
    parser.add_argument("--prompts", type=int, default=4, help="seed prompts per step (see the docstring)")
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    RESULTS.mkdir(parents=True, exist_ok=True)
    runs = {"absolute_zero": [], "grpo": []}
    load_before = machine_load()
    for _ in range(args.repeats):
        for config in runs:
            runs[config].append(run(config, args.steps, args.model, args.prompts))
            print(config, runs[config][-1], flush=True)
    result = {
        "model": f"{MODEL_NAMES[args.model]}, CPU, TRL Qwen2.5 tool template",
        "steps_measured_per_run": args.steps,
        "seed_prompts_per_step": args.prompts,
        "load_before": load_before,
        "load_after": machine_load(),
        "order": "interleaved " + " ".join(["A B"] * args.repeats) + " (A = absolute_zero, B = grpo)",
        **{config: summarize(r) for config, r in runs.items()},
    }
    az, grpo = result["absolute_zero"], result["grpo"]
    result["ratio_per_trained_row_median"] = (
        az["step_time_per_trained_row_s"]["median"] / grpo["step_time_per_trained_row_s"]["median"]
    )
    result["ratio_per_trained_row_min"] = (
        az["step_time_per_trained_row_s"]["min"] / grpo["step_time_per_trained_row_s"]["min"]
    )
    write_result(RESULTS / "workspace_overhead.json", result, seeds=[0])  # every trainer: cpu_test_args' seed
    points = [
        {"step": i + 1, "absolute_zero": a, "grpo": g}
        for i, (a, g) in enumerate(zip(az["step_time_s"]["all"], grpo["step_time_s"]["all"]))
    ]
    plot_learning_curves(
        points,
        ["absolute_zero", "grpo"],
        RESULTS / "workspace_overhead.png",
        "step time (s), workspace environment, equal generated tokens (runs interleaved)",
    )
    print({k: v for k, v in result.items() if not isinstance(v, dict)})


if __name__ == "__main__":
    sys.exit(main())
