"""Trainer state that lives across steps (a replay buffer, a task buffer), saved in every checkpoint and restored on
resume without running code from the file.

A state is a nested structure of dicts, lists, tuples, strings, numbers, booleans, `None` and tensors. It is written
as two files in the checkpoint folder: `<name>.safetensors` (the tensors) and `<name>.json` (everything else, with
tensors, tuples and non-string dict keys tagged), each written under a temporary name and renamed into place. Reading
parses JSON and safetensors only, so a crafted file can at worst be refused.

[`CheckpointStateMixin`] puts the files into `checkpoint-N/` before transformers writes anything there, so they are in
every checkpoint that transformers completes (its `trainer_state.json`, written last) and before older checkpoints are
rotated away; a save that fails removes the checkpoint folder it started, leaving the previous one the latest, and
`resume_from_checkpoint=True` skips incomplete folders. Every trainer mixes it in, with or without state of its own.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR


logger = logging.getLogger(__name__)

FORMAT = "trl-ext trainer state"
VERSION = 1
_TENSOR, _TUPLE, _DICT = "$tensor", "$tuple", "$dict"


class CheckpointStateError(ValueError):
    """A checkpoint's trainer state is missing, corrupt or not ours; the message names the file and the fix."""


def encode_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split `state` into a JSON-serialisable tree and the tensors it references (by key)."""
    tensors: dict[str, torch.Tensor] = {}

    def encode(x, path):
        if x is None or isinstance(x, (bool, int, float, str)):
            return x  # NaN and infinities too: Python's json writes and reads them
        if isinstance(x, torch.Tensor):
            return {_TENSOR: _store(x)}
        if isinstance(x, tuple):
            return {_TUPLE: [encode(v, f"{path}[{i}]") for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [encode(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: encode(v, f"{path}[{k!r}]") for k, v in x.items()}
            return {_DICT: [[encode(k, f"{path} key"), encode(v, f"{path}[{k!r}]")] for k, v in x.items()]}
        raise TypeError(
            f"{path}: a {type(x).__module__}.{type(x).__qualname__} cannot be saved as trainer state (dicts, lists, "
            "tuples, str, int, float, bool, None and tensors only); convert it to one of these."
        )

    def _store(tensor):
        key = str(len(tensors))
        # Own contiguous storage: safetensors refuses tensors that share memory (row slices of one batch tensor).
        tensors[key] = tensor.detach().cpu().contiguous().clone()
        return key

    return encode(state, "state"), tensors


# The trainers' states nest a few levels (dicts of lists of tuples); anything much deeper was not written by them.
MAX_STATE_DEPTH = 64


def decode_state(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of [`encode_state`]. Raises `KeyError`/`TypeError`/`ValueError` on a malformed tree, one nested deeper
    than `MAX_STATE_DEPTH` included (a fixed bound, so the verdict does not depend on the interpreter's recursion
    limit, which libraries raise)."""

    def decode(x, depth=0):
        if depth > MAX_STATE_DEPTH:
            raise ValueError(f"state nested deeper than {MAX_STATE_DEPTH} levels")
        if isinstance(x, list):
            return [decode(v, depth + 1) for v in x]
        if not isinstance(x, dict):
            return x
        if len(x) == 1 and _TENSOR in x:
            return tensors[x[_TENSOR]]
        if len(x) == 1 and _TUPLE in x:
            return tuple(decode(v, depth + 1) for v in x[_TUPLE])
        if len(x) == 1 and _DICT in x:
            return {_hashable(decode(k, depth + 1)): decode(v, depth + 1) for k, v in x[_DICT]}
        return {k: decode(v, depth + 1) for k, v in x.items()}

    return decode(tree)


def _hashable(key):
    if isinstance(key, (list, dict, torch.Tensor)):
        raise TypeError(f"unhashable dict key {key!r}")
    return key


def state_paths(folder: str | os.PathLike, name: str) -> tuple[str, str]:
    """The JSON and safetensors files of state `name` in `folder`."""
    return os.path.join(folder, f"{name}.json"), os.path.join(folder, f"{name}.safetensors")


def save_state(folder: str | os.PathLike, name: str, state: Any) -> None:
    """Write `state` to `folder` as `<name>.safetensors` then `<name>.json` (the JSON, written last, lists the
    tensors it expects, so a folder with only one of the two files reads as incomplete)."""
    tree, tensors = encode_state(state)
    json_path, tensor_path = state_paths(folder, name)
    _replace_into(tensor_path, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT}))
    payload = {"format": FORMAT, "version": VERSION, "tensors": sorted(tensors, key=int), "state": tree}
    _replace_into(json_path, lambda tmp: _write_json(tmp, payload))


def _write_json(path: str, payload) -> None:
    with open(path, "w") as file:
        json.dump(payload, file)
        file.flush()
        os.fsync(file.fileno())


def _replace_into(path: str, write) -> None:
    tmp = f"{path}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_state(folder: str | os.PathLike, name: str, owner: str) -> Any:
    """Read the state `name` from checkpoint `folder`, or raise [`CheckpointStateError`] naming the file and the fix.

    `owner` (the trainer's name) goes into the messages.
    """
    json_path, tensor_path = state_paths(folder, name)
    restart = _restart_hint(owner)
    if not os.path.exists(json_path):
        raise CheckpointStateError(
            f"{json_path} is missing, so {owner}'s state cannot be restored (the checkpoint was not written by "
            f"{owner}, or its save was interrupted). {restart}"
        )
    corrupt = f"is corrupt or was not written by {owner}"
    try:
        with open(json_path) as file:
            payload = json.load(file)
    except RecursionError as error:  # json's parser recurses per nesting level: a crafted file can nest past the limit
        raise CheckpointStateError(f"{json_path} {corrupt} (nested too deeply to parse). {restart}") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointStateError(f"{json_path} {corrupt} ({error}). {restart}") from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "state" not in payload:
        raise CheckpointStateError(f"{json_path} {corrupt} (not a {FORMAT} file). {restart}")
    if payload.get("version") != VERSION:
        raise CheckpointStateError(
            f"{json_path} has format version {payload.get('version')!r}; this trl-ext reads version {VERSION}. "
            f"Resume with the trl-ext version that wrote it. {restart}"
        )
    try:
        tensors = load_file(tensor_path)
    except (OSError, SafetensorError) as error:
        raise CheckpointStateError(f"{tensor_path} {corrupt} ({error}). {restart}") from error
    if sorted(tensors, key=int) != payload.get("tensors"):
        raise CheckpointStateError(
            f"{tensor_path} does not hold the tensors {json_path} lists (the two files come from different saves). "
            f"{restart}"
        )
    try:
        return decode_state(payload["state"], tensors)
    except (KeyError, TypeError, ValueError, RecursionError) as error:
        raise CheckpointStateError(f"{json_path} {corrupt} ({error!r}). {restart}") from error


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The highest `checkpoint-N` in `output_dir` that transformers completed (it holds a `trainer_state.json` that
    parses, written last); incomplete ones above it are skipped with a warning."""
    if not os.path.isdir(output_dir):
        return None
    prefix = f"{PREFIX_CHECKPOINT_DIR}-"
    steps = sorted(
        (int(name[len(prefix) :]), name)
        for name in os.listdir(output_dir)
        if name.startswith(prefix) and name[len(prefix) :].isdigit() and os.path.isdir(os.path.join(output_dir, name))
    )
    for _, name in reversed(steps):
        folder = os.path.join(output_dir, name)
        problem = _trainer_state_problem(os.path.join(folder, TRAINER_STATE_NAME))
        if problem is None:
            return folder
        logger.warning(f"{folder} is incomplete ({problem}: its save was interrupted); skipped.")
    return None


def _trainer_state_problem(path: str) -> str | None:
    """Why `path` is not a complete `trainer_state.json`, or `None`. transformers writes it in place (not atomically),
    so a save killed while writing it leaves a truncated file."""
    try:
        with open(path) as file:
            json.load(file)
    except FileNotFoundError:
        return f"no {TRAINER_STATE_NAME}"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        return f"{TRAINER_STATE_NAME} does not parse: {error}"
    return None


def _restart_hint(owner: str) -> str:
    return (
        f"Resume from a checkpoint-N folder written by {owner} (it holds this file), or start a new run from the "
        "checkpoint's weights by passing the folder as the model instead of resume_from_checkpoint."
    )


class CheckpointStateMixin:
    """For `Trainer` subclasses: crash-consistent checkpoints (a failed save removes the folder it started,
    `resume_from_checkpoint=True` takes the latest complete one) and the trainer's state across steps, saved in each
    checkpoint and restored on resume.

    A trainer with state sets `checkpoint_state_name` (the file stem) and implements `checkpoint_state()` (the state,
    identical on every process, or `None` for nothing to save) and `load_checkpoint_state(state)`; one without leaves
    the name `None`.
    """

    checkpoint_state_name: str | None = None

    def checkpoint_state(self) -> Any:
        return None

    def load_checkpoint_state(self, state: Any) -> None:
        raise NotImplementedError

    def _save_checkpoint(self, model, trial):
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        started = not os.path.exists(folder)
        try:
            state = self.checkpoint_state()
            if state is not None and self.args.should_save:
                os.makedirs(folder, exist_ok=True)
                save_state(folder, self.checkpoint_state_name, state)
            super()._save_checkpoint(model, trial)
        except BaseException:
            # transformers' resume_from_checkpoint=True takes the highest checkpoint-N: drop an incomplete one (its
            # trainer_state.json, written last and not atomically, is absent or cut off) so the previous is taken.
            if started and self.args.should_save and _trainer_state_problem(os.path.join(folder, TRAINER_STATE_NAME)):
                shutil.rmtree(folder, ignore_errors=True)
            raise

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint is True:
            # transformers takes the highest checkpoint-N, complete or not (a save killed mid-way leaves one).
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir) or True
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _load_optimizer_and_scheduler(self, checkpoint):
        # Called with the resolved checkpoint folder on resume, for every backend (DeepSpeed and FSDP included).
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self.checkpoint_state_name is not None:
            owner = type(self).__name__
            state = load_state(checkpoint, self.checkpoint_state_name, owner)
            try:
                self.load_checkpoint_state(state)
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                path = state_paths(checkpoint, self.checkpoint_state_name)[0]
                raise CheckpointStateError(
                    f"{path} does not hold the state {owner} expects ({error!r}): it is corrupt or was written by "
                    f"another trainer. {_restart_hint(owner)}"
                ) from error
