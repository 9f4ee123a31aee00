"""Runs under torchrun: one training step with tools in vLLM server mode (loopback server on rank 0), where the two
ranks' rows make different numbers of tool calls. Reports each rank's solver rows and weights.

Usage: tool_ranks.py TRAINER SCENARIO
  TRAINER   grpo (plain trl.GRPOTrainer) | safe_grpo (GRPOTrainer with CollectiveToolRounds) | azr
            (AbsoluteZeroTrainer) | replay (ReplayGRPOTrainer)
  SCENARIO  one_rank: rank 0's rows call tools 1 and 2 times, rank 1's never
            uneven:   rank 0's rows call once each, rank 1's 0 and 1 times (same rounds, different row counts)

Every completion carries its rollout's tag: the first turn calls `step(tag=<task>-<sample>, remaining=<calls>)`, the
tool answers `tag=<tag> remaining=<n - 1>`, and the script continues from the last tool answer in its context, so a
completion generated from another rollout's context shows a foreign tag.
"""

import os
import re
import sys
import tempfile

import torch
from datasets import Dataset
from trl import GRPOTrainer

from trl_ext import use_tool_chat_template
from trl_ext.testing import (
    BatchRecorder,
    LoopbackVLLMServer,
    cpu_test_args,
    tiny_causal_lm,
    tool_call_text,
    vllm_server_mode,
    weights_digest,
    write_rank_result,
)
from trl_ext.trainers import (
    AbsoluteZeroConfig,
    AbsoluteZeroTrainer,
    CollectiveToolRounds,
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
)


class SafeGRPOTrainer(CollectiveToolRounds, GRPOTrainer):
    pass


CALLS = {"one_rank": {"A": "1,2", "B": "0,0"}, "uneven": {"A": "1,1", "B": "0,1"}}


def step(tag: str, remaining: int) -> str:
    """Take one step.

    Args:
        tag: The rollout's tag.
        remaining: Steps left, this one included.
    """
    return f"tag={tag} remaining={remaining - 1}"


def script(text, j):
    seed = re.search(r"Seed (\w)\b", text)
    if seed and "Task" not in text:
        return f"Task {seed.group(1)}{j} calls {SCENARIO[seed.group(1)]}"  # the proposer's K proposals differ
    answers = re.findall(r"tag=(\S+) remaining=(\d+)", text)
    if answers:
        tag, remaining = answers[-1]
        return tool_call_text("step", tag=tag, remaining=int(remaining)) if int(remaining) else f"done {tag}"
    task = re.search(r"Task (\w+) calls (\d),(\d)", text)
    if task is None:  # a padding row of a collective tool round (a one-token prompt)
        return "padding"
    tag, calls = f"{task.group(1)}-{j}", int(task.group(2 + j))
    return tool_call_text("step", tag=tag, remaining=calls) if calls else f"done {tag}"


def num_calls(completions, **kwargs):
    return [float(sum(m.get("role") == "tool" for m in c)) for c in completions]


def row_tags(text):
    found = re.findall(r'"tag": "([\w-]+)"|tag=([\w-]+)|done ([\w-]+)', text)
    return sorted({tag for group in found for tag in group if tag})


def main():
    global SCENARIO
    trainer_kind, scenario = sys.argv[1], sys.argv[2]
    SCENARIO = CALLS[scenario]
    model, tokenizer = tiny_causal_lm(seed=0)
    use_tool_chat_template(tokenizer)
    rank = int(os.environ.get("RANK", "0"))
    server = LoopbackVLLMServer(model, tokenizer, script=script)
    if rank == 0:
        server.start()
    url = server.base_url if rank == 0 else "http://127.0.0.1:9"  # only the main process talks to the server
    common = dict(
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        shuffle_dataset=False,
        max_completion_length=160,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_importance_sampling_mode="token_truncate",
        temperature=1.0,
    )
    system = {"role": "system", "content": "Use the tools."}
    with vllm_server_mode(server):
        if trainer_kind == "azr":
            dataset = Dataset.from_list([{"prompt": [system, {"role": "user", "content": f"Seed {c}"}]} for c in "AB"])
            args = cpu_test_args(
                tempfile.mkdtemp(),
                AbsoluteZeroConfig,
                num_questions_per_prompt=2,
                max_repropose_attempts=0,
                max_question_length=16,
                solver_system_prompt="Use the tools.",
                **common,
            )
            trainer = AbsoluteZeroTrainer(
                model,
                [num_calls],
                args=args,
                train_dataset=dataset,
                processing_class=tokenizer,
                tools=[step],
                parse_question=lambda text: {"question": text.strip()},
            )
        else:
            dataset = Dataset.from_list(
                [{"prompt": [system, {"role": "user", "content": f"Task {c} calls {SCENARIO[c]}"}]} for c in "AB"]
            )
            config = ReplayGRPOConfig if trainer_kind == "replay" else None
            args = cpu_test_args(tempfile.mkdtemp(), *([config] if config else []), **common)
            cls = {"replay": ReplayGRPOTrainer, "safe_grpo": SafeGRPOTrainer, "grpo": GRPOTrainer}[trainer_kind]
            trainer = cls(
                model=model,
                reward_funcs=num_calls,
                args=args,
                train_dataset=dataset,
                processing_class=tokenizer,
                tools=[step],
            )
        with BatchRecorder(trainer) as rec:
            trainer.train()
    if rank == 0:
        server.stop()

    batch = rec.batches[0]
    solver = [i for i in range(batch["completion_ids"].size(0)) if int(batch.get("row_kind", torch.zeros(99))[i]) == 0]
    rows = []
    for i in solver:
        keep = batch["completion_mask"][i].bool()
        text = tokenizer.decode(batch["completion_ids"][i][keep])
        rows.append(
            {
                "text": text,
                "tags": row_tags(text),
                "tool_tokens": int((keep & ~batch["tool_mask"][i].bool()).sum()) if "tool_mask" in batch else 0,
            }
        )
    log = {k: v for k, v in trainer.state.log_history[0].items() if k not in ("step_time",)}
    write_rank_result(
        {
            "rank": rank,
            "rows": rows,
            "digest": weights_digest(trainer.accelerator.unwrap_model(trainer.model)),
            "log": log,
            "requests": [len(r["body"]["prompt"]) for r in server.requests] if rank == 0 else None,
        }
    )


if __name__ == "__main__":
    sys.exit(main())
