"""The format warm-up: SFT examples of RLCR's format, and the cached SFTTrainer build."""

import subprocess
import sys
import textwrap

import pytest
from safetensors.torch import load_file

from trl_ext.models.cache import COMPLETE_MARKER
from trl_ext.models.naming import resolve_base_model
from trl_ext.models.warmup import WARMUP_CONFIDENCES, format_warmup, rlcr_format_examples
from trl_ext.testing import tiny_checkpoint


CONF = "How sure are you?"
ROWS = [
    {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 1 + 2?"}], "solution": "3"},
    {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 4 * 5?"}], "solution": "20"},
]


def _confidence(example):
    text = example["completion"][0]["content"]
    assert text.startswith("<confidence>") and text.endswith("</confidence>")
    return float(text[len("<confidence>") : -len("</confidence>")])


def test_rlcr_format_examples_teach_both_turns():
    examples = rlcr_format_examples(ROWS, CONF, seed=3)
    assert len(examples) == 4
    answer, confidence = examples[0], examples[1]
    assert answer == {
        "prompt": ROWS[0]["prompt"],
        "completion": [{"role": "assistant", "content": "<answer>3</answer>"}],
    }
    assert confidence["prompt"] == [
        *ROWS[0]["prompt"],
        {"role": "assistant", "content": "<answer>3</answer>"},
        {"role": "user", "content": CONF},
    ]
    assert _confidence(confidence) in WARMUP_CONFIDENCES
    assert examples[2]["completion"][0]["content"] == "<answer>20</answer>"


def test_warmup_confidences_do_not_depend_on_the_rows():
    """The stated confidences carry no information about the question: the same draws for any rows."""
    many = [dict(ROWS[i % 2], solution=str(i)) for i in range(200)]
    other = [dict(ROWS[(i + 1) % 2], solution=str(7 * i)) for i in range(200)]
    draws = [_confidence(e) for e in rlcr_format_examples(many, CONF, seed=0)[1::2]]
    assert draws == [_confidence(e) for e in rlcr_format_examples(other, CONF, seed=0)[1::2]]
    assert draws != [_confidence(e) for e in rlcr_format_examples(many, CONF, seed=1)[1::2]]
    assert len(set(draws)) >= 8  # the whole range is stated, so RL has confidences to choose among
    assert sum(draws) / len(draws) > 0.6  # mostly high, as instruction-tuned models state confidence


def test_single_turn_examples_share_the_draws_kind():
    examples = rlcr_format_examples(ROWS, CONF, seed=0, single_turn_system_prompt="ONE")
    assert len(examples) == 6
    single = examples[2]
    assert single["prompt"] == [{"role": "system", "content": "ONE"}, ROWS[0]["prompt"][1]]
    reply = single["completion"][0]["content"]
    assert reply.startswith("<answer>3</answer><confidence>") and reply.endswith("</confidence>")


EXAMPLES = rlcr_format_examples(ROWS, CONF, seed=0)


@pytest.mark.slow
def test_format_warmup_trains_caches_and_names_its_base(tmp_path, monkeypatch):
    # As one rank of a 2-process job: the build must run as a single process, not wait for a second rank.
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",
    }.items():
        monkeypatch.setenv(name, value)
    base = tiny_checkpoint(tmp_path / "base")
    cache = tmp_path / "cache"
    path = format_warmup(base, EXAMPLES, learning_rate=1e-2, per_device_train_batch_size=2, cache_dir=cache)
    assert (cache / path.split("/")[-1] / COMPLETE_MARKER).is_file()
    before, after = load_file(f"{base}/model.safetensors"), load_file(f"{path}/model.safetensors")
    assert any(not before[k].equal(after[k].to(before[k].dtype)) for k in before)  # it trained
    assert resolve_base_model(path)[1] == path
    assert "Format warm-up" in (tmp_path / "cache" / path.split("/")[-1] / "README.md").read_text()

    # Same inputs: the cached checkpoint, not a second build (a build would rewrite the weights file).
    mtime = (tmp_path / "cache").joinpath(path.split("/")[-1], "model.safetensors").stat().st_mtime_ns
    again = format_warmup(base, EXAMPLES, learning_rate=1e-2, per_device_train_batch_size=2, cache_dir=cache)
    assert again == path
    assert (tmp_path / "cache").joinpath(path.split("/")[-1], "model.safetensors").stat().st_mtime_ns == mtime


def test_the_build_scores_only_completions_in_small_cpu_tiles(tmp_path, monkeypatch):
    """SFTTrainer's loss goes through TRL's fused LM head: on CPU the build scores only the labelled positions, in
    the trainers' small tiles (TRL's own 4096-token tiles held gigabytes in the backward of a workspace warm-up)."""
    import torch
    import trl.kernels.chunked_logprob as chunked_logprob
    import trl.trainer.utils as trl_utils

    from trl_ext.models import warmup

    scored = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def recording(hidden_states, weight, bias, labels, *args):
        scored.append((hidden_states.size(0), chunked_logprob.TOKEN_CHUNK_SIZE))
        return apply(hidden_states, weight, bias, labels, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", recording)
    settings = {"learning_rate": 1e-2, "num_train_epochs": 1.0, "per_device_train_batch_size": 1, "bf16": False}
    examples = [{"input_ids": list(range(5, 25)), "labels": [-100] * 17 + [22, 23, 24]}]
    warmup._train(tiny_checkpoint(tmp_path / "base"), examples, {**settings, "seed": 0}, tmp_path / "out")
    assert scored == [(3, warmup.CPU_LOGPROB_TILE_TOKENS)]  # 3 labelled positions of 19, not every position
    assert chunked_logprob.TOKEN_CHUNK_SIZE == 4096 and not trl_utils._use_triton(torch.device("cpu"))  # restored


def test_changed_inputs_build_a_new_warmup(tmp_path, monkeypatch):
    from trl_ext.models import warmup

    builds = []
    monkeypatch.setattr(warmup, "_train_in_child", lambda base, examples, settings, out: builds.append(settings))
    base = tiny_checkpoint(tmp_path / "base")
    cache = tmp_path / "cache"
    first = format_warmup(base, EXAMPLES, cache_dir=cache)
    assert format_warmup(base, EXAMPLES, cache_dir=cache) == first and len(builds) == 1
    paths = {
        first,
        format_warmup(base, EXAMPLES[:2], cache_dir=cache),  # other examples
        format_warmup(base, EXAMPLES, learning_rate=3e-5, cache_dir=cache),  # other settings
        format_warmup(tiny_checkpoint(tmp_path / "other", seed=1), EXAMPLES, cache_dir=cache),  # other base weights
    }
    assert len(paths) == 4 and len(builds) == 4
    # The same settings written differently (an int from a YAML file) are the same build.
    assert format_warmup(base, EXAMPLES, num_train_epochs=1, per_device_train_batch_size=8.0, cache_dir=cache) == first
    assert len(builds) == 4


def test_the_build_runs_outside_the_job_with_every_core(tmp_path, monkeypatch):
    import subprocess

    from trl_ext.models import warmup

    seen = {}
    monkeypatch.setattr(subprocess, "run", lambda cmd, env, check: seen.update(env=env))
    for name, value in {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "ACCELERATE_USE_CPU": "true",
        "OMP_NUM_THREADS": "1",
        "TRL_EXT_CACHE": "/somewhere",
    }.items():
        monkeypatch.setenv(name, value)
    warmup._train_in_child("base", EXAMPLES, {}, tmp_path)
    assert not {"RANK", "WORLD_SIZE", "ACCELERATE_USE_CPU", "OMP_NUM_THREADS"} & set(seen["env"])
    assert seen["env"]["TRL_EXT_CACHE"] == "/somewhere"


def test_a_missing_base_model_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="not a model checkpoint"):
        (tmp_path / "empty").mkdir()
        format_warmup(str(tmp_path / "empty"), EXAMPLES, cache_dir=tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="base model 'no-such-org/no-such-model' was not found"):
        format_warmup("no-such-org/no-such-model", EXAMPLES, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="at least one example"):
        format_warmup(str(tmp_path / "empty"), [], cache_dir=tmp_path)


RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from trl_ext.models import warmup

    def fake_train(base, examples, settings, out):  # the race is about the cache, not the training
        with open(sys.argv[3], "a") as log:
            log.write("built\\n")
        time.sleep(1.0)
        (Path(out) / "config.json").write_text("{}")

    warmup._train_in_child = fake_train
    examples = [{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}]
    print(warmup.format_warmup(sys.argv[1], examples, cache_dir=sys.argv[2]))
    """
)


def test_two_racing_processes_build_once(tmp_path):
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    base, cache, log = tiny_checkpoint(tmp_path / "base"), tmp_path / "cache", tmp_path / "builds.log"
    procs = [
        subprocess.Popen([sys.executable, str(script), base, str(cache), str(log)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    paths = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert paths[0] == paths[1]
    assert log.read_text() == "built\n"
    assert not list(cache.glob(".building-*"))


def test_uniform_warmup_confidences_spread_over_the_whole_range():
    """`confidence_draw="uniform"`: every tenth about equally often (not mostly high), still independent of the rows."""
    many = [dict(ROWS[i % 2], solution=str(i)) for i in range(1000)]
    draws = [_confidence(e) for e in rlcr_format_examples(many, CONF, seed=0, confidence_draw="uniform")[1::2]]
    counts = [draws.count(value) for value in WARMUP_CONFIDENCES]
    assert min(counts) > 60 and max(counts) < 140  # 100 expected each
    assert abs(sum(draws) / len(draws) - 0.55) < 0.03
    other = [dict(ROWS[(i + 1) % 2], solution=str(7 * i)) for i in range(1000)]
    assert draws == [
        _confidence(e) for e in rlcr_format_examples(other, CONF, seed=0, confidence_draw="uniform")[1::2]
    ]
    with pytest.raises(ValueError, match="confidence_draw"):
        rlcr_format_examples(many, CONF, confidence_draw="high")
