"""The RLCR and Replay GRPO recipes under `--eval_strategy steps --eval_steps N`: the held-out split goes to the
trainer as `eval_dataset`, its `evaluate()` metrics land in the log at the configured steps, and
`heldout_curves.png` is drawn from them (tiny model, real generation, two steps)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset

from trl_ext.testing import tiny_checkpoint


ROOT = Path(__file__).parents[2]


def run_recipe(tmp_path, recipe, *flags):
    data = tmp_path / "data.jsonl"
    Dataset.from_list([{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(15)]).to_json(data)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(ROOT / "recipes" / recipe),
        "--model_name_or_path",
        tiny_checkpoint(tmp_path / "tiny"),
        "--dataset_path",
        str(data),
        "--num_eval_samples",
        "3",
        "--output_dir",
        str(out),
        "--use_cpu",
        "--bf16",
        "false",
        "--report_to",
        "none",
        "--logging_steps",
        "1",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "2",
        "--max_completion_length",
        "6",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "1",
        "--per_device_eval_batch_size",
        "2",
        *flags,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (out / "heldout_curves.png").is_file()
    return json.loads((out / "metrics.json").read_text())["train_log"]


def evaluations(log, key):
    return [entry for entry in log if key in entry]


@pytest.mark.slow
def test_rlcr_recipe_evaluates_the_heldout_split_every_eval_steps(tmp_path):
    log = run_recipe(tmp_path, "rlcr.py", "--num_generations_confidence", "2", "--max_confidence_length", "4")
    evaluated = evaluations(log, "eval_answer/accuracy")
    # before training, then every step; the last is the report's "after" (not evaluated twice)
    assert [entry["step"] for entry in evaluated] == [0, 1, 2]
    assert all(entry["eval_num_questions"] == 3 and "eval_calibration/ece" in entry for entry in evaluated)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    for name, entry in (("before", evaluated[0]), ("after", evaluated[-1])):
        assert metrics[name]["accuracy_all"] == entry["eval_answer/accuracy"] and metrics[name]["num_rows"] == 3
    settings = json.loads((tmp_path / "out" / "evaluation_settings.json").read_text())  # for --eval_only later
    assert settings["max_confidence_length"] == 4 and settings["num_eval_samples"] == 3


@pytest.mark.slow
def test_replay_recipe_evaluates_the_heldout_split_every_eval_steps(tmp_path):
    log = run_recipe(tmp_path, "replay_grpo.py", "--replay_start_ratio", "0")
    evaluated = evaluations(log, "eval_accuracy")
    assert [entry["step"] for entry in evaluated] == [1, 2]
    assert all(entry["eval_num_questions"] == 3 and "eval_pass@1" in entry for entry in evaluated)
