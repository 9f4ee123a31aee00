"""Parity with GRPOTrainer: each trainer, in its neutral setting, trains under the GRPOConfig options TRL's own tests
exercise (KL to a reference model, reference sync, KL bias correction, num_iterations, every loss_type, sequence-level
importance sampling, scale_rewards, mask_truncated_completions, top_entropy_quantile, several reward functions with
and without weights, rewards that return None) and changes the weights; Replay GRPO also trains, as GRPOTrainer
does, with no reward functions when the environment owns the reward.

Neutral settings: Replay GRPO with replay never starting; RLCR with two answers and two confidence samples; Absolute
Zero with one proposal round. Generation is scripted so that every group has reward signal and some completions are
truncated (no end-of-sequence token), which `mask_truncated_completions` drops.
"""

import pytest
from datasets import Dataset

from trl_ext import use_tool_chat_template
from trl_ext.testing import (
    ScriptedGeneration,
    changed_parameters,
    cpu_test_args,
    snapshot_parameters,
    tiny_checkpoint,
    tiny_tokenizer,
    tool_call_text,
)
from trl_ext.trainers import (
    AbsoluteZeroConfig,
    AbsoluteZeroTrainer,
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)


MAX_TOKENS = 6


def text(completion):
    return completion[0]["content"] if isinstance(completion, list) else completion


def starts_with_a(completions, **kwargs):
    return [float(text(c).lstrip().startswith("A")) for c in completions]


def length(completions, **kwargs):
    return [len(text(c)) / 10 for c in completions]


def judged_sometimes(completions, **kwargs):
    """Not applicable (None) to completions starting with B, as a judge that cannot score them."""
    return [None if text(c).lstrip().startswith("B") else float("A" in text(c)) for c in completions]


REWARDS = {"one": [starts_with_a], "two": [starts_with_a, length], "with-none": [starts_with_a, judged_sometimes]}

# Every loss_type once per trainer, the other options spread over those runs (a run is a trainer build and a step, so
# the grid is kept to 8 runs per trainer). beta > 0 runs with num_iterations=1, where TRL skips the old log-probs.
CASES = [
    ("grpo-beta", dict(loss_type="grpo", beta=0.1), "one"),
    (
        "bnpo-beta-sync-ref",
        dict(loss_type="bnpo", beta=0.1, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.5),
        "one",
    ),
    ("dr_grpo-beta-bias-corrected-kl", dict(loss_type="dr_grpo", beta=0.1, use_bias_correction_kl=True), "one"),
    (
        "dapo-beta-num_iterations-2-scale-batch",
        dict(loss_type="dapo", beta=0.1, num_iterations=2, scale_rewards="batch"),
        "one",
    ),
    (
        "cispo-mask-truncated-top-entropy",
        dict(loss_type="cispo", mask_truncated_completions=True, top_entropy_quantile=0.2),
        "one",
    ),
    (
        "sapo-scale-none-weighted-rewards",
        dict(loss_type="sapo", scale_rewards="none", reward_weights=[1.0, 0.5]),
        "two",
    ),
    ("vespo-two-rewards", dict(loss_type="vespo"), "two"),
    ("luspo-sequence-level-none-rewards", dict(loss_type="luspo", importance_sampling_level="sequence"), "with-none"),
]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    # A path, not a model object: with beta > 0 TRL loads the reference model from it.
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def prompt(content):
    # A system message of our own: SmolLM2's template would add its long default one (tokens cost time here).
    return [{"role": "system", "content": "."}, {"role": "user", "content": content}]


def answer(prompt_text, k):
    """Scripted sample k of a group of two: rewards differ inside every group; the first prompt's second sample is
    truncated (no end-of-sequence token)."""
    if k % 2 == 0:
        return "A yes"
    return tiny_tokenizer().encode(" B B B B B B B B")[:MAX_TOKENS] if "0" in prompt_text.split("user")[-1] else "B no"


def replay(model_path, tmp_path, overrides, rewards):
    args = cpu_test_args(
        tmp_path,
        ReplayGRPOConfig,
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=MAX_TOKENS,
        replay_start_ratio=1.0,
        **overrides,
    )
    data = Dataset.from_list([{"prompt": prompt(f"Say {i}")} for i in range(2)])
    return ReplayGRPOTrainer(model_path, rewards, args=args, train_dataset=data), answer


def rlcr(model_path, tmp_path, overrides, rewards):
    if "reward_weights" in overrides:  # one weight per reward function passed; accuracy's is accuracy_weight
        overrides = {**overrides, "reward_weights": overrides["reward_weights"][1:], "accuracy_weight": 1.0}
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        num_generations_confidence=2,
        max_completion_length=MAX_TOKENS,
        max_confidence_length=MAX_TOKENS,
        **overrides,
    )
    data = Dataset.from_list([{"prompt": prompt("Is 0 even?"), "solution": "yes"}])

    def script(prompt_text, k):
        if "confidence" in prompt_text.split("<|im_start|>user")[-1]:
            return ["<confidence>0.9</confidence>", "<confidence>0.2</confidence>"][k % 2]
        return "A <answer>yes</answer>" if k % 2 == 0 else answer(prompt_text, k)

    return RLCRMultiTurnTrainer(model_path, rewards[1:], args=args, train_dataset=data), script


def absolute_zero(model_path, tmp_path, overrides, rewards):
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        num_questions_per_prompt=2,
        max_repropose_attempts=0,
        max_completion_length=MAX_TOKENS,
        max_question_length=MAX_TOKENS,
        **overrides,
    )
    data = Dataset.from_list([{"prompt": prompt("Propose a task")}])
    trainer = AbsoluteZeroTrainer(
        model_path, rewards, args=args, train_dataset=data, parse_question=lambda text: {"question": "Say 0"}
    )
    return trainer, lambda prompt_text, k: answer(prompt_text, k) if "Say 0" in prompt_text else f"Say {k}"


TRAINERS = {"replay": replay, "rlcr": rlcr, "absolute_zero": absolute_zero}


@pytest.mark.parametrize("trainer_name", list(TRAINERS))
@pytest.mark.parametrize("case, overrides, rewards", CASES, ids=[c[0] for c in CASES])
def test_trains_under_grpo_option(model_path, tmp_path, trainer_name, case, overrides, rewards):
    trainer, script = TRAINERS[trainer_name](model_path, tmp_path, dict(overrides), REWARDS[rewards])
    before = snapshot_parameters(trainer.model)
    with ScriptedGeneration(trainer, script):
        trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses and all(abs(loss) < 1e6 for loss in losses)
    assert changed_parameters(before, trainer.model)


class Switch:
    """An environment that owns the reward: 1 once `flip` was called."""

    def reset(self, **row):
        self.on = False

    def flip(self) -> str:
        """Turn the switch on."""
        self.on = True
        return "on"

    def get_reward(self) -> float:
        return float(self.on)


def test_replay_trains_with_environment_owned_rewards_and_no_reward_funcs(model_path, tmp_path):
    tokenizer = use_tool_chat_template(tiny_tokenizer())
    args = cpu_test_args(
        tmp_path,
        ReplayGRPOConfig,
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=48,
        replay_start_ratio=1.0,
    )
    data = Dataset.from_list([{"prompt": prompt("Flip the switch.")}])
    trainer = ReplayGRPOTrainer(
        model_path, args=args, train_dataset=data, processing_class=tokenizer, environment_factory=Switch
    )
    assert trainer.reward_func_names == ["Switch"]
    before = snapshot_parameters(trainer.model)

    def script(prompt_text, k):
        return "done" if k == 1 or "<tool_response>" in prompt_text else tool_call_text("flip")

    with ScriptedGeneration(trainer, script):
        trainer.train()
    assert [log["rewards/Switch/mean"] for log in trainer.state.log_history if "loss" in log] == [0.5]
    assert changed_parameters(before, trainer.model)
