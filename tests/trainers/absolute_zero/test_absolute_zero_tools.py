"""AbsoluteZeroTrainer with an environment for the solver: scripted generation writes tool calls in the template's
format, so TRL's own tool loop runs the episodes.

The test environment is a counter: a proposal names a target ("one" -> 1, "two" -> 2, "zero" -> 0); solver sample 0
answers at once (0 tool calls), sample 1 calls `increment(amount=1)` until the counter reaches the target (1 or 2
calls). `get_reward` (column "Counter") is 1 when the counter equals the target; the reward function `value` reads the
live environments and returns the counter.
"""

import re

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig

from trl_ext import use_tool_chat_template
from trl_ext.testing import (
    BatchRecorder,
    ScriptedGeneration,
    changed_parameters,
    cpu_test_args,
    logged_counter,
    snapshot_parameters,
    tiny_causal_lm,
    tool_call_text,
)
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


TARGETS = {"zero": 0, "one": 1, "two": 2}


def value(prompts, completions, completion_ids, environments, **kwargs):
    """A reward function that needs the live environment: the counter the episode reached."""
    environments[0].log["value_calls"].append([e.count for e in environments])
    return [float(e.count) for e in environments]


def parse(text):
    word = text.strip()
    return {"target": TARGETS[word], "word": word} if word in TARGETS else None


class Script:
    """Proposals per seed (`Seed A`, `Seed B`), a list per round (the last repeats); solver as described above."""

    def __init__(self, plan):
        self.plan, self.rounds = plan, dict.fromkeys(plan, 0)

    def __call__(self, text, k):
        seed = re.search(r"Seed (\w)", text)
        if seed:
            name = seed.group(1)
            proposals = self.plan[name][min(self.rounds[name], len(self.plan[name]) - 1)]
            self.rounds[name] += k == len(proposals) - 1
            return proposals[k]
        target = int(re.search(r"Reach (\d)", text).group(1))
        calls = text.count("<tool_response>")
        if "<tool_response>" not in text and k == 0:
            return "done"
        return tool_call_text("increment", amount=1) if calls < target else "done"


def make(tmp_path, env=None, reward_funcs=(value,), seeds="AB", peft_config=None, **overrides):
    model, tokenizer = tiny_causal_lm()
    use_tool_chat_template(tokenizer)
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": "system", "content": "Propose."}, {"role": "user", "content": f"Seed {c}"}],
                "seed_note": c,
            }
            for c in seeds
        ]
    )
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        **{
            **dict(
                max_steps=1,
                per_device_train_batch_size=2 * len(seeds),
                num_generations=2,
                num_questions_per_prompt=2,
                shuffle_dataset=False,
                max_completion_length=160,
                max_question_length=8,
                max_repropose_attempts=1,
                solver_prompt_template="Reach {target}",
                solver_system_prompt="Use the tools.",
            ),
            **overrides,
        },
    )
    env = env or logged_counter()
    trainer = AbsoluteZeroTrainer(
        model,
        list(reward_funcs),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        parse_question=parse,
        environment_factory=env,
        peft_config=peft_config,
    )
    return trainer, env


def run(trainer, plan):
    with ScriptedGeneration(trainer, Script(plan)) as gen, BatchRecorder(trainer) as rec:
        trainer.train()
    return gen, rec.batches[0]


def row_text(trainer, batch, row, mask=None):
    keep = batch["completion_mask"][row].bool()
    if mask is not None:
        keep &= batch[mask][row].bool()
    return trainer.processing_class.decode(batch["completion_ids"][row][keep])


def test_episodes_with_0_1_2_tool_calls(tmp_path):
    trainer, env = make(tmp_path)
    gen, batch = run(trainer, {"A": [["one", "zero"]], "B": [["two", "zero"]]})

    assert trainer.reward_func_names == ["value", "Counter"]  # the environment's get_reward column is added
    # Proposer prompts carry no tool schema; solver prompts do.
    proposer_calls = [c for c in gen.calls if "Seed" in trainer.processing_class.decode(c.prompt_ids[0])]
    solver_first = [
        c
        for c in gen.calls
        if "Reach" in trainer.processing_class.decode(c.prompt_ids[0])
        and "<tool_response>" not in trainer.processing_class.decode(c.prompt_ids[0])
    ]
    assert len(proposer_calls) == 1 and len(solver_first) == 1
    for ids in proposer_calls[0].prompt_ids:
        assert "<tools>" not in trainer.processing_class.decode(ids)
    for ids in solver_first[0].prompt_ids:
        assert '"name": "increment"' in trainer.processing_class.decode(ids)
    # The tool loop: one row per episode still calling tools, one generation per iteration.
    loop = [(c.num_generations, len(c.prompt_ids)) for c in gen.calls[2:]]
    assert loop == [(1, 2), (1, 1)]  # the "one" and "two" episodes of sample 1 call once; "two" once more

    # reset(**row) got the solver input row: the seed's columns, the parsed question's fields and the solver prompt.
    resets = env.log["resets"]
    assert len(resets) == 8  # one per solver rollout of the round; the final batch replays and resets nothing
    assert resets[0] == {
        "seed_note": "A",
        "target": 1,
        "word": "one",
        "prompt": [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Reach 1"}],
    }
    assert [r["target"] for r in resets] == [1, 1, 0, 0, 2, 2, 0, 0]

    # Joint batch: 4 solver rows (A's selected question, B's), then 2 proposer rows.
    assert batch["row_kind"].tolist() == [0, 0, 0, 0, 1, 1]
    calls = [row_text(trainer, batch, r).count("<tool_call>") for r in range(4)]
    assert calls == [0, 1, 0, 2]
    # tool_mask is 0 exactly on the tool-output tokens (TRL's suffix: the tool turn and the next assistant header).
    for row in range(4):
        model_text = row_text(trainer, batch, row, "tool_mask")
        assert "counter=" not in model_text and model_text.count("<tool_call>") == calls[row]
        tool_tokens = batch["completion_mask"][row].bool() & ~batch["tool_mask"][row].bool()
        tool_text = trainer.processing_class.decode(batch["completion_ids"][row][tool_tokens])
        assert tool_text.count("<tool_response>") == calls[row]
        assert [int(x) for x in re.findall(r"counter=(\d)", tool_text)] == list(range(1, calls[row] + 1))
    assert batch["tool_mask"][4:][batch["completion_mask"][4:].bool()].all()  # proposer rows: no tools
    # The loss counts model tokens only.
    assert batch["num_items_in_batch"] == (batch["completion_mask"] * batch["tool_mask"]).sum()

    # Environment scores, read while the episodes were live, are what the final batch trained on.
    assert list(trainer._logs["rewards"]["value"]) == [0.0, 1.0, 0.0, 2.0]
    assert list(trainer._logs["rewards"]["Counter"]) == [0.0, 1.0, 0.0, 1.0]
    assert env.log["value_calls"] == [[0, 1, 0, 0, 0, 2, 0, 0]]  # once, in the round


def test_environment_scores_replayed_after_a_repropose_round(tmp_path):
    # A resolves in round 1; B's "zero" questions are solved by both samples (not learnable), so B is reproposed.
    # Round 2 resets the pooled instances that ran A's episodes: A's scores must come from round 1's record.
    trainer, env = make(tmp_path)
    gen, batch = run(trainer, {"A": [["one", "zero"]], "B": [["zero", "zero"], ["two", "zero"]]})
    log = trainer.state.log_history[0]
    assert log["unified_filter/num_repropose"] == 1 and log["repropose/rounds"] == 1
    assert [r["target"] for r in env.log["resets"]] == [1, 1, 0, 0, 0, 0, 0, 0, 2, 2, 0, 0]
    assert env.log["value_calls"] == [[0, 1, 0, 0, 0, 0, 0, 0], [0, 2, 0, 0]]  # per round, each row once
    assert list(trainer._logs["rewards"]["value"]) == [0.0, 1.0, 0.0, 2.0]
    assert list(trainer._logs["rewards"]["Counter"]) == [0.0, 1.0, 0.0, 1.0]
    assert [row_text(trainer, batch, r).count("<tool_call>") for r in range(4)] == [0, 1, 0, 2]


def test_learnability_on_two_environment_scores(tmp_path):
    # Counter above 0.5 in [0.3, 0.7]: "one" and "two" (values [0, 1]), not "zero" ([1, 1]). Value below 1.5 in
    # [0.3, 0.7]: "two" ([0, 2]), not "one" ([0, 1]: ratio 1). Only "two" meets both.
    criteria = [
        {"reward": "Counter", "threshold": 0.5, "count": "above", "min_ratio": 0.3, "max_ratio": 0.7},
        {"reward": "value", "threshold": 1.5, "count": "below", "min_ratio": 0.3, "max_ratio": 0.7},
    ]
    trainer, env = make(tmp_path, learnability_criteria=criteria, max_repropose_attempts=0)
    _, batch = run(trainer, {"A": [["one", "two"]], "B": [["two", "zero"]]})
    log = trainer.state.log_history[0]
    assert log["unified_filter/num_learnable"] == 2 and log["unified_filter/num_total"] == 4
    assert log["unified_filter/num_sampled"] == 2
    assert [r["target"] for r in env.log["resets"]] == [1, 1, 2, 2, 2, 2, 0, 0]
    # Each prompt keeps its "two" question (the only learnable one): rows reach 0 and 2.
    assert list(trainer._logs["rewards"]["value"]) == [0.0, 2.0, 0.0, 2.0]


def test_criteria_may_name_only_known_columns(tmp_path):
    criteria = [{"reward": "safety", "threshold": 0.5, "count": "above", "min_ratio": 0.3, "max_ratio": 0.7}]
    with pytest.raises(ValueError, match=r"\['safety'\].*\['value', 'Counter'\]"):
        make(tmp_path, learnability_criteria=criteria)


def test_environment_reward_alone_and_rollout_func_refused(tmp_path):
    trainer, _ = make(tmp_path, reward_funcs=())  # get_reward is the only reward source
    assert trainer.reward_func_names == ["Counter"]
    _, batch = run(trainer, {"A": [["one", "zero"]], "B": [["two", "zero"]]})
    assert list(trainer._logs["rewards"]["Counter"]) == [0.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="rollout_func.*environment_factory"):
        AbsoluteZeroTrainer(
            trainer.model,
            [value],
            args=trainer.args,
            train_dataset=trainer.train_dataset,
            processing_class=trainer.processing_class,
            rollout_func=lambda p, t: {},
        )


def test_lora_and_resume_with_an_environment(tmp_path):
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    plan = {"A": [["one", "zero"]], "B": [["two", "zero"]]}
    trainer, _ = make(
        tmp_path, max_steps=2, save_strategy="steps", save_steps=1, learning_rate=5e-2, peft_config=peft_config
    )
    before = snapshot_parameters(trainer.model)
    with ScriptedGeneration(trainer, Script(plan)):
        trainer.train()
    changed = changed_parameters(before, trainer.model)
    assert changed and all("lora_" in n for n in changed)

    trainer.args.max_steps = 3
    with ScriptedGeneration(trainer, Script(plan)), BatchRecorder(trainer) as rec:
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert trainer.state.global_step == 3 and len(rec.batches) == 1
    assert [row_text(trainer, rec.batches[0], r).count("<tool_call>") for r in range(4)] == [0, 1, 0, 2]
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-2]["loss"]))


def test_malformed_tool_calls_are_model_output_not_errors(tmp_path):
    # Sample 1 of "two" writes a tool call that is not JSON (TRL decodes it as text: no tool call), sample 1 of "one"
    # calls the tool with a bad argument (the tool raises; TRL returns the error to the model as the tool's output).
    class Hostile(Script):
        def __call__(self, text, k):
            if "Reach 2" in text and "Seed" not in text and k == 1:
                return '<tool_call>\n{"name": "increment", "arguments": {oops\n</tool_call>'
            if "Reach 1" in text and "Seed" not in text and "<tool_response>" not in text and k == 1:
                return tool_call_text("increment", amount="many")
            return super().__call__(text, k)

    trainer, env = make(tmp_path, max_repropose_attempts=0)
    with (
        ScriptedGeneration(trainer, Hostile({"A": [["one", "zero"]], "B": [["two", "zero"]]})),
        BatchRecorder(trainer) as rec,
    ):
        trainer.train()
    batch, log = rec.batches[0], trainer.state.log_history[0]
    texts = [row_text(trainer, batch, r) for r in range(4)]
    assert "oops" in texts[3] and "<tool_response>" not in texts[3]  # B's sample 1: text, no tool round
    assert "<tool_response>" in texts[1] and "error" in texts[1]  # A's sample 1: the tool's error, shown to the model
    assert log["tools/failure_frequency"] == 1.0  # the one executed call failed
    assert list(trainer._logs["rewards"]["value"]) == [0.0, 0.0, 0.0, 0.0]


def test_unknown_tool_names_with_lone_surrogates_are_made_safe(tmp_path):
    # Fails on main (issue 21, item 9): an unknown tool's name decoded from the escape "\\udcff" is a lone surrogate,
    # which TRL put into the tool message; tokenizing it raised TypeError.
    class Hostile(Script):
        def __call__(self, text, k):
            if "Reach" in text and "Seed" not in text and "<tool_response>" not in text and k == 1:
                return tool_call_text("\udcff")
            return super().__call__(text, k)

    trainer, _ = make(tmp_path, max_repropose_attempts=0)
    with (
        ScriptedGeneration(trainer, Hostile({"A": [["one", "zero"]], "B": [["two", "zero"]]})),
        BatchRecorder(trainer) as rec,
    ):
        trainer.train()
    texts = [row_text(trainer, rec.batches[0], r) for r in range(4)]
    assert all("not found" in texts[r] for r in (1, 3))  # sample 1 of each prompt: TRL's error, shown to the model
    assert trainer.state.log_history[0]["tools/unsafe_results"] == 4.0  # one per question of the solving round
