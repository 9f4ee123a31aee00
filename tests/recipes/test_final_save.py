"""The recipes' final save: atomic (written aside, then renamed into place), a failure keeps the last checkpoint and
names it; the CPU configs keep one checkpoint."""

import errno
from pathlib import Path

import pytest
import yaml
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from trl_ext.recipe import FINAL_STAGING, save_final_model
from trl_ext.testing import cpu_test_args, tiny_causal_lm


ROOT = Path(__file__).resolve().parents[2]


def trainer_for(output_dir):
    model, tokenizer = tiny_causal_lm()
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 4)
    return GRPOTrainer(
        model,
        lambda completions, **kw: [0.0] * len(completions),
        args=cpu_test_args(output_dir, GRPOConfig),
        train_dataset=data,
        processing_class=tokenizer,
    )


def test_final_model_is_renamed_into_place(tmp_path):
    trainer = trainer_for(tmp_path)
    save_final_model(trainer, tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in tmp_path.iterdir()}
    assert not (tmp_path / FINAL_STAGING).exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.hidden_size == trainer.model.config.hidden_size


@pytest.mark.parametrize("with_checkpoint", [True, False])
def test_failed_final_save_replaces_nothing_and_names_the_last_checkpoint(tmp_path, monkeypatch, with_checkpoint):
    trainer = trainer_for(tmp_path)
    (tmp_path / "config.json").write_text("previous run")
    if with_checkpoint:
        (tmp_path / "checkpoint-4").mkdir()
        (tmp_path / "checkpoint-4" / "model.safetensors").write_text("weights")
        (tmp_path / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    (tmp_path / "checkpoint-5").mkdir()  # a save killed while writing trainer_state.json: not named
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text('{"global_st')
    real_save = trainer.model.save_pretrained

    def disk_fills_after_config(directory, **kwargs):
        real_save(directory, **kwargs)  # config.json and the weights are written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer.model, "save_pretrained", disk_fills_after_config)
    expected = (
        r"the trained weights are in the last checkpoint, .*checkpoint-4 \(load it"
        if with_checkpoint
        else r"no checkpoint was saved \(set save_strategy and save_steps to keep one\)"
    )
    with pytest.raises(
        RuntimeError,
        match=r"Saving the final model to .* failed \(OSError: .*No space left on "
        rf"device\); nothing there was replaced and {expected}",
    ):
        save_final_model(trainer, tmp_path)
    assert (tmp_path / "config.json").read_text() == "previous run"
    assert not (tmp_path / "model.safetensors").exists() and not (tmp_path / FINAL_STAGING).exists()
    if with_checkpoint:
        assert (tmp_path / "checkpoint-4" / "model.safetensors").read_text() == "weights"


@pytest.mark.parametrize("path", sorted((ROOT / "recipes/configs").glob("*_cpu.yaml")), ids=lambda p: p.stem)
def test_cpu_configs_keep_one_checkpoint(path):
    config = yaml.safe_load(path.read_text())
    assert config["save_strategy"] == "steps" and config["save_total_limit"] == 1
    assert config["max_steps"] % config["save_steps"] == 0  # the last step is saved
