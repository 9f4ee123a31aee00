"""Model cards: TRL's card with the trainer's tags, paper and citation, the real base model, the data and the results;
for full and LoRA runs, written by the recipes and pushed unchanged by `push_to_hub`."""

import json
import shutil
from pathlib import Path

import pytest
from datasets import Dataset
from huggingface_hub import ModelCard
from peft import LoraConfig

from trl_ext import (
    DEFAULT_MODEL_NAME,
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)
from trl_ext.models.cache import COMPLETE_MARKER
from trl_ext.models.default_model import default_model_path, embedded_model_name
from trl_ext.models.naming import resolve_base_model
from trl_ext.rewards import make_accuracy_reward
from trl_ext.testing import cpu_test_args, tiny_checkpoint
from trl_ext.trainers.seams.model_card import results_table


def _dataset(n=8):
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i}+1?"}], "solution": str(i + 1)} for i in range(n)]
    )


def test_base_model_of_hub_ids_and_local_checkpoints(tmp_path):
    assert resolve_base_model("Qwen/Qwen2.5-1.5B-Instruct") == ("Qwen/Qwen2.5-1.5B-Instruct", None)
    assert resolve_base_model(None) == (None, None)
    default = default_model_path()
    assert resolve_base_model(default) == (DEFAULT_MODEL_NAME, default)  # the embedded default's real name

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": default}))
    assert resolve_base_model(str(adapter)) == (DEFAULT_MODEL_NAME, str(adapter))

    previous_run = tmp_path / "run"
    previous_run.mkdir()
    (previous_run / "README.md").write_text("---\nbase_model: org/base\n---\n# card\n")
    assert resolve_base_model(str(previous_run)) == ("org/base", str(previous_run))

    unknown = tiny_checkpoint(tmp_path / "tiny")
    assert resolve_base_model(unknown) == (None, unknown)


def test_results_table():
    table = results_table({"ECE (after)": 0.12345, "AUROC (after)": None, "ECE (before)": float("nan"), "n": 3})
    assert table.startswith(
        "| metric | value |\n| --- | --- |\n| ECE (after) | 0.123 |\n| AUROC (after) | n/a |\n| ECE (before) | n/a |\n"
        "| n | 3 |\n\nn/a: not measured"
    )
    assert "nan" not in table  # one way to say "not measured"


@pytest.mark.slow
def test_full_run_card_names_the_embedded_default_and_the_paper(tmp_path):
    args = cpu_test_args(
        tmp_path / "out",
        ReplayGRPOConfig,
        max_steps=1,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=4,
        activation_checkpointing=False,
    )
    trainer = ReplayGRPOTrainer(
        model=default_model_path(), reward_funcs=[make_accuracy_reward()], args=args, train_dataset=_dataset()
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    trainer.set_model_card_details(dataset_description="built-in arithmetic", results={"accuracy": 0.25})
    trainer.create_model_card()

    card = ModelCard.load(Path(args.output_dir) / "README.md")
    assert card.data.base_model == DEFAULT_MODEL_NAME
    assert {"trl", "grpo", "trl-ext", "experience-replay", "exgrpo"} <= set(card.data.tags)
    assert f"fine-tuned version of [{DEFAULT_MODEL_NAME}](https://huggingface.co/{DEFAULT_MODEL_NAME})" in card.text
    assert "@article{zhan2025exgrpo" in card.text and "https://huggingface.co/papers/2510.02245" in card.text
    assert "Training data: built-in arithmetic." in card.text and "| accuracy | 0.250 |" in card.text
    assert "None" not in card.text


def _lora_trainer(tmp_path, base=None, **overrides):
    args = cpu_test_args(
        tmp_path / "out",
        RLCRMultiTurnConfig,
        max_steps=1,
        num_generations=2,
        num_generations_confidence=2,
        per_device_train_batch_size=2,
        max_completion_length=4,
        max_confidence_length=4,
        **overrides,
    )
    return RLCRMultiTurnTrainer(
        model=base or tiny_checkpoint(tmp_path / "tiny"),
        args=args,
        train_dataset=_dataset(),
        peft_config=LoraConfig(r=4, target_modules=["q_proj"]),
    )


def test_lora_run_card_replaces_peft_generic_card(tmp_path):
    trainer = _lora_trainer(tmp_path)
    trainer.train()
    trainer.save_model(trainer.args.output_dir)  # PEFT writes its generic card here
    trainer.set_model_card_details(dataset_name="openai/gsm8k", results={"ECE (before)": 0.3, "ECE (after)": 0.1})
    trainer.create_model_card()

    card = ModelCard.load(Path(trainer.args.output_dir) / "README.md")
    assert card.data.library_name == "peft"
    assert {"trl-ext", "rlcr", "calibration", "lora"} <= set(card.data.tags)
    assert card.data.datasets == "openai/gsm8k"
    assert "@article{damani2025beyond" in card.text and "https://huggingface.co/papers/2507.16806" in card.text
    local = str(tmp_path / "tiny")
    assert f"fine-tuned version of the local checkpoint `{local}`" in card.text and "None" not in card.text
    assert "| ECE (after) | 0.100 |" in card.text and "- PEFT: " in card.text
    # how to ask the trained model for its confidence: the training's confidence prompt as the next user turn
    usage = card.text[card.text.index("## Asking for the confidence") :]
    assert repr(trainer.args.confidence_prompt) in usage and "<confidence>(.*?)</confidence>" in usage
    assert f'pipeline("text-generation", model="{trainer.args.output_dir}")' in usage


def test_lora_card_on_a_local_base_with_a_hub_name_names_it(tmp_path):
    """A local base that the embedded default's build marker identifies: the card and PEFT's tag name its Hub id."""
    base = tiny_checkpoint(tmp_path / "tiny")
    # The build's completion marker, copied from the real build: the tiny checkpoint now reads as that build.
    shutil.copy(Path(default_model_path()) / COMPLETE_MARKER, base)
    assert embedded_model_name(base) == DEFAULT_MODEL_NAME
    trainer = _lora_trainer(tmp_path, base=base)
    trainer.save_model(trainer.args.output_dir)  # PEFT's card, with the local path as base model
    trainer.create_model_card()

    card = ModelCard.load(Path(trainer.args.output_dir) / "README.md")
    assert card.data.base_model == DEFAULT_MODEL_NAME and card.data.library_name == "peft"
    assert {f"base_model:adapter:{DEFAULT_MODEL_NAME}", "lora", "rlcr"} <= set(card.data.tags)
    assert f"fine-tuned version of [{DEFAULT_MODEL_NAME}](https://huggingface.co/{DEFAULT_MODEL_NAME})" in card.text
    assert "It started from" not in card.text and "None" not in card.text  # the cache directory is no news


def test_card_of_a_run_after_the_format_warmup_names_the_base_and_the_warmup(tmp_path):
    """The warm-up's checkpoint (a cache directory) names its base in its card: the run's card names that base and
    says it started from a warm-up, not from the directory."""
    warmed = tiny_checkpoint(tmp_path / "warmed")
    (Path(warmed) / "README.md").write_text(
        "---\nbase_model: org/base\ntags:\n- trl-ext-format-warmup\n---\n# Format warm-up of org/base\n"
    )
    trainer = _lora_trainer(tmp_path, base=warmed)
    trainer.save_model(trainer.args.output_dir)
    trainer.create_model_card()
    card = ModelCard.load(Path(trainer.args.output_dir) / "README.md")
    assert card.data.base_model == "org/base" and "fine-tuned version of [org/base]" in card.text
    assert "It started from a short supervised warm-up of org/base on the output format" in card.text
    assert warmed not in card.text


def test_push_to_hub_pushes_the_recorded_card(tmp_path, monkeypatch):
    """`push_to_hub` goes through the same `create_model_card`: what is uploaded is the card with the results."""
    import transformers.trainer

    uploaded = {}

    class FakeApi:
        def upload_folder(self, folder_path, **kwargs):
            uploaded["card"] = (Path(folder_path) / "README.md").read_text()
            uploaded["repo_id"] = kwargs["repo_id"]

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: FakeApi())
    trainer = _lora_trainer(tmp_path, hub_model_id="someone/rlcr-tiny")
    trainer.hub_model_id = "someone/rlcr-tiny"  # as `init_hf_repo` sets it (without the Hub call)
    trainer.set_model_card_details(dataset_description="the local file `data.jsonl`", results={"ECE (after)": 0.1})
    trainer.push_to_hub()

    card = ModelCard(uploaded["card"])
    assert uploaded["repo_id"] == "someone/rlcr-tiny" and card.data.model_name == "rlcr-tiny"
    assert card.data.library_name == "peft" and "rlcr" in card.data.tags
    assert "Training data: the local file `data.jsonl`." in card.text and "| ECE (after) | 0.100 |" in card.text
    assert 'model="someone/rlcr-tiny"' in card.text and "@article{damani2025beyond" in card.text
