"""A short supervised format warm-up with TRL's `SFTTrainer`, built once per distinct inputs and cached.

The RLCR paper trains its SFT+RLCR variant from a model that has first seen the answer/confidence format in a short
supervised stage. A small model needs it even more: the embedded 135M default rarely closes a tag or states a
number on its own, so RL would spend its budget on format. [`format_warmup`] fine-tunes a base model on
prompt-completion examples (only the completions are trained) and caches the result like the embedded default's
conversion (see [`~trl_ext.models.cache`]): keyed by the base model, the examples and the hyperparameters, built under a
file lock, renamed into place when complete. Changing any input builds a new checkpoint; the same inputs reuse it.

[`rlcr_format_examples`] writes such examples for RLCR from rows with a question and a gold answer: the answer turn
(`<answer>gold</answer>`) and the confidence turn after it (`<confidence>c</confidence>`), and optionally the
single-turn format (both in one reply). The stated confidences are drawn at random, independently of anything about
the question, so the warmed-up model can state a confidence but its confidences carry no information: calibration
is left to RL.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path

from .cache import build_once, cache_root


# Bump when the build below changes, so stale warm-ups are rebuilt instead of reused. (Not for changes to how the same
# updates are computed, such as recomputed activations or the CPU log-prob tiles: cached warm-ups stay valid, though a
# new build rounds differently, as one on another thread count does.)
_BUILD_FORMAT = 1
# Stated confidences of the warm-up examples: every tenth, drawn by one of these weightings, which never depend on
# the question or the answer. "weighted": by its value (mostly high, sometimes low), as instruction-tuned models state
# confidence; "uniform": each equally likely, so RL starts from spread confidences rather than a habit.
WARMUP_CONFIDENCES = tuple(round(0.1 * k, 1) for k in range(1, 11))
WARMUP_CONFIDENCE_WEIGHTS = {"weighted": WARMUP_CONFIDENCES, "uniform": (1.0,) * len(WARMUP_CONFIDENCES)}
# Tokens per tile of TRL's fused log-prob computation on CPU during the build (the trainers' default
# `cpu_logprob_tile_tokens`).
CPU_LOGPROB_TILE_TOKENS = 256


def rlcr_format_examples(
    rows: Sequence[dict],
    confidence_prompt: str,
    *,
    seed: int = 0,
    answer_tag: str = "answer",
    confidence_tag: str = "confidence",
    single_turn_system_prompt: str | None = None,
    confidence_draw: str = "weighted",
) -> list[dict]:
    """SFT examples (conversational `prompt` / `completion`) teaching RLCR's two-turn format on `rows`.

    Each row (a conversational `prompt` and its gold `solution`) gives two examples: the answer turn, completed by
    `<answer>solution</answer>`, and the confidence turn (the prompt, that answer as the assistant message, then
    `confidence_prompt`), completed by `<confidence>c</confidence>` with `c` drawn from `WARMUP_CONFIDENCES` by
    `WARMUP_CONFIDENCE_WEIGHTS[confidence_draw]` (seeded, independent of the row). With `single_turn_system_prompt`,
    each row also gives a single-turn example: the prompt under that system message, completed by the answer and the
    confidence in one reply (single-turn RLCR's format), with the same kind of draw.
    """
    if confidence_draw not in WARMUP_CONFIDENCE_WEIGHTS:
        raise ValueError(
            f"confidence_draw must be one of {list(WARMUP_CONFIDENCE_WEIGHTS)} (got {confidence_draw!r})."
        )
    weights = WARMUP_CONFIDENCE_WEIGHTS[confidence_draw]
    rng = random.Random(seed)

    def draw() -> str:
        value = rng.choices(WARMUP_CONFIDENCES, weights=weights)[0]
        return f"<{confidence_tag}>{value:g}</{confidence_tag}>"

    examples = []
    for row in rows:
        prompt = list(row["prompt"])
        answer = {"role": "assistant", "content": f"<{answer_tag}>{row['solution']}</{answer_tag}>"}
        examples.append({"prompt": prompt, "completion": [answer]})
        follow_up = [*prompt, answer, {"role": "user", "content": confidence_prompt}]
        examples.append({"prompt": follow_up, "completion": [{"role": "assistant", "content": draw()}]})
        if single_turn_system_prompt is not None:
            single = [
                {"role": "system", "content": single_turn_system_prompt},
                *(m for m in prompt if m["role"] != "system"),
            ]
            reply = answer["content"] + draw()
            examples.append({"prompt": single, "completion": [{"role": "assistant", "content": reply}]})
    return examples


def format_warmup(
    base_model: str,
    examples: Sequence[dict],
    *,
    learning_rate: float = 1e-4,
    num_train_epochs: float = 1.0,
    per_device_train_batch_size: int = 8,
    bf16: bool = False,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> str:
    """Return a checkpoint directory of `base_model` fine-tuned on `examples` with TRL's `SFTTrainer`, building it
    on first use.

    Args:
        base_model: A local checkpoint directory or a Hub id.
        examples: Conversational prompt-completion rows (`{"prompt": [...], "completion": [...]}`; the loss covers
            the completions only, TRL's `completion_only_loss`) or tokenized rows (`{"input_ids": [...], "labels":
            [...]}`, -100 on tokens outside the loss), as `SFTTrainer` reads them.
        learning_rate, num_train_epochs, per_device_train_batch_size, bf16, seed: The SFT run's settings
            (constant learning rate, no checkpoints, float32 weights, activations recomputed in the backward, and
            on CPU only the completions scored, in small tiles; `bf16` trains with bf16 autocast, faster on GPUs and
            CPUs with AMX, slower on the 2-core reference CPU: benchmarks/precision_bench.py).
        cache_dir: Parent directory of the built checkpoints. Defaults to `<cache_root>/warmup`.

    The build runs in a child process with no distributed environment: called from every rank of a `torchrun` or
    `accelerate launch` job, one rank builds as a single process while the others wait on the lock, and the job's own
    distributed state is not touched.

    The checkpoint is keyed by all of these (the base model by the contents of its config and the names, sizes and
    modification times of its weight files, or by Hub id and revision) and by the TRL and transformers versions.
    Concurrent callers build it once. Its `README.md` names the base model, so model cards of runs trained from it
    name the real base.

    Raises:
        FileNotFoundError: `base_model` is neither a checkpoint directory nor a model transformers can load.
        ValueError: `examples` is empty.
    """
    if not examples:
        raise ValueError("format_warmup needs at least one example.")
    # Typed, so the same settings give the same key however they were written (`1` in a YAML file, `1.0` in code).
    settings = {
        "learning_rate": float(learning_rate),
        "num_train_epochs": float(num_train_epochs),
        "per_device_train_batch_size": int(per_device_train_batch_size),
        "bf16": bool(bf16),
        "seed": int(seed),
    }
    key = _cache_key(_base_fingerprint(base_model), list(examples), settings)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "warmup"
    target = root / f"{_short_name(base_model)}-{key[:16]}"
    return build_once(
        target,
        lambda out: _train_in_child(base_model, list(examples), settings, out),
        marker=json.dumps({"base_model": base_model, "key": key, **settings}) + "\n",
        announce=f"trl-ext: format warm-up of {base_model} on {len(examples)} examples, saved in {target} (once)",
    )


def _short_name(base_model: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(str(base_model)).name)[:48] or "model"


def _base_fingerprint(base_model: str) -> dict:
    """What identifies the base model's weights without reading them (a 7B checkpoint takes minutes to hash)."""
    path = Path(base_model)
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise FileNotFoundError(
                f"format warm-up: {base_model} is not a model checkpoint (no config.json); pass the directory a "
                "model was saved to, or a Hub id."
            )
        weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin"))
        return {
            "config": hashlib.sha256(config.read_bytes()).hexdigest(),
            "weights": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in weights],
        }
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(base_model)
    except OSError as error:
        raise FileNotFoundError(
            f"format warm-up: the base model {base_model!r} was not found: it is not a local directory and "
            f"transformers could not load it from the Hub or its cache ({error}). Check the path or the model id."
        ) from None
    return {"hub_id": base_model, "commit": getattr(config, "_commit_hash", None)}


def _cache_key(base: dict, examples: list[dict], settings: dict) -> str:
    import transformers
    import trl

    payload = {
        "format": _BUILD_FORMAT,
        "base": base,
        "examples": examples,
        "settings": settings,
        "trl": trl.__version__,
        "transformers": transformers.__version__,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


# Variables through which torchrun and accelerate make a process one rank of a job.
_DISTRIBUTED_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


def _train_in_child(base_model: str, examples: list[dict], settings: dict, out: Path) -> None:
    """Run [`_train`] as `python -m trl_ext.models.warmup` without the job's distributed environment (its output shows)."""
    run_module_in_child(
        "trl_ext.models.warmup",
        {"base_model": base_model, "examples": examples, "settings": settings},
        out / ".warmup-spec.json",
        out,
        failure=f"format warm-up of {base_model} failed",
    )


def run_module_in_child(module: str, spec: dict, spec_file: Path, out: Path, *, failure: str) -> None:
    """Run `python -m module spec_file out` with `spec` written to `spec_file` (removed afterwards), without the
    job's distributed environment; its output shows. A failure raises `RuntimeError` starting with `failure`."""
    import subprocess
    import sys

    spec_file.write_text(json.dumps(spec))
    # The other ranks wait on the lock meanwhile, so the build may use every core: `accelerate launch` on CPU sets
    # OMP_NUM_THREADS=1 for the job's processes.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (*_DISTRIBUTED_ENV, "OMP_NUM_THREADS") and not k.startswith("ACCELERATE_")
    }
    try:
        subprocess.run([sys.executable, "-m", module, str(spec_file), str(out)], env=env, check=True)
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f"{failure} (exit status {error.returncode}); its output above says why.") from None
    finally:
        spec_file.unlink(missing_ok=True)


def load_for_inference(checkpoint: str, use_cpu: bool):
    """`(model, tokenizer)` of `checkpoint` in float32 and eval mode, on CUDA unless `use_cpu`: how a child build reads
    the first stage's checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() and not use_cpu else "cpu"
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to(device).eval()
    return model, AutoTokenizer.from_pretrained(checkpoint)


def cached_child_build(
    module: str,
    stage1: str,
    spec: dict,
    key_extra: dict,
    run_extra: dict,
    cache_name: str,
    announce: str,
    cache_dir: str | os.PathLike | None = None,
) -> str:
    """The folder `python -m module` builds from `spec` (its `_build(spec, out)`), built once and cached under
    `cache_name` (or `cache_dir`), keyed by `spec`, `key_extra` (e.g. a build-format number) and the fingerprint of
    the `stage1` checkpoint it reads; `run_extra` joins the spec without joining the key (where the build runs does
    not change what it builds). Built in a child process without the job's distributed environment: one rank
    builds, the others wait on the lock."""
    payload = {**key_extra, "base": _base_fingerprint(stage1), **spec}
    key = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
    root = Path(cache_dir) if cache_dir is not None else cache_root() / cache_name
    target = root / f"{_short_name(stage1)}-{key[:16]}"
    return build_once(
        target,
        lambda out: run_module_in_child(
            module, {**spec, **run_extra}, out / ".spec.json", out, failure=f"{module} from {stage1} failed"
        ),
        marker=json.dumps({"stage1": str(stage1), "key": key}) + "\n",
        announce=f"{announce}, saved in {target} (once)",
    )


def _train(base_model: str, examples: list[dict], settings: dict, out: Path) -> None:
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from .logprob_tiles import cpu_logprob_tiles

    tokenizer = AutoTokenizer.from_pretrained(base_model)
    # float32 weights: the warm-up's small updates would partly round away in a bf16 copy.
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as scratch:
        args = SFTConfig(
            output_dir=scratch,
            seed=settings["seed"],
            learning_rate=settings["learning_rate"],
            num_train_epochs=settings["num_train_epochs"],
            per_device_train_batch_size=settings["per_device_train_batch_size"],
            lr_scheduler_type="constant",
            save_strategy="no",
            report_to="none",
            logging_steps=10,
            use_cpu=not torch.cuda.is_available(),
            bf16=settings["bf16"],
            max_length=None,
            # Recompute activations in the backward: the workspace warm-up's 900-token episodes otherwise keep
            # about 1 GB of them (the same updates; about 8% more time on CPU).
            activation_checkpointing=True,
        )
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=Dataset.from_list(examples), processing_class=tokenizer
        )
        # SFTTrainer's loss goes through TRL's fused LM head, as GRPOTrainer's does: on CPU it would score every
        # position (the prompt and the tool result, most of a workspace episode) in 4096-token tiles whose backward
        # holds gigabytes of temporaries. The trainers' CPU tiles give the same values (models/logprob_tiles.py).
        with cpu_logprob_tiles(CPU_LOGPROB_TILE_TOKENS, trainer.accelerator.device):
            trainer.train()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _write_card(base_model, len(examples), settings, out)


def _write_card(base_model: str, num_examples: int, settings: dict, out: Path) -> None:
    """A model card naming the real base model, which the trainers' cards read back (`resolve_base_model`)."""
    from huggingface_hub import ModelCard, ModelCardData

    from .naming import resolve_base_model

    base = resolve_base_model(base_model)[0]
    data = ModelCardData(base_model=base, library_name="transformers", tags=["trl", "sft", "trl-ext-format-warmup"])
    text = (
        f"# Format warm-up of {base or base_model}\n\nSupervised fine-tuning with TRL's `SFTTrainer` on "
        f"{num_examples} prompt-completion examples of an output format "
        f"(`trl_ext.models.warmup.format_warmup`; settings: {json.dumps(settings)}).\n"
    )
    ModelCard(f"---\n{data.to_yaml()}\n---\n\n{text}").save(out / "README.md")


if __name__ == "__main__":  # the child process of `_train_in_child`
    import sys

    _spec = json.loads(Path(sys.argv[1]).read_text())
    _train(_spec["base_model"], _spec["examples"], _spec["settings"], Path(sys.argv[2]))
