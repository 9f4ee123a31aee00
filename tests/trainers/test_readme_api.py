"""The README's Python API example for RLCR runs as written, on the tiny model: plain-text prompts, the exported
answer format, the config and trainer calls. Only the model id, the output directory and the run's size change (one
step, short replies, CPU)."""

import re
from pathlib import Path

import pytest

import trl_ext
from trl_ext.testing import tiny_checkpoint
from trl_ext.trainers import RLCRMultiTurnConfig


README = Path(__file__).parents[2] / "README.md"


def readme_example(section: str) -> str:
    text = README.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    return code


def test_plain_text_prompts_become_user_messages():
    from datasets import Dataset

    from trl_ext.trainers.seams.init_checks import user_message_prompts

    converted = user_message_prompts(Dataset.from_list([{"prompt": "What is 1 + 1?", "solution": "2"}]))
    assert converted[0] == {"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "solution": "2"}
    conversation = [{"prompt": [{"role": "user", "content": "Hi"}]}]
    assert user_message_prompts(conversation) is conversation
    streamed = user_message_prompts({"test": Dataset.from_list([{"prompt": "Hi"}]).to_iterable_dataset()})
    assert next(iter(streamed["test"]))["prompt"] == [{"role": "user", "content": "Hi"}]


def test_answer_format_is_exported():
    from trl_ext.data.graded_arithmetic import ANSWER_FORMAT

    assert trl_ext.ANSWER_FORMAT == ANSWER_FORMAT and "<answer>" in ANSWER_FORMAT


def test_the_rlcr_example_runs(tmp_path, monkeypatch):
    code = readme_example("RLCRMultiTurnTrainer")
    model_id = "Qwen/Qwen2.5-1.5B-Instruct"
    assert model_id in code and 'output_dir="rlcr-out"' in code
    code = code.replace(model_id, tiny_checkpoint(tmp_path / "model")).replace("rlcr-out", str(tmp_path / "out"))

    def small_run(**kwargs):  # the example's settings, on a run sized for a test
        for name in ("max_completion_length", "max_confidence_length"):
            assert name in kwargs  # the example sets both lengths
        return RLCRMultiTurnConfig(
            **{
                **kwargs,
                "max_completion_length": 16,
                "max_confidence_length": 8,
                "max_steps": 1,
                "use_cpu": True,
                "report_to": "none",
                "logging_steps": 1,
                "disable_tqdm": True,
            }
        )

    monkeypatch.setattr(trl_ext, "RLCRMultiTurnConfig", small_run)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1
    (log,) = [log for log in trainer.state.log_history if "loss" in log]
    assert "answer/accuracy" in log and "confidence/parse_fail_rate" in log
    assert trainer.train_dataset[0]["prompt"][0]["role"] == "user"  # the plain-text prompt became a user message


@pytest.mark.parametrize("section", ["ReplayGRPOTrainer", "AbsoluteZeroTrainer"])
def test_the_other_examples_name_the_exported_api(section):
    code = readme_example(section)
    for name in re.findall(r"from trl_ext import (.*)", code)[0].split(","):
        assert hasattr(trl_ext, name.strip())
