"""Trainer state in checkpoints: the JSON + safetensors format, refusal of crafted and corrupt files, and crash
consistency of the checkpoint writes (each write failed in turn, with ReplayGRPOTrainer; RLCRMultiTurnTrainer, which
has no state of its own, gets the same guarantees)."""

import dataclasses
import datetime
import errno
import hashlib
import json
import math
import os
import pickle
import random
import shutil

import pytest
import torch
from datasets import Dataset
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer

from trl_ext.testing import cpu_test_args, tiny_causal_lm
from trl_ext.trainers import (
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)
from trl_ext.trainers.seams import trainer_state
from trl_ext.trainers.seams.trainer_state import CheckpointStateError, load_state, save_state


OWNER = "ReplayGRPOTrainer"


class RunsCommand:
    """Unpickling this creates `marker` (as a crafted checkpoint file would run any command)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def sample_state():
    base = torch.arange(10, dtype=torch.int32)
    return {
        "buckets": {0: ["a"], 3: ["b", "c"]},  # int keys
        "rng": random.Random(7).getstate(),  # nested tuples
        "rows": [base[:4], base[4:]],  # views of one storage
        "logps": torch.tensor([-0.5, float("nan")]),
        "reward": float("nan"),
        "flags": [True, None, 2, "x"],
        "$odd": {"$tensor": "not a tensor"},  # keys that look like the format's tags
    }


def test_state_round_trips(tmp_path):
    state = sample_state()
    save_state(tmp_path, "s", state)
    assert sorted(os.listdir(tmp_path)) == ["s.json", "s.safetensors"]
    loaded = load_state(tmp_path, "s", OWNER)
    assert loaded["buckets"] == {0: ["a"], 3: ["b", "c"]}
    assert loaded["rng"] == state["rng"] and isinstance(loaded["rng"][1], tuple)
    assert random.Random().setstate(loaded["rng"]) is None
    assert [r.tolist() for r in loaded["rows"]] == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]
    assert loaded["rows"][0].dtype == torch.int32
    assert loaded["logps"][0].item() == -0.5 and math.isnan(loaded["logps"][1].item())
    assert math.isnan(loaded["reward"]) and loaded["flags"] == [True, None, 2, "x"]
    assert loaded["$odd"] == {"$tensor": "not a tensor"}


def test_unsupported_value_names_its_path(tmp_path):
    with pytest.raises(TypeError, match=r"state\['examples'\]\[0\]\['when'\]: a datetime.date cannot be saved"):
        save_state(tmp_path, "s", {"examples": [{"when": datetime.date(2024, 1, 1)}]})


def test_pickle_in_place_of_the_tensor_file_is_refused(tmp_path):
    marker = tmp_path / "ran"
    save_state(tmp_path, "s", {"x": torch.ones(1)})
    (tmp_path / "s.safetensors").write_bytes(pickle.dumps(RunsCommand(marker)))
    with pytest.raises(CheckpointStateError, match=r"s\.safetensors is corrupt or was not written by"):
        load_state(tmp_path, "s", OWNER)
    assert not marker.exists()


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "s.json").unlink(), r"s\.json is missing, so ReplayGRPOTrainer's state cannot be restored"),
        (lambda d: (d / "s.json").write_text('{"format": "trl-ext tr'), r"s\.json is corrupt .*Unterminated string"),
        (lambda d: (d / "s.json").write_text("[1, 2]"), r"s\.json is corrupt .*not a trl-ext trainer state file"),
        (lambda d: (d / "s.safetensors").write_bytes(b"\x00" * 5), r"s\.safetensors is corrupt"),
        (lambda d: (d / "s.safetensors").unlink(), r"s\.safetensors is corrupt .*No such file"),
        (
            lambda d: save_state(d, "other", {}) or os.replace(d / "other.safetensors", d / "s.safetensors"),
            r"does not hold the tensors .*different saves",
        ),
    ],
    ids=["missing", "truncated-json", "foreign-json", "truncated-tensors", "missing-tensors", "mixed-saves"],
)
def test_damaged_state_names_the_file_and_the_fix(tmp_path, damage, message):
    save_state(tmp_path, "s", {"x": torch.ones(2), "y": 1})
    damage(tmp_path)
    with pytest.raises(CheckpointStateError, match=message) as info:
        load_state(tmp_path, "s", OWNER)
    assert str(tmp_path) in str(info.value) and "resume_from_checkpoint" in str(info.value)


@pytest.mark.parametrize("depth", [900, 100_000], ids=["decodes-too-deep", "parses-too-deep"])
def test_deeply_nested_state_is_a_checkpoint_state_error(tmp_path, depth):
    # Fails on main (issue 35, item 9): a crafted state file nested 100k deep raised RecursionError from the JSON
    # parser (900 deep parsed, then the decoder recursed past the limit), not the error that names the file and fix.
    save_state(tmp_path, "s", {})
    payload = json.loads((tmp_path / "s.json").read_text())
    text = json.dumps({**payload, "state": None}).replace("null", "[" * depth + "]" * depth)
    (tmp_path / "s.json").write_text(text)
    with pytest.raises(CheckpointStateError, match=r"s\.json is corrupt") as info:
        load_state(tmp_path, "s", OWNER)
    assert "resume_from_checkpoint" in str(info.value)


# -- crash consistency with ReplayGRPOTrainer ------------------------------------------------------------------------
def coin(completions, **kwargs):
    return [float(ord(c[0]["content"][:1] or "a") % 2 == 0) for c in completions]


def replay_trainer(output_dir, **overrides):
    model, tokenizer = tiny_causal_lm(seed=1)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Say {i}"}], "task_id": f"t{i}"} for i in range(4)]
    )
    args = cpu_test_args(
        output_dir,
        ReplayGRPOConfig,
        **{
            "max_steps": 1,
            "replay_start_ratio": 0.0,
            "experience_lbound": 0,
            "max_completion_length": 4,
            "temperature": 1.0,
            "save_strategy": "steps",
            "save_steps": 1,
            "save_total_limit": 1,
            **overrides,
        },
    )
    return ReplayGRPOTrainer(
        model=model, reward_funcs=coin, args=args, train_dataset=dataset, processing_class=tokenizer
    )


def folder_digest(folder):
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in sorted(os.listdir(folder))}


def checkpoints(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith("checkpoint-"))


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def truncated_trainer_state(state, json_path):
    """`TrainerState.save_to_json` stopped by a full disk half-way through the file."""
    text = json.dumps(dataclasses.asdict(state), indent=2)
    with open(json_path, "w") as file:
        file.write(text[: len(text) // 2])
    full_disk()


# Every write of a checkpoint: ours (tensors, then JSON) and transformers' (weights, tokenizer, optimizer and
# scheduler, scaler, RNG, trainer_state.json).
WRITES = {
    "state-tensors": lambda t: (trainer_state, "save_file"),
    "state-json": lambda t: (trainer_state, "_write_json"),
    "weights": lambda t: (t.model, "save_pretrained"),
    "tokenizer": lambda t: (t.processing_class, "save_pretrained"),
    "optimizer": lambda t: (t, "_save_optimizer_and_scheduler"),
    "scaler": lambda t: (t, "_save_scaler"),
    "rng": lambda t: (t, "_save_rng_state"),
    "trainer_state.json": lambda t: (type(t.state), "save_to_json"),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A trainer after one step with checkpoint-1 saved (save_total_limit=1)."""
    out = tmp_path_factory.mktemp("run")
    trainer = replay_trainer(out)
    trainer.train()
    assert trainer.experience.num_tasks > 0, "checkpoint-1 holds a non-empty buffer"
    return trainer, out


@pytest.mark.parametrize("write", [*WRITES, "trainer_state.json cut off"])
def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(trained, monkeypatch, write):
    trainer, out = trained
    previous = out / "checkpoint-1"
    before = folder_digest(previous)
    monkeypatch.setattr(trainer.state, "global_step", 2)
    if write == "trainer_state.json cut off":
        monkeypatch.setattr(type(trainer.state), "save_to_json", truncated_trainer_state)
    else:
        monkeypatch.setattr(*WRITES[write](trainer), full_disk)
    with pytest.raises(OSError, match="No space left"):
        trainer._save_checkpoint(trainer.model, trial=None)
    assert folder_digest(previous) == before
    assert checkpoints(out) == ["checkpoint-1"]  # the incomplete checkpoint-2 is gone, nothing rotated
    assert get_last_checkpoint(str(out)) == str(previous)


def test_a_complete_checkpoint_survives_a_failure_after_it(trained, monkeypatch):
    """A failure after transformers completed the folder (pushing, rotating) keeps it: it is resumable."""
    trainer, out = trained
    monkeypatch.setattr(trainer.state, "global_step", 3)
    monkeypatch.setattr("transformers.trainer.rotate_checkpoints", full_disk)
    with pytest.raises(OSError):
        trainer._save_checkpoint(trainer.model, trial=None)
    assert (out / "checkpoint-3" / "trainer_state.json").is_file()
    assert load_state(out / "checkpoint-3", "replay_state", OWNER)["replay_active"] is True
    shutil.rmtree(out / "checkpoint-3")


def test_resume_after_a_failed_save_restores_the_previous_buffer(trained, tmp_path, monkeypatch):
    trainer, out = trained
    saved = json.loads((out / "checkpoint-1" / "replay_state.json").read_text())["state"]
    monkeypatch.setattr(trainer.state, "global_step", 2)
    with monkeypatch.context() as patch:
        patch.setattr(trainer_state, "_write_json", full_disk)
        with pytest.raises(OSError):
            trainer._save_checkpoint(trainer.model, trial=None)

    run = tmp_path / "run"
    shutil.copytree(out, run)
    (run / "checkpoint-7").mkdir()  # a save killed mid-way (no exception to clean up after): not taken
    (run / "checkpoint-7" / "model.safetensors").write_bytes(b"partial")
    shutil.copytree(run / "checkpoint-1", run / "checkpoint-8")  # killed while writing trainer_state.json: not taken
    cut = (run / "checkpoint-8" / "trainer_state.json").read_bytes()
    (run / "checkpoint-8" / "trainer_state.json").write_bytes(cut[: len(cut) // 2])
    resumed = replay_trainer(run, max_steps=2)
    restored = []
    load = resumed.load_checkpoint_state
    monkeypatch.setattr(resumed, "load_checkpoint_state", lambda state: restored.append(state) or load(state))
    resumed.train(resume_from_checkpoint=True)
    assert len(restored) == 1
    assert trainer_state.encode_state(restored[0])[0] == saved
    assert resumed.state.global_step == 2
    assert "checkpoint-2" in checkpoints(run) and "checkpoint-1" not in checkpoints(run)  # rotated after the save


def test_state_that_does_not_fit_the_trainer_is_a_clear_error(trained, tmp_path, monkeypatch):
    trainer, _ = trained
    save_state(tmp_path, "replay_state", {"experience": {}, "replay_active": True})
    monkeypatch.setattr(GRPOTrainer, "_load_optimizer_and_scheduler", lambda self, checkpoint: None)
    with pytest.raises(
        CheckpointStateError,
        match=r"replay_state\.json does not hold the state ReplayGRPOTrainer "
        r"expects \(KeyError\('difficulty2task'\)\)",
    ):
        trainer._load_optimizer_and_scheduler(str(tmp_path))


# -- RLCRMultiTurnTrainer: no state of its own, the same guarantees ---------------------------------------------------
def rlcr_trainer(output_dir, **overrides):
    model, tokenizer = tiny_causal_lm(seed=1)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Say {i}"}], "solution": str(i)} for i in range(4)]
    )
    args = cpu_test_args(
        output_dir,
        RLCRMultiTurnConfig,
        **{
            "max_steps": 1,
            "num_generations": 2,
            "num_generations_confidence": 2,
            "per_device_train_batch_size": 4,
            "max_completion_length": 4,
            "max_confidence_length": 4,
            "save_strategy": "steps",
            "save_steps": 1,
            "save_total_limit": 1,
            **overrides,
        },
    )
    return RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


def test_rlcr_failed_save_keeps_the_previous_checkpoint_and_resume_skips_incomplete_ones(tmp_path, monkeypatch):
    trainer = rlcr_trainer(tmp_path)
    trainer.train()
    previous = tmp_path / "checkpoint-1"
    before = folder_digest(previous)
    monkeypatch.setattr(trainer.state, "global_step", 2)
    with monkeypatch.context() as patch:
        patch.setattr(trainer, "_save_optimizer_and_scheduler", full_disk)
        with pytest.raises(OSError, match="No space left"):
            trainer._save_checkpoint(trainer.model, trial=None)
    assert checkpoints(tmp_path) == ["checkpoint-1"] and folder_digest(previous) == before

    (tmp_path / "checkpoint-7").mkdir()  # a save killed mid-way: not taken
    (tmp_path / "checkpoint-7" / "model.safetensors").write_bytes(b"partial")
    resumed = rlcr_trainer(tmp_path, max_steps=2)
    loaded = []
    load = resumed._load_from_checkpoint
    monkeypatch.setattr(resumed, "_load_from_checkpoint", lambda folder, *a: loaded.append(folder) or load(folder, *a))
    resumed.train(resume_from_checkpoint=True)
    assert loaded == [str(previous)] and resumed.state.global_step == 2
