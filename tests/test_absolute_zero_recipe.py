"""recipes/absolute_zero.py end to end with a tiny model on local seed prompts (LoRA), and its default config."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from datasets import Dataset

from trl_ext.recipe import RecipeScriptArguments, load_recipe_dataset
from trl_ext.testing import tiny_checkpoint


ROOT = Path(__file__).parent.parent


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
    assert config["task"] == "arithmetic" and config["lenient_parsing"]


@pytest.mark.slow
def test_recipe_end_to_end_on_local_seeds(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny")
    data = tmp_path / "seeds.jsonl"
    Dataset.from_list([{"question": f"Write an arithmetic question about {i}."} for i in range(8)]).to_json(data)
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "recipes/absolute_zero.py"), "--model_name_or_path", model,
           "--dataset_path", str(data), "--num_eval_samples", "0", "--output_dir", str(out), "--use_cpu",
           "--bf16", "false", "--report_to", "none", "--logging_steps", "1", "--max_steps", "2",
           "--per_device_train_batch_size", "4", "--num_generations", "2", "--num_questions_per_prompt", "2",
           "--max_repropose_attempts", "1", "--max_completion_length", "6", "--max_question_length", "8",
           "--lenient_parsing", "--use_peft", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("metrics.json", "learning_curves.png", "adapter_model.safetensors", "README.md"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "arithmetic"
    assert len(metrics["per_step"]["unified_filter/learnable_ratio"]) == 2
    assert "solver/numeric_match_mean" in metrics["per_step"]
    assert "absolute-zero" in (out / "README.md").read_text()
