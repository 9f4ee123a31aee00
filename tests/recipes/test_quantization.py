"""`--load_in_4bit` / `--load_in_8bit`: TRL's quantization config passed to the trainer on a CUDA machine with
bitsandbytes, else an error naming bitsandbytes and the device; never ignored."""

import importlib.util
import types

import pytest
import torch
from transformers import BitsAndBytesConfig
from trl import ModelConfig

from trl_ext.recipe import rlcr
from trl_ext.recipe.cli import quantization_config


def args(use_cpu):
    return types.SimpleNamespace(use_cpu=use_cpu)


def test_no_flag_no_config():
    assert quantization_config(ModelConfig(), args(use_cpu=False)) is None


def test_refused_on_cpu_naming_bitsandbytes_and_the_device(monkeypatch):
    with pytest.raises(ValueError, match=r"--load_in_4bit: bitsandbytes .* the run is on CPU \(--use_cpu\)"):
        quantization_config(ModelConfig(load_in_4bit=True), args(use_cpu=True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--load_in_8bit: bitsandbytes .* this machine has no CUDA GPU"):
        quantization_config(ModelConfig(load_in_8bit=True), args(use_cpu=False))


def test_refused_without_bitsandbytes_on_a_cuda_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name))
    with pytest.raises(ValueError, match=r"--load_in_4bit needs bitsandbytes, .* \(CUDA device NVIDIA H100\)"):
        quantization_config(ModelConfig(load_in_4bit=True), args(use_cpu=False))


def test_trls_config_on_a_cuda_machine_with_bitsandbytes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "bitsandbytes" else real(name)
    )
    config = quantization_config(
        ModelConfig(load_in_4bit=True, dtype="bfloat16", bnb_4bit_quant_type="nf4"), args(use_cpu=False)
    )
    assert isinstance(config, BitsAndBytesConfig) and config.load_in_4bit and config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_compute_dtype == torch.bfloat16


def test_the_recipe_stops_before_training(tmp_path, monkeypatch):
    """`--use_peft --load_in_4bit` on a CPU machine exits with the error instead of training LoRA in full precision."""
    from trl_ext.testing import tiny_checkpoint

    model = tiny_checkpoint(tmp_path / "tiny")
    argv = ["--model_name_or_path", model, "--use_peft", "--load_in_4bit", "--output_dir", str(tmp_path / "out")]
    argv += ["--use_cpu", "true", "--bf16", "false", "--max_steps", "1", "--report_to", "none"]
    argv += ["--per_device_train_batch_size", "2", "--num_generations", "2", "--num_eval_samples", "0"]
    with pytest.raises(ValueError, match="bitsandbytes"):
        rlcr.run(argv)
    assert not (tmp_path / "out" / "adapter_config.json").exists()
