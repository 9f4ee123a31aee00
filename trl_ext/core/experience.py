"""Experience buffer for replay GRPO: success buckets, stored trajectories, retired tasks.
Design: docs/design.md#replaygrpotrainer.

Pure Python + tensors, no trainer inside. Every process of a run holds an identical manager: it is updated from
gathered data in a fixed order, and all randomness comes from its own seeded `random.Random`, so the same calls give
the same decisions on every rank and after `load_state_dict`. Containers are insertion-ordered dicts, never sets:
set iteration order depends on the per-process string hash seed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

import torch


SELECT_MODES = ("argmin", "argmax", "random")
BUCKET_WEIGHTINGS = ("uniform", "gaussian")


@dataclass
class Trajectory:
    """One stored successful rollout of a task.

    `completion_ids` (int32) are the generated token ids, never re-tokenised text; `logps` (float32, same length) are
    the log-probs the trainer computed for them when they were collected.

    An episode with tool calls also keeps `tool_mask` (bool, same length: False on tool-output tokens, whose log-probs
    mean nothing), its decoded messages (`completion`, for reward functions that re-score it) and `env_rewards`, the
    reward columns that needed its live environment, recorded at collection.
    """

    task_id: str
    completion_ids: torch.Tensor
    logps: torch.Tensor
    reward: float
    entropy: float
    policy_version: int
    tool_mask: torch.Tensor | None = None
    completion: list[dict] | None = None
    env_rewards: dict[str, float] | None = None

    def __post_init__(self):
        self.completion_ids = torch.as_tensor(self.completion_ids, dtype=torch.int32).flatten()
        self.logps = torch.as_tensor(self.logps, dtype=torch.float32).flatten()
        if self.tool_mask is not None:
            self.tool_mask = torch.as_tensor(self.tool_mask, dtype=torch.bool).flatten()
        lengths = {self.logps.numel()} | ({self.tool_mask.numel()} if self.tool_mask is not None else set())
        if lengths != {self.completion_ids.numel()}:
            raise ValueError(
                f"Trajectory of task {self.task_id!r}: {self.completion_ids.numel()} completion ids but "
                f"{self.logps.numel()} log-probs"
                + ("" if self.tool_mask is None else f" and {self.tool_mask.numel()} tool-mask entries")
                + "."
            )

    @property
    def num_tokens(self) -> int:
        return self.completion_ids.numel()

    @property
    def nbytes(self) -> int:
        """Tensor bytes, plus the UTF-8 JSON size of an episode's messages and recorded rewards."""
        size = self.completion_ids.nbytes + self.logps.nbytes
        if self.tool_mask is not None:
            size += self.tool_mask.nbytes
        for extra in (self.completion, self.env_rewards):
            if extra is not None:
                size += len(json.dumps(extra, default=str).encode())
        return size


@dataclass
class GroupOutcome:
    """What one on-policy group of a task produced: successes among its fresh rollouts and the successful ones."""

    task_id: str
    successes: int
    num_rollouts: int
    candidates: list[Trajectory] = field(default_factory=list)
    prompt_ids: Any = None
    example: Any = None


def task_id_of(example: dict, column: str = "task_id") -> str:
    """Stable id of a task: the dataset's id column if present, else a hash of the prompt (text or messages)."""
    if example.get(column) is not None:
        return str(example[column])
    prompt = json.dumps(example["prompt"], sort_keys=True, ensure_ascii=False, default=str)
    return "sha1:" + hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:20]


def masked_mean_entropy(entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean of `entropies` (B, T) over `mask` (B, T) only; 0 for an empty row.

    ExGRPO's released code inverts this mask: its "mean entropy" of a trajectory averages over the padding positions
    after the completion only, never over the completion's own tokens, so its `argmin` selection does not rank
    trajectories by how certain the model was of them.
    """
    mask = mask.to(entropies.dtype)
    return (entropies * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def success_bucket(successes: int, num_rollouts: int, num_generations: int) -> int:
    """Success count on the scale of a full group of `num_generations`.

    A replay group has only `num_generations - k` fresh rollouts; its count is rescaled (rounded half up) so that
    tasks seen in full and in replay groups share buckets.
    """
    if num_rollouts == num_generations:
        return successes
    return math.floor(successes * num_generations / num_rollouts + 0.5)


class ExperienceManager:
    """Success buckets, per-task trajectories and the retire set of a replay run.

    Args:
        num_generations: Group size `n`.
        experience_lbound / experience_rbound: a task's successes are collected when
            `lbound < successes < rbound` (on the `n` scale).
        select_mode: Which successful rollout of a group to keep, and which stored ones to replay:
            `"argmin"` (lowest mean entropy), `"argmax"`, `"random"`.
        max_trajectories_per_task: Per-task cap. When full, `argmin`/`argmax` replace the worst stored trajectory if
            the new one is better; `random` is first-in first-out.
        max_buffer_tokens: Bound on stored tokens (prompt ids once per task + completion ids); the trajectories of
            the oldest policy version are evicted first. `None`: unbounded.
        max_policy_lag: Trajectories older than this many steps are not replayed (they stay stored). `None`: no limit.
        bucket_weighting: How replay tasks are drawn: `"uniform"` over non-empty buckets, or `"gaussian"` centred at
            `n / 2` with sd 1 (ExGRPO); then uniformly within the bucket.
        seed: Seed of the manager's random generator.
    """

    def __init__(
        self,
        num_generations: int,
        experience_lbound: int = 0,
        experience_rbound: int | None = None,
        select_mode: str = "argmin",
        max_trajectories_per_task: int = 10,
        max_buffer_tokens: int | None = None,
        max_policy_lag: int | None = None,
        bucket_weighting: str = "uniform",
        seed: int = 0,
    ):
        if select_mode not in SELECT_MODES:
            raise ValueError(f"select_mode must be one of {SELECT_MODES} (got {select_mode!r}).")
        if bucket_weighting not in BUCKET_WEIGHTINGS:
            raise ValueError(f"bucket_weighting must be one of {BUCKET_WEIGHTINGS} (got {bucket_weighting!r}).")
        self.num_generations = num_generations
        self.lbound = experience_lbound
        self.rbound = num_generations if experience_rbound is None else experience_rbound
        self.select_mode = select_mode
        self.max_trajectories_per_task = max_trajectories_per_task
        self.max_buffer_tokens = max_buffer_tokens
        self.max_policy_lag = max_policy_lag
        self.bucket_weighting = bucket_weighting
        self.rng = random.Random(seed)
        self.difficulty2task: dict[int, dict[str, None]] = {}
        self.task2bucket: dict[str, int] = {}
        self.task2trajectories: dict[str, list[Trajectory]] = {}
        self.task_prompt_ids: dict[str, torch.Tensor] = {}
        self.task_examples: dict[str, Any] = {}
        self.retired: dict[str, None] = {}

    # ----------------------------------------------------------------------------------------------- updates
    def update(self, outcomes: list[GroupOutcome], step: int) -> None:
        """Apply one generation batch's on-policy outcomes, in order: buckets, retire/un-retire, collection, budget.
        An outcome without judged rollouts (no gold answer) says nothing about its task and is skipped."""
        for outcome in outcomes:
            if outcome.num_rollouts == 0:
                continue
            self.observe(outcome.task_id, outcome.successes, outcome.num_rollouts)
            if outcome.candidates and self.collects(outcome.successes, outcome.num_rollouts):
                self.collect(outcome.task_id, outcome.candidates, outcome.prompt_ids, outcome.example)
        self.enforce_budget()

    def collects(self, successes: int, num_rollouts: int) -> bool:
        """Whether a group with these fresh successes has a rollout kept: inside the collection window, and not
        solved every time (that retires the task)."""
        if not successes < num_rollouts:  # also a group with no judged rollouts
            return False
        bucket = success_bucket(successes, num_rollouts, self.num_generations)
        return self.lbound < bucket < self.rbound

    def observe(self, task_id: str, successes: int, num_rollouts: int) -> None:
        """Move the task to the bucket of its latest success count; retire it if every rollout succeeded."""
        if successes == num_rollouts:
            self._forget(task_id)
            self.retired[task_id] = None
            return
        self.retired.pop(task_id, None)  # failed again: back in play
        bucket = success_bucket(successes, num_rollouts, self.num_generations)
        old = self.task2bucket.get(task_id)
        if old is not None and old != bucket:
            self._leave_bucket(task_id, old)
        self.task2bucket[task_id] = bucket
        self.difficulty2task.setdefault(bucket, {})[task_id] = None

    def collect(self, task_id: str, candidates: list[Trajectory], prompt_ids=None, example=None) -> None:
        """Keep one of a group's successful rollouts (chosen by `select_mode`) under the per-task cap."""
        chosen = self._pick(candidates, 1)[0]
        stored = self.task2trajectories.setdefault(task_id, [])
        if prompt_ids is not None:
            self.task_prompt_ids[task_id] = torch.as_tensor(prompt_ids, dtype=torch.int32).flatten()
        if example is not None:
            self.task_examples[task_id] = example
        if len(stored) < self.max_trajectories_per_task:
            stored.append(chosen)
        elif self.select_mode == "random":
            stored.pop(0)  # first in, first out
            stored.append(chosen)
        else:
            # Replace the stored trajectory the mode likes least, if the new one is better.
            sign = 1.0 if self.select_mode == "argmin" else -1.0
            worst = max(range(len(stored)), key=lambda i: sign * stored[i].entropy)
            if sign * chosen.entropy < sign * stored[worst].entropy:
                stored[worst] = chosen

    def enforce_budget(self) -> None:
        """Evict trajectories of the oldest policy version first until the stored tokens fit `max_buffer_tokens`."""
        if self.max_buffer_tokens is None:
            return
        tokens = self.num_tokens  # counted once, then kept up to date while evicting
        while tokens > self.max_buffer_tokens:
            oldest = min(t.policy_version for ts in self.task2trajectories.values() for t in ts)
            for task_id in list(self.task2trajectories):
                stored = self.task2trajectories[task_id]
                kept = [t for t in stored if t.policy_version != oldest]
                tokens -= sum(t.num_tokens for t in stored) - sum(t.num_tokens for t in kept)
                if kept:
                    self.task2trajectories[task_id] = kept
                else:
                    tokens -= self.task_prompt_ids[task_id].numel() if task_id in self.task_prompt_ids else 0
                    self._drop_trajectories(task_id)
                if tokens <= self.max_buffer_tokens:
                    break

    # ---------------------------------------------------------------------------------------------- sampling
    def eligible(self, task_id: str, step: int) -> list[Trajectory]:
        """Stored trajectories of a task young enough to replay at `step`."""
        trajectories = self.task2trajectories.get(task_id, [])
        if self.max_policy_lag is None:
            return list(trajectories)
        return [t for t in trajectories if step - t.policy_version <= self.max_policy_lag]

    def sample_tasks(self, count: int, k: int, step: int, exclude=()) -> list[str]:
        """Draw up to `count` distinct tasks with at least `k` eligible trajectories, by bucket weighting."""
        exclude = set(exclude)
        pool: dict[int, list[str]] = {}
        for bucket in sorted(self.difficulty2task):
            tasks = [t for t in self.difficulty2task[bucket] if t not in exclude and len(self.eligible(t, step)) >= k]
            if tasks:
                pool[bucket] = tasks
        chosen = []
        while len(chosen) < count and pool:
            buckets = sorted(pool)
            if self.bucket_weighting == "uniform":
                weights = [1.0] * len(buckets)
            else:
                weights = [math.exp(-0.5 * (b - self.num_generations / 2) ** 2) for b in buckets]
            bucket = self.rng.choices(buckets, weights=weights)[0]
            task = pool[bucket].pop(self.rng.randrange(len(pool[bucket])))
            if not pool[bucket]:
                del pool[bucket]
            chosen.append(task)
        return chosen

    def select_trajectories(self, task_id: str, k: int, step: int) -> list[Trajectory]:
        """The `k` eligible trajectories of a task to replay, chosen by `select_mode`."""
        return self._pick(self.eligible(task_id, step), k)

    def _pick(self, trajectories: list[Trajectory], k: int) -> list[Trajectory]:
        if k > len(trajectories):
            raise ValueError(f"Asked for {k} trajectories, only {len(trajectories)} available.")
        if self.select_mode == "random":
            return self.rng.sample(trajectories, k)
        order = sorted(range(len(trajectories)), key=lambda i: trajectories[i].entropy)
        if self.select_mode == "argmax":
            order.reverse()
        return [trajectories[i] for i in order[:k]]

    # ----------------------------------------------------------------------------------------------- removal
    def _leave_bucket(self, task_id: str, bucket: int) -> None:
        members = self.difficulty2task.get(bucket, {})
        members.pop(task_id, None)
        if not members:
            self.difficulty2task.pop(bucket, None)

    def _drop_trajectories(self, task_id: str) -> None:
        self.task2trajectories.pop(task_id, None)
        self.task_prompt_ids.pop(task_id, None)
        self.task_examples.pop(task_id, None)

    def _forget(self, task_id: str) -> None:
        bucket = self.task2bucket.pop(task_id, None)
        if bucket is not None:
            self._leave_bucket(task_id, bucket)
        self._drop_trajectories(task_id)

    # ------------------------------------------------------------------------------------------------- stats
    @property
    def num_tasks(self) -> int:
        return len(self.task2trajectories)

    @property
    def num_trajectories(self) -> int:
        return sum(len(ts) for ts in self.task2trajectories.values())

    @property
    def num_tokens(self) -> int:
        completions = sum(t.num_tokens for ts in self.task2trajectories.values() for t in ts)
        return completions + sum(p.numel() for p in self.task_prompt_ids.values())

    @property
    def nbytes(self) -> int:
        completions = sum(t.nbytes for ts in self.task2trajectories.values() for t in ts)
        return completions + sum(p.nbytes for p in self.task_prompt_ids.values())

    def bucket_histogram(self) -> dict[int, int]:
        return {bucket: len(tasks) for bucket, tasks in sorted(self.difficulty2task.items())}

    # ------------------------------------------------------------------------------------------- persistence
    def state_dict(self) -> dict:
        return {
            "difficulty2task": {b: list(tasks) for b, tasks in self.difficulty2task.items()},
            "task2bucket": dict(self.task2bucket),
            "task2trajectories": {task: [vars(t).copy() for t in ts] for task, ts in self.task2trajectories.items()},
            "task_prompt_ids": dict(self.task_prompt_ids),
            "task_examples": dict(self.task_examples),
            "retired": list(self.retired),
            "rng": self.rng.getstate(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.difficulty2task = {int(b): dict.fromkeys(tasks) for b, tasks in state["difficulty2task"].items()}
        self.task2bucket = dict(state["task2bucket"])
        self.task2trajectories = {
            task: [Trajectory(**t) for t in ts] for task, ts in state["task2trajectories"].items()
        }
        self.task_prompt_ids = dict(state["task_prompt_ids"])
        self.task_examples = dict(state["task_examples"])
        self.retired = dict.fromkeys(state["retired"])
        self.rng.setstate(state["rng"])
