"""recipes/absolute_zero.py end to end with a tiny model on local seed prompts (LoRA), its held-out evaluation, and
its default config."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from datasets import Dataset

from trl_ext.evaluation.solver import evaluate_solver
from trl_ext.recipe import RecipeScriptArguments, load_recipe_dataset
from trl_ext.recipe.absolute_zero import AbsoluteZeroScriptArguments
from trl_ext.recipe.self_play_heldout import heldout_set
from trl_ext.self_play import arithmetic_task, workspace_task
from trl_ext.self_play.arithmetic import heldout_questions
from trl_ext.testing import tiny_checkpoint
from trl_ext.trainers import AbsoluteZeroConfig


ROOT = Path(__file__).parents[2]


def test_seed_prompts_need_no_answer_column(tmp_path):
    path = tmp_path / "seeds.jsonl"
    Dataset.from_list([{"seed": f"Write a question about {i}."} for i in range(10)]).to_json(path)
    args = RecipeScriptArguments(dataset_path=str(path), question_column="seed", num_eval_samples=0)
    train, evaluation = load_recipe_dataset(args, None, require_answer=False)
    assert len(train) == 10 and evaluation is None and "solution" not in train.column_names
    assert train[3]["prompt"] == [{"role": "user", "content": "Write a question about 3."}]
    with pytest.raises(ValueError, match="--answer_column"):  # the RLCR contract is unchanged
        load_recipe_dataset(args, None)


def test_default_config_is_a_bounded_cpu_run():
    config = yaml.safe_load((ROOT / "recipes/configs/absolute_zero_smollm2_cpu.yaml").read_text())
    assert config["use_cpu"] and config["max_steps"] <= 10 and "model_name_or_path" not in config
    assert config["task"] == "arithmetic" and config["lenient_parsing"] and config["heldout_size"] == 50


@pytest.mark.slow
def test_recipe_end_to_end_on_local_seeds(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny")
    data = tmp_path / "seeds.jsonl"
    Dataset.from_list([{"question": f"Write an arithmetic question about {i}."} for i in range(8)]).to_json(data)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(ROOT / "recipes/absolute_zero.py"),
        "--model_name_or_path",
        model,
        "--dataset_path",
        str(data),
        "--num_eval_samples",
        "0",
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
        "--num_questions_per_prompt",
        "2",
        "--max_repropose_attempts",
        "1",
        "--max_completion_length",
        "6",
        "--max_question_length",
        "8",
        "--lenient_parsing",
        "--use_peft",
        "--lora_r",
        "4",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        "--heldout_size",
        "6",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in (
        "metrics.json",
        "learning_curves.png",
        "adapter_model.safetensors",
        "README.md",
        "heldout_accuracy.png",
        "heldout_before.json",
        "heldout_after.json",
    ):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "arithmetic"
    assert len(metrics["per_step"]["unified_filter/learnable_ratio"]) == 2
    assert "solver/numeric_match_mean" in metrics["per_step"]
    card = (out / "README.md").read_text()
    assert "absolute-zero" in card

    # The held-out evaluation: the seeded questions, numbers consistent with every reply's score, in the report.
    assert metrics["heldout"]["seed"] == 42  # TRL's default seed
    for when in ("before", "after"):
        report = json.loads((out / f"heldout_{when}.json").read_text())
        rows = report.pop("rows")
        assert [row["question"] for row in rows] == heldout_questions(6, 42)
        assert report == metrics["heldout"][when] and report["num_questions"] == 6
        assert report["reward"] == "numeric_match" and report["breakdown"] == "level"
        scores = [row["score"] for row in rows]
        assert set(scores) <= {0.0, 1.0} and report["accuracy"] == sum(scores) / 6
        for level in ("1", "2", "3"):
            of_level = [row["score"] for row in rows if str(row["question"]["level"]) == level]
            assert report["counts"][level] == 2 and report["by_group"][level] == sum(of_level) / 2
        assert f"| held-out solver accuracy ({when}) | {report['accuracy']:.3f} |" in card
        assert f"| held-out accuracy, level 3 ({when}) | {report['by_group']['3']:.3f} |" in card
    assert "held-out solver accuracy (6 questions, greedy, numeric_match): before" in proc.stdout
    assert "heldout_accuracy.png" in proc.stdout

    # The trained model, loaded from the output, answers the held-out questions exactly as the run reported.
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    model = AutoPeftModelForCausalLM.from_pretrained(out)
    again = evaluate_solver(
        arithmetic_task(lenient=True),
        model,
        AutoTokenizer.from_pretrained(out),
        6,
        heldout_questions(6, 42),
        progress=False,
    )
    assert again.rows == json.loads((out / "heldout_after.json").read_text())["rows"]


def test_heldout_size(tmp_path):
    from trl import ModelConfig, TrlParser

    parser = TrlParser((AbsoluteZeroScriptArguments, AbsoluteZeroConfig, ModelConfig))

    def script_args(*flags):
        return parser.parse_args_and_config(
            args=["--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false", *flags]
        )[0]

    with pytest.raises(ValueError, match="--heldout_size must be 0"):
        script_args("--heldout_size", "-1")
    assert heldout_set(arithmetic_task(), script_args(), 0) == heldout_questions(50, 0)  # the default
    assert heldout_set(arithmetic_task(), script_args("--heldout_size", "0"), 0) is None
    with pytest.raises(ValueError, match="0 to 600"):
        heldout_set(arithmetic_task(), script_args("--heldout_size", "601"), 0)
    assert heldout_set(workspace_task(), script_args(), 0) is None
    with pytest.raises(ValueError, match="workspace family has no held-out evaluation"):
        heldout_set(workspace_task(), script_args("--heldout_size", "5"), 0)
