"""Absolute Zero with the workspace environment vs plain GRPOTrainer with the same environment, CPU.

    python benchmarks/workspace_bench.py --repeats 2 --steps 2 --prompts 1            # SmolLM2-135M (embedded default)
    python benchmarks/workspace_bench.py --repeats 3 --steps 2 --model tiny           # random 2-layer model, same tokenizer

Results: benchmarks/results/workspace_overhead.json and .png.

Every trainer runs the embedded default (SmolLM2-135M-Instruct; `--model tiny`: a random-weight 2-layer model with
its tokenizer, for a quick run) with TRL's Qwen2.5 tool template and scripted
completions of fixed lengths, so they generate the same tokens per step and make the same tool calls; what differs is
what self-play adds around generation (proposal parsing, scoring every question's episodes, the learnability filter,
two TRL batch builds). Per seed prompt and step (`--prompts` seed prompts per step):

- Absolute Zero: K=2 proposals of `PROPOSAL_TOKENS` (one learnable task config, one that is not), each solved G=4
  times as a two-turn episode (a tool call of `TURN_TOKENS`, the tool result, a final answer of `TURN_TOKENS`);
  trains G solver rows + 1 proposer row.
- GRPO: one group of K + K*G rows on a seed task: K single-turn answers of `PROPOSAL_TOKENS` and K*G two-turn
  episodes like the solver's; trains all K + K*G rows. GRPO runs twice: as TRL ships it (`grpo`; on CPU its fused
  LM head scores every prompt position) and on the trainers' CPU log-prob path (`grpo_cpu_tiles`, which
  AbsoluteZeroTrainer uses): the ratio to the first is what a user sees, to the second what the workspace
  self-play's algorithm costs.

Each of `--repeats` runs builds fresh trainers of the three configurations and runs them one step each in turn
(A B C A B C ...), so load on a shared machine lands on all alike; one warm-up step dropped. Reported: min, median and
spread of the step times with the ratios of medians and of mins to each GRPO (`common.summarize`), per configuration
the step time per trained row, the rollout phase's time (generation, tool loop, scoring, filter, batch building:
TRL's `_generate_and_score_completions`, which the self-play trainer overrides), generation calls per step and tool
calls per episode, and Absolute Zero's ratio per trained row to each GRPO.

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
import time

from common import (
    GRPO_BASELINES,
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

from trl_ext.models.chat_template import use_tool_chat_template
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
CONFIGS = (*GRPO_BASELINES, "absolute_zero")  # the order the trainers take their steps in


class Run:
    """One configuration's trainer with its scripted generation, and what it counts besides `step_time`."""

    def __init__(self, config: str, steps: int, model_name: str, prompts: int):
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
                scratch_dir(),
                AbsoluteZeroConfig,
                per_device_train_batch_size=prompts * G,
                num_generations=G,
                num_questions_per_prompt=K,
                max_question_length=PROPOSAL_TOKENS,
                max_repropose_attempts=1,
                learnability_criteria=task.learnability_criteria,
                **common,
            )
            self.trainer = AbsoluteZeroTrainer(
                model,
                task.reward_funcs,
                args=args,
                train_dataset=task.seed_prompts(64, 0),
                processing_class=tok,
                parse_question=task.parse_question,
                solver_prompt_fn=task.solver_prompt_fn,
                environment_factory=task.environment_factory,
            )
            script, self.trained_rows = self_play, prompts * G + prompts
        else:  # one of the GRPO baselines: as TRL ships it, or on the trainers' CPU log-prob path
            trainer_cls, config_cls = GRPO_BASELINES[config]
            rows = prompts * (K + K * G)
            args = cpu_test_args(
                scratch_dir(), config_cls, per_device_train_batch_size=rows, num_generations=K + K * G, **common
            )
            self.trainer = trainer_cls(
                model=model,
                reward_funcs=task.reward_funcs,
                args=args,
                train_dataset=seed_task_dataset(64, 0),
                processing_class=tok,
                environment_factory=task.environment_factory,
            )
            script, self.trained_rows = grpo_script, rows
        self.steps = steps
        self.generated = []

        def counted(prompt_text, j):
            out = script(prompt_text, j)
            self.generated.append(len(out))
            return out

        self.rollout_times = []
        rollout = self.trainer._generate_and_score_completions

        def timed_rollout(*a, **kw):  # instance attribute: the class's method is untouched
            start = time.perf_counter()
            out = rollout(*a, **kw)
            self.rollout_times.append(time.perf_counter() - start)
            return out

        self.trainer._generate_and_score_completions = timed_rollout
        self.generation = ScriptedGeneration(self.trainer, counted)

    def counts(self) -> dict:
        """After training: the rollout phase's times (warm-up step dropped) and the per-step counts."""
        logs = [log for log in self.trainer.state.log_history if "step_time" in log]
        return {
            "rollout_time_s": self.rollout_times[1:],
            "trained_rows_per_step": self.trained_rows,
            "generation_calls_per_step": len(self.generation.calls) / (self.steps + 1),
            "tool_calls_per_episode": statistics.mean(log["workspace/tool_calls_per_episode"] for log in logs),
            "generated_tokens_per_step": sum(self.generated) / (self.steps + 1),
        }


def measure(repeats: int, steps: int, model_name: str, prompts: int) -> tuple[dict, dict]:
    """Each repeat builds fresh trainers of every configuration and runs them one step each in turn; returns every
    configuration's step times (warm-up steps dropped) and its counts, per repeat."""
    times = {config: [] for config in CONFIGS}
    counts = {config: [] for config in CONFIGS}
    for _ in range(repeats):
        runs = {config: Run(config, steps, model_name, prompts) for config in CONFIGS}
        for config, step_times in interleaved_step_times(
            {config: (run.trainer, run.generation) for config, run in runs.items()}
        ).items():
            times[config] += step_times
            counts[config].append(runs[config].counts())
            print(config, step_times, counts[config][-1], flush=True)
    return times, counts


def compare(times: dict[str, list[float]], counts: dict[str, list[dict]]) -> dict:
    """The step times against each GRPO baseline (`summarize`), per configuration its step time per trained row and
    its counts, and the ratios per trained row to each baseline: the configurations train different numbers of rows
    from the same generated tokens."""
    summary = summarize(times)
    per_config = {}
    for config, runs in counts.items():
        rows = runs[0]["trained_rows_per_step"]
        rollout = [t for run in runs for t in run["rollout_time_s"]]
        per_config[config] = {
            "trained_rows_per_step": rows,
            "step_time_per_trained_row_s": {
                "min": summary[config]["min_s"] / rows,
                "median": summary[config]["median_s"] / rows,
            },
            "rollout_time_s": {"min": min(rollout), "median": statistics.median(rollout)},
            **{
                key: statistics.mean(run[key] for run in runs)
                for key in ("generation_calls_per_step", "tool_calls_per_episode", "generated_tokens_per_step")
            },
        }
    az = per_config["absolute_zero"]["step_time_per_trained_row_s"]
    return {
        "step_times": summary,
        "configs": per_config,
        "ratio_per_trained_row": {
            baseline: {
                "median": az["median"] / per_config[baseline]["step_time_per_trained_row_s"]["median"],
                "min": az["min"] / per_config[baseline]["step_time_per_trained_row_s"]["min"],
            }
            for baseline in GRPO_BASELINES
        },
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2, help="measured steps per run (after one warm-up step)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per config, fresh trainers each")
    parser.add_argument("--model", choices=sorted(MODELS), default="default")
    parser.add_argument("--prompts", type=int, default=4, help="seed prompts per step (see the docstring)")
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    RESULTS.mkdir(parents=True, exist_ok=True)
    load_before = machine_load()
    times, counts = measure(args.repeats, args.steps, args.model, args.prompts)
    result = {
        "model": f"{MODEL_NAMES[args.model]}, CPU, TRL Qwen2.5 tool template",
        "steps_measured_per_run": args.steps,
        "repeats": args.repeats,
        "seed_prompts_per_step": args.prompts,
        "load_before": load_before,
        "load_after": machine_load(),
        "order": f"{args.repeats} x fresh trainers running one step each in turn ({', '.join(CONFIGS)}); "
        "warm-up step dropped",
        **compare(times, counts),
    }
    write_result(RESULTS / "workspace_overhead.json", result, seeds=[0])  # every trainer: cpu_test_args' seed
    az, grpo = result["configs"]["absolute_zero"], result["configs"]["grpo"]
    per_row = ", ".join(f"{ratio['median']:.2f}x vs {name}" for name, ratio in result["ratio_per_trained_row"].items())
    panel = (
        f"workspace environment, {az['generated_tokens_per_step']:.0f} generated tokens per step each\n"
        f"rows trained per step: Absolute Zero {az['trained_rows_per_step']}, GRPO {grpo['trained_rows_per_step']}\n"
        f"Absolute Zero per trained row (medians): {per_row}"
    )
    plot_step_times(
        {panel: result["step_times"]},
        RESULTS / "workspace_overhead.png",
        "Absolute Zero vs GRPOTrainer (as TRL ships it; on the CPU log-prob path), interleaved steps",
    )
    print({k: v for k, v in result.items() if k not in ("step_times", "configs")})


if __name__ == "__main__":
    sys.exit(main())
