"""Recipe command lines: the CPU fallback, `--help` marking the embedded-default values, eval-only on a CPU machine,
no deprecation warnings from our configs."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from datasets import Dataset

from trl_ext import AbsoluteZeroConfig, ReplayGRPOConfig, RLCRMultiTurnConfig
from trl_ext.recipe import cpu_fallback, single_process_cpu_threads
from trl_ext.recipe.absolute_zero import AbsoluteZeroScriptArguments
from trl_ext.recipe.replay import ReplayScriptArguments
from trl_ext.recipe.rlcr import RLCRScriptArguments
from trl_ext.testing import tiny_checkpoint


ROOT = Path(__file__).parents[2]
CPU_FLAGS = ["--use_cpu", "true", "--bf16", "false"]


def test_cpu_fallback_only_when_nothing_chose_the_hardware(tmp_path):
    assert cpu_fallback(["--model_name_or_path", "m"], has_accelerator=False) == [
        "--model_name_or_path",
        "m",
        *CPU_FLAGS,
    ]
    assert cpu_fallback(["--model_name_or_path", "m"], has_accelerator=True) == ["--model_name_or_path", "m"]
    for chosen in (["--bf16", "true"], ["--use-cpu"], ["--fp16=true"]):
        assert cpu_fallback(chosen, has_accelerator=False) == chosen
    gpu_yaml = tmp_path / "gpu.yaml"
    gpu_yaml.write_text("bf16: true\n")
    cpu_yaml = tmp_path / "plain.yaml"
    cpu_yaml.write_text("max_steps: 2\n")
    assert cpu_fallback(["--config", str(gpu_yaml)], has_accelerator=False) == ["--config", str(gpu_yaml)]
    assert cpu_fallback([f"--config={cpu_yaml}"], has_accelerator=False) == [f"--config={cpu_yaml}", *CPU_FLAGS]


def test_one_accelerate_process_on_cpu_uses_every_core():
    launched = {"ACCELERATE_DYNAMO_BACKEND": "NO", "OMP_NUM_THREADS": "1"}
    assert single_process_cpu_threads(launched, cores=2) == 2
    assert single_process_cpu_threads({**launched, "WORLD_SIZE": "1"}, cores=8) == 8
    # several processes share the cores; a thread count the user or accelerate chose (> 1) stays; one core: nothing
    assert single_process_cpu_threads({**launched, "WORLD_SIZE": "2"}, cores=2) is None
    assert single_process_cpu_threads({**launched, "OMP_NUM_THREADS": "3"}, cores=8) is None
    assert single_process_cpu_threads(launched, cores=1) is None
    # `python recipes/...` (not launched by accelerate) keeps torch's own choice
    assert single_process_cpu_threads({"OMP_NUM_THREADS": "1"}, cores=2) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_accelerate_launch_of_a_recipe_on_cpu_trains_on_every_core(tmp_path):
    """`accelerate launch` sets OMP_NUM_THREADS=1 for its one process; the recipe's entry point undoes that."""
    script = tmp_path / "recipe.py"
    script.write_text(
        "import torch\n"
        "from trl_ext.recipe import RecipeScriptArguments, run_recipe\n"
        "from trl_ext import RLCRMultiTurnConfig\n"
        f"run_recipe(lambda *a: print('threads', torch.get_num_threads()), RecipeScriptArguments, "
        f"RLCRMultiTurnConfig, {str(tmp_path / 'cfg.yaml')!r}, ['--output_dir', {str(tmp_path)!r}])\n"
    )
    (tmp_path / "cfg.yaml").write_text("report_to: none\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "WORLD_SIZE")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"threads {len(os.sched_getaffinity(0))}" in out.stdout, (out.stdout, out.stderr[-2000:])


def test_configs_raise_no_deprecation_warning_and_keep_trl_default():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = RLCRMultiTurnConfig("out", use_cpu=True, bf16=False)
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True  # TRL's GRPO default
    with pytest.warns(FutureWarning, match="gradient_checkpointing"):  # the old name still works, and says so
        args = RLCRMultiTurnConfig("out", use_cpu=True, bf16=False, gradient_checkpointing=False)
    assert args.activation_checkpointing is False


def test_recipe_configs_use_no_deprecated_key():
    for path in sorted((ROOT / "recipes/configs").glob("*.yaml")):
        assert "gradient_checkpointing" not in path.read_text(), path.name


@pytest.mark.parametrize(
    "recipe, script_args, config",
    [
        ("rlcr", RLCRScriptArguments, RLCRMultiTurnConfig),
        ("replay_grpo", ReplayScriptArguments, ReplayGRPOConfig),
        ("absolute_zero", AbsoluteZeroScriptArguments, AbsoluteZeroConfig),
    ],
)
def test_recipe_configs_name_only_known_fields(recipe, script_args, config):
    """A misspelt or removed key would fail only on the GPU node the config is written for."""
    import dataclasses

    from trl import ModelConfig

    known = {f.name for cls in (script_args, config, ModelConfig) for f in dataclasses.fields(cls)}
    for path in sorted((ROOT / "recipes/configs").glob(f"{recipe}_*.yaml")):
        assert set(yaml.safe_load(path.read_text())) - known == set(), path.name


@pytest.mark.slow  # a fresh interpreter importing the recipe: seconds
def test_help_marks_the_embedded_default_values():
    out = subprocess.run(
        [sys.executable, str(ROOT / "recipes/rlcr.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "1000"},
    ).stdout
    assert "rlcr_smollm2_cpu.yaml when the command line names neither --model_name_or_path nor --config" in out
    max_steps = next(line for line in out.splitlines() if line.lstrip().startswith("--max_steps"))
    steps = yaml.safe_load((ROOT / "recipes/configs/rlcr_smollm2_cpu.yaml").read_text())["max_steps"]
    assert f"[embedded default: {steps}] (default: -1)" in out[out.index(max_steps) :].split("\n  --")[0]


@pytest.mark.slow
def test_eval_only_with_a_named_model_runs_on_a_machine_without_gpu(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny")
    data = tmp_path / "data.jsonl"
    Dataset.from_list([{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(10)]).to_json(data)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(ROOT / "recipes/rlcr.py"),
        "--eval_only",
        "--model_name_or_path",
        model,
        "--dataset_path",
        str(data),
        "--num_eval_samples",
        "2",
        "--output_dir",
        str(out),
        "--max_completion_length",
        "4",
        "--max_confidence_length",
        "4",
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "always::FutureWarning"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "no GPU found, running on CPU" in proc.stderr
    assert "gradient_checkpointing" not in proc.stderr
    metrics = json.loads((out / "evaluation.json").read_text())
    assert metrics["num_rows"] == metrics["questions"] == 2 and (out / "evaluation_reliability.png").is_file()


def test_one_flag_per_concept(tmp_path):
    """`--solution_column` in the recipe says to use `--answer_column`; the `--num_generations_answer` alias works and
    its errors name it; a YAML with an unknown key fails naming the key."""
    from trl import ModelConfig, TrlParser

    from trl_ext.recipe.rlcr import check_one_answer_column

    parser = TrlParser((RLCRScriptArguments, RLCRMultiTurnConfig, ModelConfig))
    base = ["--output_dir", str(tmp_path), *CPU_FLAGS, "--per_device_train_batch_size", "4", "--num_generations", "4"]
    _, training_args, _ = parser.parse_args_and_config(args=[*base, "--solution_column", "gold"])
    with pytest.raises(ValueError, match="--solution_column 'gold': .* --answer_column gold"):
        check_one_answer_column(training_args)
    _, training_args, _ = parser.parse_args_and_config(args=[*base, "--num_generations_answer", "4"])
    assert training_args.num_generations == 4
    with pytest.raises(ValueError, match=r"divisible by .*\(3\).*num_generations_answer sets"):
        parser.parse_args_and_config(args=[*base, "--num_generations_answer", "3"])
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 2\nmax_stepz: 3\n")
    with pytest.raises(ValueError, match="max_stepz"):
        parser.parse_args_and_config(args=["--config", str(config), *base])


def test_logs_go_under_the_output_dir_and_backends_are_installable(tmp_path, monkeypatch):
    """TensorBoard's event files (the evaluation before training included) go under `<output_dir>/runs`; a shipped
    YAML reports only to backends an extra installs; a missing backend is an error naming the extra."""
    import configparser

    from transformers.integrations import integration_utils

    from trl_ext.recipe.cli import logs_under_output_dir

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    seen = {}
    args = RLCRMultiTurnConfig(str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none")
    with logs_under_output_dir(args):
        seen["dir"] = os.environ["TENSORBOARD_LOGGING_DIR"]
    assert seen["dir"].startswith(str(tmp_path / "out" / "runs" / "")) and "TENSORBOARD_LOGGING_DIR" not in os.environ
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", "/mine")  # the user's choice stays
    with logs_under_output_dir(args):
        assert os.environ["TENSORBOARD_LOGGING_DIR"] == "/mine"

    monkeypatch.setattr(integration_utils, "is_tensorboard_available", lambda: False)
    args.report_to = ["tensorboard"]
    with pytest.raises(ValueError, match=r'pip install "\.\[tensorboard\]"'), logs_under_output_dir(args):
        pass

    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    extras = setup["options.extras_require"]
    installable = {"none", *(name for name in ("tensorboard", "wandb", "trackio") if name in extras)}
    for path in sorted((ROOT / "trl_ext/recipe/configs").glob("*.yaml")):
        report_to = yaml.safe_load(path.read_text()).get("report_to", "none")
        assert set([report_to] if isinstance(report_to, str) else report_to) <= installable, path.name


def test_gpu_configs_say_they_are_untested():
    """The GPU node configs have not run anywhere: each says so in its first line (docs/recipes.md too)."""
    gpu = [p for p in sorted((ROOT / "trl_ext/recipe/configs").glob("*.yaml")) if "_cpu" not in p.name]
    assert len(gpu) >= 4  # the three recipes' node configs and RLCR's colocated variant
    for path in gpu:
        assert path.read_text().startswith("# UNTESTED: this config has never been run"), path.name
