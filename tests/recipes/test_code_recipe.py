"""recipes/absolute_zero.py with the code family end to end: a tiny model whose generation is scripted (programs,
inputs and answers of tests/scripts/absolute_zero_code_ranks.py; held-out answers right on deduction, wrong on
abduction), checked in the real sandbox; and the code configs."""

import json
from pathlib import Path

import pytest
import yaml

from trl_ext.recipe import absolute_zero
from trl_ext.recipe.absolute_zero import AbsoluteZeroScriptArguments, build_task
from trl_ext.self_play import code_reasoning_task
from trl_ext.self_play.code_reasoning import ZERO_TRIPLET
from trl_ext.testing import ScriptedGeneration, load_script, tiny_checkpoint
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


ROOT = Path(__file__).parents[2]
CPU_CONFIG = ROOT / "recipes/configs/absolute_zero_code_smollm2_cpu.yaml"
GPU_CONFIG = ROOT / "recipes/configs/absolute_zero_code_qwen2.5_coder.yaml"


def heldout_answers(questions):
    """A solver that gives the gold output of every deduction task and `None` as every abduction input (on which
    each held-out program raises)."""

    def script(prompt):
        if "What does this Python function return" not in prompt:
            return "```input\nNone\n```"
        (task,) = [
            q
            for q in questions
            if q["task_type"] == "deduction" and q["program"] in prompt and f"```input\n{q['input']}\n```" in prompt
        ]
        return f"```output\n{task['output']}\n```"

    return script


@pytest.mark.slow
def test_code_self_play_end_to_end(tmp_path, monkeypatch, capsys):
    from trl import ModelConfig, TrlParser

    scenario = load_script(ROOT / "tests/scripts/absolute_zero_code_ranks.py")
    questions = code_reasoning_task().heldout_questions(None, 42)  # the config's seed

    heldout = heldout_answers(questions)

    def script(prompt_text, k):  # the held-out evaluation goes through the trainer's generation too
        if any(q["program"] in prompt_text for q in questions):
            return heldout(prompt_text)
        return scenario.script(prompt_text, k)

    class ScriptedTrainer(AbsoluteZeroTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            ScriptedGeneration(self, script).__enter__()

    monkeypatch.setattr(absolute_zero, "AbsoluteZeroTrainer", ScriptedTrainer)
    out = tmp_path / "out"
    # 48 solver tokens hold every held-out answer (the scripted self-play completions do not depend on it).
    argv = [
        "--config",
        str(CPU_CONFIG),
        "--model_name_or_path",
        tiny_checkpoint(tmp_path / "tiny"),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--max_question_length",
        "8",
        "--max_completion_length",
        "48",
    ]
    parser = TrlParser((AbsoluteZeroScriptArguments, AbsoluteZeroConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    training_args.disable_tqdm = True
    absolute_zero.main(script_args, training_args, model_args)

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
    card = (out / "README.md").read_text()
    assert "solver accuracy (mean over steps)" in card

    # Held out: the 24 built-in tasks before and after, each deduction right and each abduction wrong by execution.
    assert (out / "heldout_accuracy.png").is_file()
    for when in ("before", "after"):
        report = json.loads((out / f"heldout_{when}.json").read_text())
        rows = report.pop("rows")
        assert [row["question"] for row in rows] == questions
        assert [row["score"] for row in rows] == [float(q["task_type"] == "deduction") for q in questions]
        assert (
            report
            == metrics["heldout"][when]
            == {
                "accuracy": 0.5,
                "num_questions": 24,
                "reward": "code_correct",
                "breakdown": "task_type",
                "by_group": {"abduction": 0.0, "deduction": 1.0},
                "counts": {"abduction": 12, "deduction": 12},
            }
        )
        assert f"| held-out accuracy, task_type deduction ({when}) | 1.000 |" in card
    printed = capsys.readouterr().out
    assert "held-out solver accuracy (24 questions, greedy, code_correct): before 0.500 -> after 0.500" in printed
    assert "task_type deduction (n=12): 1.000 -> 1.000" in printed


def test_code_configs():
    cpu = yaml.safe_load(CPU_CONFIG.read_text())
    assert cpu["use_cpu"] and cpu["max_steps"] <= 10 and "model_name_or_path" not in cpu and cpu["task"] == "code"
    assert cpu["heldout_size"] == 24  # the whole built-in set
    gpu = yaml.safe_load(GPU_CONFIG.read_text())
    assert gpu["model_name_or_path"].startswith("Qwen/Qwen2.5-Coder") and gpu["task"] == "code"
    assert gpu["use_vllm"] and gpu["vllm_mode"] == "server"


def test_code_switch(tmp_path):
    from trl import ModelConfig, TrlParser

    parser = TrlParser((AbsoluteZeroScriptArguments, AbsoluteZeroConfig, ModelConfig))
    args, _, _ = parser.parse_args_and_config(
        args=[
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "--bf16",
            "false",
            "--task",
            "code",
            "--num_references",
            "3",
            "--sandbox_timeout_s",
            "2",
        ]
    )
    task = build_task(args)
    assert task.name == "code" and task.state.num_references == 3 and task.state.limits["timeout_s"] == 2
