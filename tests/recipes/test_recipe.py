"""Recipe plumbing: local datasets in every format, column mapping, the default config, and recipes/rlcr.py end to end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset

from trl_ext.data import graded_arithmetic
from trl_ext.evaluation.records import read_jsonl
from trl_ext.recipe import (
    RecipeScriptArguments,
    load_recipe_dataset,
    parameters_sharded,
    plot_learning_curves,
    with_default_config,
    write_json,
)
from trl_ext.recipe.rlcr import RLCRScriptArguments, warm_up
from trl_ext.testing import tiny_checkpoint


ROOT = Path(__file__).parents[2]
ROWS = [{"q": f"What is {i}+1?", "a": f"Work: {i} plus 1 #### {i + 1}"} for i in range(10)]


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet", ".csv"])
def test_local_files_map_to_prompt_and_solution(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    ds = Dataset.from_list(ROWS)
    {
        ".json": lambda: ds.to_json(path, lines=False),
        ".jsonl": lambda: ds.to_json(path),
        ".parquet": lambda: ds.to_parquet(path),
        ".csv": lambda: ds.to_csv(path, index=False),
    }[suffix]()
    args = RecipeScriptArguments(
        dataset_path=str(path), question_column="q", answer_column="a", answer_delimiter="####", num_eval_samples=2
    )
    train, evaluation = load_recipe_dataset(args, system_prompt="Be brief.")
    assert len(train) == 8 and len(evaluation) == 2  # the last rows are held out
    assert train[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 0+1?"},
    ]
    assert train[0]["solution"] == "1" and evaluation[-1]["solution"] == "10"


def test_dataset_errors_name_the_flag(tmp_path):
    path = tmp_path / "data.jsonl"
    Dataset.from_list(ROWS).to_json(path)
    with pytest.raises(ValueError, match="--question_column"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(path), answer_column="a"), None)
    with pytest.raises(ValueError, match="--answer_column"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(path), question_column="q"), None)
    with pytest.raises(ValueError, match="unsupported extension"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(tmp_path / "data.txt")), None)
    with pytest.raises(ValueError, match="not both"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(path), dataset_name="org/name"), None)
    assert load_recipe_dataset(RecipeScriptArguments(), None) == (None, None)


def test_default_config_only_without_model_or_config():
    assert with_default_config([], "d.yaml") == ["--config", "d.yaml"]
    assert with_default_config(["--max_steps", "2"], "d.yaml") == ["--config", "d.yaml", "--max_steps", "2"]
    assert with_default_config(["--model_name_or_path", "m"], "d.yaml") == ["--model_name_or_path", "m"]
    assert with_default_config(["--config=c.yaml"], "d.yaml") == ["--config=c.yaml"]


def test_graded_arithmetic_is_deterministic_and_graded():
    a, b = graded_arithmetic(10, seed=3), graded_arithmetic(10, seed=3)
    assert a.to_list() == b.to_list() and a.to_list() != graded_arithmetic(10, seed=4).to_list()
    assert a["level"] == [1, 2, 3, 4, 5] * 2
    for row in a:
        expression = row["question"].removeprefix("What is ").removesuffix("?")
        assert str(eval(expression)) == row["solution"]  # test-only check of the generator's arithmetic


def test_builtin_data_has_disjoint_seeds_and_no_heldout_set_when_asked_for_none():
    from types import SimpleNamespace

    from trl_ext.recipe.data import datasets_for

    settings = SimpleNamespace(seed=7)
    train, evaluation = datasets_for(RLCRScriptArguments(num_train_samples=20, num_eval_samples=5), settings)
    assert len(train) == 20 and len(evaluation) == 5 and train[0] != evaluation[0]
    train, evaluation = datasets_for(RLCRScriptArguments(num_train_samples=20, num_eval_samples=0), settings)
    assert len(train) == 20 and evaluation is None  # not an empty set the evaluation would trip over


def test_plots_and_json(tmp_path):
    log = [{"step": 1, "answer/accuracy": 0.5}, {"step": 2, "answer/accuracy": 0.75}, {"step": 2, "loss": 1.0}]
    png = plot_learning_curves(log, ["answer/accuracy", "calibration/ece"], tmp_path / "c.png", "t")
    assert Path(png).read_bytes()[:4] == b"\x89PNG"
    write_json(tmp_path / "m.json", {"ece": float("nan"), "x": [1.0, float("inf")]})
    assert json.loads((tmp_path / "m.json").read_text()) == {"ece": None, "x": [1.0, None]}


@pytest.mark.slow
def test_rlcr_recipe_end_to_end_on_local_files(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny")
    data = tmp_path / "data.jsonl"
    Dataset.from_list([{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(20)]).to_json(data)
    out = tmp_path / "out"
    common = [
        "--dataset_path",
        str(data),
        "--num_eval_samples",
        "4",
        "--output_dir",
        str(out),
        "--use_cpu",
        "--bf16",
        "false",
        "--report_to",
        "none",
        "--logging_steps",
        "1",
        "--max_completion_length",
        "8",
        "--max_confidence_length",
        "6",
    ]
    train = [
        sys.executable,
        str(ROOT / "recipes/rlcr.py"),
        "--model_name_or_path",
        model,
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "2",
        "--num_generations_confidence",
        "2",
        "--use_peft",
        "--lora_r",
        "4",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        *common,
    ]
    proc = subprocess.run(train, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in (
        "metrics.json",
        "reliability_before.png",
        "reliability_after.png",
        "reliability_before_after.png",
        "learning_curves.png",
        "adapter_model.safetensors",
        "eval_before.json",
        "eval_after.json",
        "eval_before.jsonl",
        "eval_after.jsonl",
    ):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"before", "after", "train_log"} <= set(metrics) and metrics["after"]["num_rows"] == 4
    assert json.loads((out / "eval_after.json").read_text()) == metrics["after"]
    records = read_jsonl(out / "eval_after.jsonl")  # per answer: the question, its group (none here), the reply
    assert [r["prompt"] for r in records] == [f"What is {i}+{i}?" for i in range(16, 20)]
    assert all(r["group"] is None and {"answer", "gold", "correct", "confidence"} <= set(r) for r in records)
    assert set(metrics["after"]["intervals"]) >= {"accuracy", "ece", "brier", "auroc", "brier_skill"}
    assert "bootstrap 95% intervals in brackets" in proc.stdout
    assert sum("answer/accuracy" in log for log in metrics["train_log"]) == 2
    assert "is deprecated" not in proc.stderr  # no deprecation warning for keys or library internals
    card = (out / "README.md").read_text()  # our card, not PEFT's generic one
    assert "library_name: peft" in card and "- rlcr" in card and "@article{damani2025beyond" in card
    assert "Training data: the local file `data.jsonl`." in card and "| ECE (after) |" in card

    assert "rlcr_paper" not in metrics["after"]  # ours only, unless asked

    evaluate = [
        sys.executable,
        str(ROOT / "recipes/rlcr.py"),
        "--eval_only",
        "--model_name_or_path",
        model,
        "--rlcr_paper_metrics",
        "--agreement_samples",
        "2",
        "--confidence_samples",
        "3",
        *common,
    ]
    proc = subprocess.run(evaluate, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (out / "evaluation_reliability.png").is_file()
    metrics = json.loads((out / "evaluation.json").read_text())
    rows = read_jsonl(out / "evaluation.jsonl")
    # ours over the parsed confidences; the paper's over every row, unparsable ones as 0
    assert metrics["n"] == sum(r["confidence"] is not None for r in rows)
    assert metrics["rlcr_paper"]["n"] == metrics["num_rows"] == 4
    assert metrics["rlcr_paper"]["convention"] == "rlcr_paper"
    assert metrics["rlcr_paper"]["mean_confidence"] == pytest.approx(sum(r["confidence"] or 0 for r in rows) / 4)
    assert "RLCR paper's convention: ECE" in proc.stdout
    agreement = metrics["sampling_agreement"]  # the untrained reference: 2 sampled answers per question
    assert agreement["samples_per_question"] == 2 and 0 < agreement["generated_tokens"] <= 4 * 2 * 8
    assert all(r["agreement"] in (0.0, 0.5, 1.0) for r in rows) and "sampling agreement of 2 answers" in proc.stdout
    mean = metrics["stated_confidence_mean_of_k"]  # beside the greedy confidence: 3 sampled per answer
    assert mean["samples_per_question"] == 3 and 0 < mean["generated_tokens"]
    # the tiny random model's sampled replies never parse: no row has a mean, all four count as unparsable
    assert mean["n"] == 0 and mean["confidence_parse_fail_rate"] == 1.0
    assert all(len(r["sampled_confidences"]) == 3 and "confidence_mean" in r for r in rows)
    assert "stated confidence, mean of 3 samples at temperature 1" in proc.stdout


@pytest.mark.slow
def test_replay_grpo_recipe_end_to_end_on_local_files(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny")
    data = tmp_path / "data.csv"
    Dataset.from_list([{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(20)]).to_csv(data)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(ROOT / "recipes/replay_grpo.py"),
        "--model_name_or_path",
        model,
        "--dataset_path",
        str(data),
        "--output_dir",
        str(out),
        "--use_cpu",
        "--bf16",
        "false",
        "--report_to",
        "none",
        "--logging_steps",
        "1",
        "--max_completion_length",
        "6",
        "--max_steps",
        "3",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "2",
        "--replay_start_ratio",
        "0",
        "--lenient_parsing",
        "--use_peft",
        "--lora_r",
        "4",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        "--save_strategy",
        "steps",
        "--save_steps",
        "3",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("metrics.json", "learning_curves.png", "adapter_model.safetensors", "checkpoint-3/replay_state.json"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert [s["step"] for s in metrics["steps"]] == [1, 2, 3]
    assert all("buffer_trajectories" in s and s["accuracy"] is not None for s in metrics["steps"])
    assert "buffer:" in proc.stdout
    card = (out / "README.md").read_text()  # ours, not PEFT's generic one
    assert "library_name: peft" in card and "- exgrpo" in card and "@article{zhan2025exgrpo" in card
    assert f"fine-tuned version of the local checkpoint `{model}`" in card
    assert "Training data: the local file `data.csv`." in card and "| replay buffer trajectories |" in card


@pytest.mark.parametrize(
    "flag, value",
    [("warmup_samples", -1), ("warmup_learning_rate", 0.0), ("warmup_epochs", 0.0), ("warmup_batch_size", 0)],
)
def test_warmup_flags_are_validated(flag, value):
    with pytest.raises(ValueError, match=f"--{flag} must"):
        RLCRScriptArguments(**{flag: value})


def test_warmup_needs_rows_left_for_rl():
    train = graded_arithmetic(5, seed=0)
    args = RLCRScriptArguments(warmup_samples=5)
    with pytest.raises(ValueError, match="--warmup_samples 5 leaves no rows"):
        warm_up("unused", train, args, None)


@pytest.mark.slow
def test_rlcr_recipe_with_a_format_warmup(tmp_path):
    """The warm-up is built from the first training rows, RL starts from it, and the report shows the base model,
    the warmed-up model (before RL) and the trained one."""
    model = tiny_checkpoint(tmp_path / "tiny")
    data = tmp_path / "data.jsonl"
    Dataset.from_list([{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(16)]).to_json(data)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(ROOT / "recipes/rlcr.py"),
        "--model_name_or_path",
        model,
        "--dataset_path",
        str(data),
        "--num_eval_samples",
        "4",
        "--output_dir",
        str(out),
        "--use_cpu",
        "--bf16",
        "false",
        "--report_to",
        "none",
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "2",
        "--num_generations_confidence",
        "2",
        "--max_completion_length",
        "8",
        "--max_confidence_length",
        "6",
        "--warmup_samples",
        "6",
        "--warmup_batch_size",
        "4",
        "--save_strategy",
        "no",
    ]
    env = {**os.environ, "TRL_EXT_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"warmup", "base", "before", "after", "seconds"} <= set(metrics)
    warmup = metrics["warmup"]
    assert warmup["rows"] == 6 and warmup["examples"] == 12
    assert Path(warmup["model"]).parent == tmp_path / "cache" / "warmup"
    assert (Path(warmup["model"]) / "model.safetensors").is_file()
    assert (out / "eval_base.jsonl").is_file() and (out / "reliability_base.png").is_file()
    # RL trains on the rows after the warm-up's: 16 rows - 4 held out - 6 warm-up = 6 prompts, 1 step of 2 prompts
    assert sum("answer/accuracy" in log for log in metrics["train_log"]) == 1
    assert "before RL (after the format warm-up)" in proc.stdout and "report and plots in" in proc.stdout
    assert "reliability_before_after.png: reliability diagrams before and after RL" in proc.stdout
    card = (out / "README.md").read_text()
    assert f"the local checkpoint `{warmup['model']}`" in card  # the tiny base has no Hub name


def test_main_process_evaluation_is_skipped_when_parameters_are_sharded():
    """A forward on the main process alone would wait for ever in ZeRO-3's or FSDP's parameter gathers."""
    from types import SimpleNamespace

    def trainer(fsdp=False, stage=None):
        plugin = SimpleNamespace(zero_stage=stage)
        return SimpleNamespace(
            is_fsdp_enabled=fsdp,
            is_deepspeed_enabled=stage is not None,
            accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)),
        )

    assert parameters_sharded(trainer(fsdp=True)) and parameters_sharded(trainer(stage=3))
    assert not parameters_sharded(trainer()) and not parameters_sharded(trainer(stage=2))


def test_rows_held_out_of_a_users_file_are_announced(tmp_path, caplog):
    path = tmp_path / "mine.jsonl"
    Dataset.from_list(ROWS).to_json(path)
    args = RecipeScriptArguments(dataset_path=str(path), question_column="q", answer_column="a", num_eval_samples=64)
    with caplog.at_level("WARNING", logger="trl_ext.recipe.data"):
        train, evaluation = load_recipe_dataset(args, None)
    assert len(train) == 8 and len(evaluation) == 2
    message = caplog.text
    assert f"Held out the last 2 of the 10 rows of {path}" in message and "capped at a fifth" in message
    assert "--dataset_test_split" in message and "--num_eval_samples 0" in message
    caplog.clear()
    args.eval_only = True  # the same rows, said as what they are for
    with caplog.at_level("WARNING", logger="trl_ext.recipe.data"):
        load_recipe_dataset(args, None)
    assert f"Evaluating the last 2 of the 10 rows of {path}" in caplog.text and "not trained on" not in caplog.text
    caplog.clear()
    args.eval_only = False
    args.num_eval_samples = 0
    with caplog.at_level("WARNING", logger="trl_ext.recipe.data"):
        train, evaluation = load_recipe_dataset(args, None)
    assert len(train) == 10 and evaluation is None and "Held out" not in caplog.text
