"""ReplayGRPOConfig / ReplayGRPOTrainer validation: errors name the field and the fix."""

import pytest
from scripts.replay_world import make_trainer

from trl_ext.testing import cpu_test_args
from trl_ext.trainers import ReplayGRPOConfig


def config(tmp_path, **overrides):
    return cpu_test_args(tmp_path, ReplayGRPOConfig, **overrides)


def test_defaults(tmp_path):
    args = config(tmp_path)
    assert args.experience_rbound == args.num_generations == 4
    assert (args.replay_start_ratio, args.exp_ratio, args.offpolicy_trajectories_per_task) == (0.35, 0.5, 1)
    assert (args.off_policy_loss, args.off_cliprange_high, args.clip_ratio_c, args.exp_select_mode) == (
        "clip",
        1.0,
        3.0,
        "argmin",
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"offpolicy_trajectories_per_task": 4}, "offpolicy_trajectories_per_task must be at least 1 and below"),
        ({"offpolicy_trajectories_per_task": 0}, "offpolicy_trajectories_per_task"),
        ({"exp_ratio": 1.5}, "exp_ratio must be in"),
        ({"replay_start_ratio": -0.1}, "replay_start_ratio must be in"),
        ({"replay_start_solve_rate": 2.0}, "replay_start_solve_rate"),
        ({"max_trajectories_per_task": 1, "offpolicy_trajectories_per_task": 2}, "max_trajectories_per_task"),
        ({"experience_lbound": 3, "experience_rbound": 2}, "experience_lbound < experience_rbound"),
        ({"experience_rbound": 5}, "experience_rbound <= num_generations"),
        ({"experience_lbound": 2, "experience_rbound": 3}, "widen the window"),
        ({"exp_select_mode": "median"}, "exp_select_mode must be one of"),
        ({"bucket_weighting": "zipf"}, "bucket_weighting must be one of"),
        ({"off_policy_loss": "ppo"}, "off_policy_loss must be one of"),
        ({"max_buffer_tokens": 0}, "max_buffer_tokens"),
        ({"max_policy_lag": -1}, "max_policy_lag"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c must be greater than 1"),
        ({"shaping_beta": 0.0}, "shaping_beta must be positive"),
        ({"off_cliprange_high": 0.0}, "off_cliprange_high"),
    ],
)
def test_bad_values_are_errors_naming_the_field(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **overrides)


def test_unknown_success_reward_is_an_error_at_init(tmp_path):
    with pytest.raises(ValueError, match=r"success_reward='accuracy' is not a reward function name.*\['exact'\]"):
        make_trainer(tmp_path, success_reward="accuracy")


def test_success_reward_selects_the_reward_function(tmp_path):
    trainer = make_trainer(tmp_path, success_reward="exact")
    assert trainer._success_index == 0


def test_wrong_args_type(tmp_path):
    from trl import GRPOConfig

    from trl_ext.testing import tiny_causal_lm
    from trl_ext.trainers import ReplayGRPOTrainer

    model, _ = tiny_causal_lm()
    with pytest.raises(TypeError, match="ReplayGRPOConfig"):
        ReplayGRPOTrainer(model=model, reward_funcs=lambda **k: [0.0], args=cpu_test_args(tmp_path, GRPOConfig))


def test_reward_funcs_are_optional_as_in_trl(tmp_path):
    """Without reward functions TRL's own check applies (an environment may own the rewards), not a TypeError."""
    from trl_ext.testing import tiny_causal_lm
    from trl_ext.trainers import ReplayGRPOTrainer

    model, tokenizer = tiny_causal_lm()
    with pytest.raises(ValueError, match="No reward source provided"):
        ReplayGRPOTrainer(model, args=config(tmp_path), processing_class=tokenizer)
