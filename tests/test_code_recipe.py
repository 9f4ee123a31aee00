"""recipes/absolute_zero.py with the code family end to end: a tiny model whose generation is scripted (programs,
inputs and answers of tests/scripts/absolute_zero_code_ranks.py), checked in the real sandbox; and the code configs."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from trl_ext.tasks.code_reasoning import ZERO_TRIPLET
from trl_ext.testing import ScriptedGeneration, tiny_checkpoint


ROOT = Path(__file__).parent.parent
CPU_CONFIG = ROOT / "recipes/configs/absolute_zero_code_smollm2_cpu.yaml"
GPU_CONFIG = ROOT / "recipes/configs/absolute_zero_code_qwen2.5_coder.yaml"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def recipe():
    return load("absolute_zero_recipe_code", ROOT / "recipes" / "absolute_zero.py")


@pytest.mark.slow
def test_code_self_play_end_to_end(recipe, tmp_path, monkeypatch):
    from trl import ModelConfig, TrlParser

    scenario = load("absolute_zero_code_ranks", ROOT / "tests/scripts/absolute_zero_code_ranks.py")

    class ScriptedTrainer(recipe.AbsoluteZeroTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            ScriptedGeneration(self, scenario.script).__enter__()

    monkeypatch.setattr(recipe, "AbsoluteZeroTrainer", ScriptedTrainer)
    out = tmp_path / "out"
    argv = ["--config", str(CPU_CONFIG), "--model_name_or_path", tiny_checkpoint(tmp_path / "tiny"),
            "--output_dir", str(out), "--max_steps", "2", "--max_question_length", "8", "--max_completion_length", "8"]
    parser = TrlParser((recipe.AbsoluteZeroScriptArguments, recipe.AbsoluteZeroConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    training_args.disable_tqdm = True
    recipe.main(script_args, training_args, model_args)

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "code" and (out / "learning_curves.png").is_file()
    per_step = metrics["per_step"]
    # Every proposal group holds one valid proposal (the other: no code, a clock read, prose), solved on 1 of 2.
    assert per_step["proposer/invalid_rate"] == [0.5, 0.5]
    assert per_step["solver/code_correct_mean"] == [0.5, 0.5]
    types = {key.split("/")[1] for key in per_step if key.endswith("/valid_rate")}
    assert types and types <= {"deduction", "abduction", "induction"}
    for task_type in types:
        assert {v for v in per_step[f"task/{task_type}/valid_rate"] if v is not None} == {0.5}
    # The final buffer: the zero triplet and the scripted deduction/abduction triplets, as the last step logged it.
    triplets = json.loads((out / "task_state.json").read_text())["triplets"]
    assert triplets[0] == ZERO_TRIPLET and len(triplets) == per_step["task/buffer_size"][-1]
    assert {t["program"] for t in triplets[1:]} <= {scenario.SORT, scenario.DOUBLE}
    assert training_args.reward_weights == [1.0, 0.25]
    assert "solver accuracy (mean over steps)" in (out / "README.md").read_text()


def test_code_configs():
    cpu = yaml.safe_load(CPU_CONFIG.read_text())
    assert cpu["use_cpu"] and cpu["max_steps"] <= 10 and "model_name_or_path" not in cpu and cpu["task"] == "code"
    gpu = yaml.safe_load(GPU_CONFIG.read_text())
    assert gpu["model_name_or_path"].startswith("Qwen/Qwen2.5-Coder") and gpu["task"] == "code"
    assert gpu["use_vllm"] and gpu["vllm_mode"] == "server"


def test_code_switch(recipe, tmp_path):
    from trl import ModelConfig, TrlParser

    parser = TrlParser((recipe.AbsoluteZeroScriptArguments, recipe.AbsoluteZeroConfig, ModelConfig))
    args, _, _ = parser.parse_args_and_config(args=["--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false",
                                                    "--task", "code", "--num_references", "3",
                                                    "--sandbox_timeout_s", "2"])
    task = recipe.build_task(args)
    assert task.name == "code" and task.state.num_references == 3 and task.state.limits["timeout_s"] == 2
