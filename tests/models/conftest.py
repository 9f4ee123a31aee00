"""Fixtures of the two-stage warm-up tests (agreement, answer probability): a tiny model that writes only digits, and
the recipe's warm-up with its SFT replaced by a copy of that model."""

import shutil
from types import SimpleNamespace

import pytest


CONF = "How sure are you?"


def write_digit_checkpoint(directory) -> str:
    """A tiny random model that writes only digits: its output head scores the ten digit tokens (others 0), large
    enough that its samples often agree, so lenient parsing finds answers."""
    import torch

    from trl_ext.testing import tiny_causal_lm

    model, tokenizer = tiny_causal_lm(seed=0)
    digits = tokenizer.convert_tokens_to_ids(list("0123456789"))
    head = torch.zeros_like(model.lm_head.weight)
    torch.manual_seed(1)
    head[digits] = 20 * torch.randn(len(digits), head.size(1))
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture
def digit_checkpoint(tmp_path):
    """`make(name)`: a digit checkpoint saved under `tmp_path / name`, its path."""
    return lambda name="digits": write_digit_checkpoint(tmp_path / name)


@pytest.fixture
def recipe_warmup(tmp_path, monkeypatch):
    """The RLCR recipe's warm-up with every SFT build replaced by a copy of the digit model (`trained` records each
    build's base and examples), its cache under `tmp_path`, `base` a copy of the digit model, the training arguments
    the warm-up reads, and `rows(n)`: a training set of `n` rows "What is i + i?" with their gold answers."""
    from datasets import Dataset

    from trl_ext.models import warmup

    digits = write_digit_checkpoint(tmp_path / "digits")
    trained = []

    def fake_train(base, examples, settings, out):  # a "trained" checkpoint: the digit model, whatever the base
        trained.append((base, examples))
        shutil.copytree(digits, out, dirs_exist_ok=True)

    monkeypatch.setattr(warmup, "_train_in_child", fake_train)
    monkeypatch.setenv("TRL_EXT_CACHE", str(tmp_path / "cache"))
    base = str(tmp_path / "base")
    shutil.copytree(digits, base)
    training_args = SimpleNamespace(
        confidence_prompt=CONF,
        seed=3,
        answer_tag="answer",
        confidence_tag="confidence",
        solution_column="solution",
        max_completion_length=3,
        lenient_parsing=True,
        chat_template_kwargs=None,
        use_cpu=True,
        bf16=False,
    )
    return SimpleNamespace(
        trained=trained,
        base=base,
        training_args=training_args,
        rows=lambda n: Dataset.from_list(
            [
                {"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "solution": str(2 * i)}
                for i in range(n)
            ]
        ),
    )
