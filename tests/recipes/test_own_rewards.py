"""Own rewards from the command line, as TRL's `trl grpo` takes them: `--reward_funcs` (dotted paths or `trl.rewards`
names, several allowed) in every recipe and RLCR's `--accuracy_func`; a bad path names the module and the attribute."""

import sys

import pytest
import trl.rewards
from trl import ModelConfig, TrlParser

from trl_ext import ReplayGRPOConfig
from trl_ext.recipe.cli import load_function, load_reward_funcs
from trl_ext.recipe.replay import ReplayScriptArguments, reward_funcs
from trl_ext.recipe.rlcr import RLCRScriptArguments, accuracy_func


REWARDS = """
def brevity(prompts, completions, completion_ids, **kwargs):
    return [-len(ids) / 100 for ids in completion_ids]


def same_answer(gold, prediction):
    return gold.strip() == prediction.strip()


NOT_A_FUNCTION = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """`my_rewards.py` in the working directory, as a user writes it next to their data."""
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_dotted_paths_and_trl_names_load_in_order(user_module):
    funcs = load_reward_funcs(["my_rewards.brevity", "think_format_reward"])
    assert funcs[0].__name__ == "brevity" and funcs[0]([], [], [[1, 2]]) == [-0.02]
    assert funcs[1] is trl.rewards.think_format_reward
    assert load_reward_funcs(None) == []


def test_a_bad_path_names_the_module_and_the_attribute(user_module):
    with pytest.raises(ValueError, match=r"--reward_funcs 'no_such_mod\.f': cannot import the module 'no_such_mod'"):
        load_function("no_such_mod.f", "--reward_funcs")
    with pytest.raises(ValueError, match=r"the module 'my_rewards' .* has no attribute 'brevty'"):
        load_function("my_rewards.brevty", "--reward_funcs")
    with pytest.raises(ValueError, match="'NOT_A_FUNCTION' in the module 'my_rewards' is not a function"):
        load_function("my_rewards.NOT_A_FUNCTION", "--accuracy_func")
    with pytest.raises(ValueError, match="--reward_funcs 'brevity': give a dotted import path"):
        load_reward_funcs(["brevity"])


def parse(script_args_cls, config_cls, argv):
    parser = TrlParser((script_args_cls, config_cls, ModelConfig))
    return parser.parse_args_and_config(args=["--output_dir", "out", "--use_cpu", "true", "--bf16", "false", *argv])


def test_replay_reward_funcs_replace_the_built_in_pair(user_module):
    script_args, training_args, _ = parse(ReplayScriptArguments, ReplayGRPOConfig, [])
    built_in = reward_funcs(script_args, training_args)
    assert [f.__name__ for f in built_in] == ["accuracy", "format"] and training_args.reward_weights == [1.0, 0.5]
    argv = ["--reward_funcs", "my_rewards.brevity", "accuracy_reward"]
    script_args, training_args, _ = parse(ReplayScriptArguments, ReplayGRPOConfig, argv)
    assert [f.__name__ for f in reward_funcs(script_args, training_args)] == ["brevity", "accuracy_reward"]
    assert training_args.reward_weights is None  # TRL's default: every reward weighted 1


def test_rlcr_accuracy_func_from_the_command_line(user_module):
    from trl_ext import RLCRMultiTurnConfig

    script_args, _, _ = parse(RLCRScriptArguments, RLCRMultiTurnConfig, ["--accuracy_func", "my_rewards.same_answer"])
    check = accuracy_func(script_args)
    assert check(" 4", "4") is True and check("4", "5") is False
    assert accuracy_func(parse(RLCRScriptArguments, RLCRMultiTurnConfig, [])[0]) is None
