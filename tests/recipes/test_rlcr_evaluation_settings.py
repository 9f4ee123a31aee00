"""RLCR's recipe keeps the settings of a model's reported evaluation (`evaluation_settings.json`) and `--eval_only`
on that directory reuses them, flags overriding (trl_ext/recipe/rlcr.py)."""

import json

from trl import ModelConfig, TrlParser

from trl_ext.recipe.cli import SETTINGS_FILE
from trl_ext.recipe.rlcr import RLCRScriptArguments, evaluation_settings, reuse_evaluation_settings
from trl_ext.trainers import RLCRMultiTurnConfig


TRAINED_WITH = [
    "--max_completion_length",
    "48",
    "--max_confidence_length",
    "10",
    "--confidence_prompt",
    "How sure are you? <confidence>p</confidence>",
    "--system_prompt",
    "Answer in <answer></answer> tags.",
    "--chat_template_kwargs",
    '{"enable_thinking": false}',
    "--lenient_parsing",
    "true",
    "--num_eval_samples",
    "7",
    "--answer_delimiter",
    "####",
    "--eval_temperature",
    "0.7",
    "--eval_num_samples",
    "3",
    "--seed",
    "5",
]


def parse(argv):
    parser = TrlParser((RLCRScriptArguments, RLCRMultiTurnConfig, ModelConfig))
    return parser.parse_args_and_config(args=["--use_cpu", "true", "--bf16", "false", *argv])


def test_eval_only_reuses_the_saved_settings_unless_flags_override(tmp_path):
    script_args, training_args, _ = parse(["--output_dir", str(tmp_path / "run"), *TRAINED_WITH])
    saved = evaluation_settings(script_args, training_args)
    assert saved["max_confidence_length"] == 10 and saved["chat_template_kwargs"] == {"enable_thinking": False}
    assert saved["lenient_parsing"] is True and saved["eval_num_samples"] == 3 and saved["seed"] == 5
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / SETTINGS_FILE).write_text(json.dumps(saved))

    argv = ["--eval_only", "--model_name_or_path", str(model_dir), "--max_confidence_length", "6"]
    reused = parse(["--output_dir", str(tmp_path / "eval"), *reuse_evaluation_settings(argv)])
    assert reused[1].max_confidence_length == 6  # the flag wins
    assert evaluation_settings(*reused[:2]) == {**saved, "max_confidence_length": 6}
    assert reused[0].answer_delimiter == "####" and reused[1].confidence_prompt.startswith("How sure")


def test_settings_are_reused_only_for_eval_only_on_a_directory_that_has_them(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / SETTINGS_FILE).write_text(json.dumps({"max_confidence_length": 10, "reward_funcs": ["m.a", "m.b"]}))
    training = ["--model_name_or_path", str(model_dir)]
    assert reuse_evaluation_settings(training) == training
    # a directory without settings: only the report's place, beside the model
    elsewhere = ["--eval_only", "--model_name_or_path", str(tmp_path)]
    assert reuse_evaluation_settings(elsewhere) == [*elsewhere, "--output_dir", str(tmp_path)]
    hub_id = ["--eval_only", "--model_name_or_path", "org/model"]
    assert reuse_evaluation_settings(hub_id) == hub_id
    assert reuse_evaluation_settings(["--eval_only", *training]) == [
        "--eval_only",
        *training,
        "--output_dir",
        str(model_dir),
        "--max_confidence_length",
        "10",
        "--reward_funcs",
        "m.a",
        "m.b",
    ]
    # --output_dir on the command line: the report goes there
    assert "--output_dir" not in reuse_evaluation_settings(["--eval_only", *training, "--output_dir", "x"])[5:]
