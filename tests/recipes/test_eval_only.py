"""A TRL user's own run in every recipe: their JSONL, their reward, LoRA, TRL's default `--logging_steps 10`, then
`--eval_only` on the output directory (a LoRA adapter: base + adapter), which reuses the run's data settings and
writes its report beside the model under plain names, n stated; `--eval_only` with a shipped CPU YAML."""

import json
import sys

import pytest
from datasets import Dataset

from trl_ext.recipe import absolute_zero, replay, rlcr
from trl_ext.recipe.cli import SETTINGS_FILE
from trl_ext.testing import tiny_checkpoint


REWARDS = """
def brevity(prompts, completions, completion_ids, **kwargs):
    return [max(0.0, 1 - len(ids) / 100) for ids in completion_ids]


def same_answer(gold, prediction):
    return gold.strip() == prediction.strip()
"""
TINY = ["--use_cpu", "true", "--bf16", "false", "--report_to", "none", "--max_completion_length", "6"]
LORA = ["--use_peft", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"]
STEPS = ["--max_steps", "2", "--logging_steps", "10", "--per_device_train_batch_size", "4", "--num_generations", "2"]
RECIPES = {
    "rlcr": (
        rlcr.run,
        ["--accuracy_func", "my_rewards.same_answer", "--num_generations_confidence", "2"],
        ["--max_confidence_length", "4"],
    ),
    "replay": (replay.run, [], []),
    "absolute_zero": (absolute_zero.run, ["--heldout_size", "4"], []),
}


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """What a user has: a JSONL of their questions and answers, a module with their reward, a model."""
    Dataset.from_list([{"q": f"What is {i}+{i}?", "a": str(2 * i)} for i in range(20)]).to_json(
        tmp_path / "mine.jsonl"
    )
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    tiny_checkpoint(tmp_path / "tiny")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    sys.modules.pop("my_rewards", None)


@pytest.mark.slow  # a 2-step LoRA run and an evaluation per recipe on a tiny model: about 20 s each
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_own_data_reward_and_lora_then_eval_only(user_dir, recipe, capsys, caplog):
    run, train_flags, eval_flags = RECIPES[recipe]
    data = [
        "--dataset_path",
        "mine.jsonl",
        "--question_column",
        "q",
        "--answer_column",
        "a",
        "--num_eval_samples",
        "4",
    ]
    run(
        [
            "--model_name_or_path",
            "tiny",
            *data,
            "--reward_funcs",
            "my_rewards.brevity",
            *LORA,
            *STEPS,
            *TINY,
            *eval_flags,
            *train_flags,
            "--output_dir",
            "out",
        ]
    )
    out = user_dir / "out"
    assert (out / "adapter_config.json").is_file()
    saved = json.loads((out / SETTINGS_FILE).read_text())
    assert saved["dataset_path"] == "mine.jsonl" and saved["question_column"] == "q"
    assert saved["reward_funcs"] == ["my_rewards.brevity"]
    log = json.loads((out / "metrics.json").read_text())["train_log"]
    assert any("rewards/brevity/mean" in entry for entry in log)  # the user's reward ran

    trained = capsys.readouterr()
    announced = "Held out the last 4 of the 20 rows of mine.jsonl" in caplog.text
    assert announced is (recipe != "absolute_zero")  # every row a seed prompt: its evaluation is the family's
    assert recipe != "rlcr" or "before RL: n 4  accuracy" in trained.out
    run(["--eval_only", "--model_name_or_path", "out", *TINY[:4]])  # no --output_dir, no data flags
    report = json.loads((out / "evaluation.json").read_text())
    printed = capsys.readouterr().out
    assert report["model"] == "out" and report["samples_per_question"] == 1
    assert report["settings"]["dataset_path"] == "mine.jsonl"  # the run's data, not the built-in questions
    assert f"{report['questions']} questions x 1 sample(s)" in printed and "report in out" in printed
    assert (out / "evaluation.jsonl").is_file()
    assert "train_log" in json.loads((out / "metrics.json").read_text())  # the training report is kept
    assert not list(out.glob("eval_eval*")) and not list(out.glob("*eval_eval*"))
    if recipe == "absolute_zero":
        assert report["questions"] == 4  # the run's --heldout_size
    else:
        assert report["questions"] == 4 and report["settings"]["num_eval_samples"] == 4  # held out of mine.jsonl
    if recipe == "rlcr":
        assert report["settings"]["accuracy_func"] == "my_rewards.same_answer"
        assert (out / "evaluation_reliability.png").is_file()


@pytest.mark.slow  # an evaluation of 50 built-in questions on a tiny model
@pytest.mark.parametrize("recipe", ["rlcr", "replay"])
def test_eval_only_with_the_shipped_cpu_yaml(user_dir, recipe):
    """RLCR's CPU YAML evaluates during training (`eval_strategy: steps`), which needs an `eval_dataset`."""
    from trl_ext.recipe.cli import config_path

    run = RECIPES[recipe][0]
    config = config_path(sys.modules[run.__module__].DEFAULT_CONFIG)
    assert recipe != "rlcr" or "eval_strategy: steps" in config.read_text()
    run(["--eval_only", "--config", str(config), "--model_name_or_path", "tiny", "--num_eval_samples", "3", *TINY])
    report = json.loads((user_dir / "tiny" / "evaluation.json").read_text())
    assert report["questions"] == 3
