"""ReplayGRPOTrainer with an environment: tool episodes stored whole and replayed with their tool_mask.

Tasks A-D, two groups of n = 2 per step (A, B at step 0; C, D at step 1). Only A's sample 0 at step 0 succeeds: it
calls `increment(amount=target)` and answers "done"; every other row answers "done" at once. Step 0 stores A's
episode; step 1 replays it in one of its two groups (1 fresh row, which fails, + 1 stored). `Counter` (the environment's `get_reward`) needs
the live environment; `step_number` is a pure reward function (the current global step).
"""

import re

import pytest
import torch
from datasets import Dataset

from trl_ext import use_tool_chat_template
from trl_ext.testing import BatchRecorder, Counter, ScriptedGeneration, cpu_test_args, tiny_causal_lm, tool_call_text
from trl_ext.trainers import ReplayGRPOConfig, ReplayGRPOTrainer


def step_number(completions, trainer_state, **kwargs):
    return [float(trainer_state.global_step)] * len(completions)


def make_script(trainer):
    def script(text, k):
        if "<tool_response>" in text:
            return "done"
        task, target = re.search(r"Task (\w): reach (\d)", text).groups()
        succeed = task == "A" and k == 0 and trainer.state.global_step == 0
        return tool_call_text("increment", amount=int(target)) if succeed else "done"

    return script


def make(tmp_path, environment_factory=Counter, **overrides):
    model, tokenizer = tiny_causal_lm(initializer_range=0.5)
    use_tool_chat_template(tokenizer)
    dataset = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": "Use the tools."},
                    {"role": "user", "content": f"Task {t}: reach 2"},
                ],
                "target": 2,
                "task_id": t,
            }
            for t in "ABCD"
        ]
    )
    args = cpu_test_args(
        tmp_path,
        ReplayGRPOConfig,
        **{
            **dict(
                max_steps=2,
                replay_start_ratio=0.0,
                shuffle_dataset=False,
                num_generations=2,
                per_device_train_batch_size=4,
                max_completion_length=160,
                success_reward="Counter",
                task_id_column="task_id",
            ),
            **overrides,
        },
    )
    return ReplayGRPOTrainer(
        model,
        [step_number],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=environment_factory,
    )


def run(trainer, **train_kwargs):
    with ScriptedGeneration(trainer, make_script(trainer)), BatchRecorder(trainer) as rec:
        trainer.train(**train_kwargs)
    return rec.batches


def tokens(batch, row, mask=None):
    keep = batch["completion_mask"][row].bool() if mask is None else mask[row].bool()
    return batch["completion_ids"][row][keep].tolist()


def test_tool_episode_stored_and_replayed_with_its_tool_mask(tmp_path):
    trainer = make(tmp_path)
    step0, step1 = run(trainer)
    stored = trainer.experience.task2trajectories["A"][0]

    # Step 0, row 0: A's successful episode, kept whole (tool-output tokens included) with TRL's tool mask.
    n = int(step0["completion_mask"][0].sum())
    assert stored.completion_ids.tolist() == tokens(step0, 0) and stored.num_tokens == n
    assert stored.tool_mask.tolist() == step0["tool_mask"][0, :n].bool().tolist()
    assert 0 < int(stored.tool_mask.sum()) < n  # model tokens and tool tokens
    tool_text = trainer.processing_class.decode(stored.completion_ids[~stored.tool_mask])
    assert "counter=2" in tool_text and "<tool_call>" not in tool_text
    assert [m["role"] for m in stored.completion] == ["assistant", "tool", "assistant"]
    assert stored.completion[1]["content"] == "counter=2" and stored.completion[2]["content"] == "done"
    assert stored.env_rewards == {"Counter": 1.0}
    # Buffer bytes, the figures the README quotes: ids (int32) + log-probs (float32) + tool mask (bool) per token, plus
    # the messages and recorded rewards as JSON.
    assert (stored.completion_ids.dtype, stored.logps.dtype, stored.tool_mask.dtype) == (
        torch.int32,
        torch.float32,
        torch.bool,
    )
    assert n == 56 and stored.nbytes - 9 * n == 260 and f"{stored.nbytes / n:.1f}" == "13.6"
    assert trainer.experience.nbytes >= stored.nbytes

    # Step 1: the replay group is A's (1 fresh row, then the stored episode); the other group is fresh.
    replay_rows = [i for i in range(4) if step1["exp_mask"][i].any()]
    assert len(replay_rows) == 1
    row = replay_rows[0]
    assert tokens(step1, row) == stored.completion_ids.tolist()
    assert step1["tool_mask"][row, :n].bool().tolist() == stored.tool_mask.tolist()
    assert step1["exp_mask"][row, :n].bool().all()
    # Its recorded log-probs are the off-policy reference on every token; only model tokens are trained.
    torch.testing.assert_close(step1["old_per_token_logps"][row, :n], stored.logps)
    # Rewards: the environment column keeps the recorded 1.0 (the instance TRL drew for this row was only reset),
    # the pure reward re-scores at the current step.
    counter, step_col = trainer.reward_func_names.index("Counter"), trainer.reward_func_names.index("step_number")
    rewards = trainer._batch.rewards_per_func
    assert rewards[row, counter].item() == 1.0 and rewards[row, step_col].item() == 1.0
    fresh_a = row - 1  # the group's fresh row, scored live: it called no tool
    assert rewards[fresh_a, counter].item() == 0.0 and step1["exp_mask"][fresh_a].sum() == 0
    assert step1["tool_mask"][fresh_a][step1["completion_mask"][fresh_a].bool()].all()


def test_off_policy_ratio_only_on_model_tokens(tmp_path):
    trainer = make(tmp_path)
    _, step1 = run(trainer)
    row = next(i for i in range(4) if step1["exp_mask"][i].any())
    tool_tokens = step1["completion_mask"][row].bool() & ~step1["tool_mask"][row].bool()
    assert tool_tokens.any()

    def loss_and_ratio(batch):
        trainer._metrics["train"].clear()
        loss = trainer._compute_loss(
            trainer.model, {k: v.to(trainer.accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        )
        m = trainer._metrics["train"]
        return (
            loss.item(),
            m["replay/importance_ratio_mean"][-1],
            m["replay/importance_ratio_max"][-1],
            m["replay/offpolicy_token_ratio"][-1],
        )

    base = loss_and_ratio(step1)
    garbled = dict(step1)
    garbled["old_per_token_logps"] = step1["old_per_token_logps"].clone()
    garbled["old_per_token_logps"][row][tool_tokens] = -50.0  # would explode a ratio that included tool tokens
    assert loss_and_ratio(garbled) == pytest.approx(base, rel=1e-6)
    model_tokens = step1["completion_mask"][row].bool() & step1["tool_mask"][row].bool()
    garbled["old_per_token_logps"][row][model_tokens] -= 1.0  # the model tokens do enter it
    assert loss_and_ratio(garbled)[1] > base[1] * 2


def test_resume_with_tool_episodes_in_the_buffer(tmp_path):
    trainer = make(tmp_path, save_strategy="steps", save_steps=1)
    run(trainer)
    saved = trainer.experience.task2trajectories["A"][0]

    resumed = make(tmp_path, save_strategy="no", max_steps=2)
    (step1,) = run(resumed, resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    loaded = resumed.experience.task2trajectories["A"][0]
    assert loaded.completion_ids.tolist() == saved.completion_ids.tolist()
    assert loaded.tool_mask.tolist() == saved.tool_mask.tolist()
    assert loaded.completion == saved.completion and loaded.env_rewards == saved.env_rewards
    row = next(i for i in range(4) if step1["exp_mask"][i].any())
    n = saved.num_tokens
    assert step1["tool_mask"][row, :n].bool().tolist() == saved.tool_mask.tolist()
    assert resumed._batch.rewards_per_func[row, resumed.reward_func_names.index("Counter")].item() == 1.0


class Echo(Counter):
    def echo(self, text: str) -> str:
        """Repeat a text.

        Args:
            text: The text to repeat.
        """
        return f"echo: {text}"


def test_tool_results_with_lone_surrogates_are_made_safe_to_tokenize(tmp_path):
    # Fails on main (issue 21, item 9): a JSON escape "\\udcff" in a tool call decodes to a lone surrogate, which TRL
    # copied into the tool message (an echoing tool's result, an unknown tool's name); tokenizing it raised TypeError.
    trainer = make(tmp_path, Echo, max_steps=1, success_reward="Echo")

    def script(text, k):
        if "<tool_response>" in text:
            return "done"
        return tool_call_text("echo", text="a\udcffb") if k == 0 else tool_call_text("\udcff")

    with ScriptedGeneration(trainer, script), BatchRecorder(trainer) as rec:
        trainer.train()
    (batch,) = rec.batches
    tool_text = [
        trainer.processing_class.decode(
            batch["completion_ids"][row][~batch["tool_mask"][row].bool() & batch["completion_mask"][row].bool()]
        )
        for row in range(4)
    ]
    assert "echo: a\ufffdb" in tool_text[0] and "echo: a\ufffdb" in tool_text[2]
    assert "Tool \\udcff not found" in tool_text[1]  # TRL's error text escapes it; the name was made safe
    assert trainer.state.log_history[0]["tools/unsafe_results"] == 4.0
