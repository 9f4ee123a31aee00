"""GRPO with experience replay of successful trajectories (ExGRPO-style).
Design: docs/design.md#replaygrpotrainer.

Each generation batch runs through `GRPOTrainer._generate_and_score_completions`. Before it, the trainer plans the
batch identically on every process (from gathered task ids and an identical buffer): once replay is active,
`exp_ratio` of the groups become replay groups of buffered tasks, whose last `k` rows are stored trajectories; retired
tasks are swapped out. During it, the generation seam generates only the fresh rows and splices the stored completion
ids in, so TRL re-scores every row with the current reward functions and normalises advantages inside each group.
After it, the trainer marks the off-policy tokens (`exp_mask`), puts the recorded log-probs in `old_per_token_logps`
and feeds the fresh rows' outcomes to the `ExperienceManager`.

The loss is GRPOTrainer's on the on-policy tokens (its own `_compute_loss`, off-policy rows masked out) plus a
dual-clip or shaping loss on the off-policy tokens that reuses the same forward pass.

With `tools` or an `environment_factory`, fresh rows are episodes run by TRL's tool loop (kept in step across processes
by `CollectiveToolRounds`). A stored episode keeps its whole completion (tool-output tokens included), its
`tool_mask`, its messages and the reward columns that needed its live environment. When it is replayed, TRL's tool
loop skips it (its episode is over) and the batch gets its recorded `tool_mask`, so tool tokens are neither trained
nor part of the importance ratio; pure reward functions re-score it, environment columns keep the recorded value.
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from itertools import zip_longest

import torch
from accelerate.utils import gather_object
from trl.trainer.utils import nanmax, nanmin

from ..core.experience import (
    ExperienceManager,
    GroupOutcome,
    Trajectory,
    masked_mean_entropy,
    task_id_of,
)
from ..core.offpolicy_loss import add_off_policy_loss, importance_log_ratio, k3_kl, off_policy_token_loss
from ..evaluation.heldout_metrics import sample_accuracy
from .base import TrlExtGRPOTrainer
from .replay_config import ReplayGRPOConfig
from .seams.call_record import CallRecord, RecordsCalls
from .seams.init_checks import check_datasets, check_not_empty, checked_args, refuse_rollout_func
from .seams.model_card import arxiv_paper
from .seams.row_batches import local_rows
from .seams.scoping import scoped_call, standing_generation
from .seams.tool_rounds import CollectiveToolRounds


PAPER = arxiv_paper(  # the paper the model card cites
    "zhan2025exgrpo",
    "ExGRPO: Learning to Reason from Experience",
    "Runzhe Zhan and Yafu Li and Zhi Wang and Xiaoye Qu and Dongrui Liu and Jing Shao and Derek F. Wong and Yu Cheng",
    2025,
    "2510.02245",
)


@dataclass
class ReplayPlan:
    """How one generation batch is filled, identical on every process."""

    local_inputs: list[dict]
    stored: list[Trajectory | None]
    """Per local row: the stored trajectory it replays, or None for a fresh rollout."""
    stored_prompt_ids: list[list[int] | None]
    group_tasks: list[str]
    """Task id of every group of the gathered batch, after replacement."""
    global_stored: list[bool]
    global_trajectories: list[Trajectory | None]
    """Per row of the gathered batch: the stored trajectory it replays, or None."""
    fresh_max: int
    """Most fresh rows any process generates (the others pad up to it)."""
    offset: int
    num_replay_groups: int = 0
    retired_replaced: int = 0
    retired_kept: int = 0

    @property
    def has_replay(self) -> bool:
        return any(self.global_stored)


@dataclass
class CollectedRow:
    """A successful fresh rollout to store, on the process that generated it; log-probs and entropy come from the
    first forward pass of the policy over it."""

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    reward: float
    prompt_ids: torch.Tensor
    example: dict
    logps: torch.Tensor | None = None
    entropy: float | None = None
    tool_mask: torch.Tensor | None = None
    completion: list[dict] | None = None
    env_rewards: dict[str, float] | None = None

    def fill(self, logps: torch.Tensor, entropies: torch.Tensor) -> None:
        mask = self.completion_mask.to(entropies.device)
        self.logps = logps[: self.completion_ids.numel()].detach().float().cpu()
        self.entropy = float(masked_mean_entropy(entropies.detach()[None], mask[None]).item())

    def trajectory_fields(self, step: int) -> dict:
        return {
            "completion_ids": self.completion_ids,
            "logps": self.logps,
            "reward": self.reward,
            "entropy": self.entropy,
            "policy_version": step,
            "tool_mask": self.tool_mask,
            "completion": self.completion,
            "env_rewards": self.env_rewards,
        }


@dataclass
class PendingCollection:
    """One generation batch's group outcomes and the local rows to store."""

    outcomes: list[GroupOutcome]
    records: dict[int, CollectedRow]
    """Gathered row index -> row, for this process's rows."""
    step: int
    records_expected: bool = True
    """Whether any process has rows to store (then the gather runs on every process)."""


@dataclass
class ReplayBatch(CallRecord):
    """One training generation batch, from its plan to its collection: the generation seams read the plan, TRL's
    seams record the generation and rewards, the tool loop its episodes; the loss forward fills the collection."""

    plan: ReplayPlan | None = None
    episodes: list | None = None
    """This process's decoded episodes (with tools)."""
    collection: PendingCollection | None = None
    """The rows to store, while they wait for the loss forward's log-probs."""


class ReplayGRPOTrainer(
    RecordsCalls,
    CollectiveToolRounds,
    TrlExtGRPOTrainer,
):
    """GRPO whose groups mix fresh rollouts with stored successful trajectories, trained with importance sampling.

    Overrides from [`~trl.GRPOTrainer`]: `_generate_and_score_completions` (plans the batch, runs TRL's method once,
    marks the replayed rows and collects the fresh successes), `_compute_loss` (TRL's loss on the on-policy tokens
    plus the off-policy loss on the replayed ones, from the same forward), `_get_per_token_logps_and_entropies`
    (captures the policy's log-probs and entropies), `_tokenize_prompts` (stored prompt ids), `_calculate_rewards`
    (environment rewards of stored episodes), `_tool_call_loop` (skips stored episodes), `train` and
    `_save_checkpoint` (apply a waiting collection); for one call, `_generate_single_turn` (a splice that generates
    the fresh rows only). Through its seams: `_generate` / `_calculate_rewards` (`RecordsCalls`) and the tool loop in
    step across processes (`CollectiveToolRounds`); the base adds checkpoints, model cards, held-out evaluation and
    generation-backend handling (`TrlExtGRPOTrainer`). Inherited unchanged: generation on every backend, old and
    reference log-probs, reward gathering and group advantages (replayed rows are re-scored with the fresh ones), vLLM
    importance sampling, the on-policy loss of every `loss_type`, logging and the completions table.

    Args:
        model, reward_funcs: As [`~trl.GRPOTrainer`]. Success is read from `args.success_reward` (default: the first
            reward function).
        args: A [`ReplayGRPOConfig`].
        **kwargs: `train_dataset`, `eval_dataset`, `processing_class`, `reward_processing_classes`, `callbacks`,
            `optimizers`, `peft_config`, `tools`, `environment_factory`, as [`~trl.GRPOTrainer`]. Text prompts only
            (no images, no `rollout_func`). A `args.task_id_column` column gives stable task ids; otherwise the
            prompt is hashed.

    Tool episodes: a stored episode keeps its completion ids with the tool-output tokens, its `tool_mask` and the
    log-probs recorded at collection; a replayed one trains and enters the off-policy ratio on model tokens only.
    Replayed rows are re-scored by the reward functions that do not need a live environment (computed from the
    prompt, the stored messages and completion ids). The environment's `get_reward` column and reward functions that
    declare an `environments` parameter keep the values recorded when the episode ran: the environment that ran it is
    gone (the one TRL draws for the replayed row is reset but never acted on).

    `evaluate()` (every `eval_steps` with `eval_strategy="steps"`) logs TRL's evaluation loss and metrics, and adds the
    held-out metrics: it answers `eval_dataset`'s prompts (`eval_num_samples` each) and logs the success rate
    (`accuracy`, mean@k, pass@k) and each reward's mean.

    Batch keys added once replay groups exist: `exp_mask` (B, T), 1 on off-policy completion tokens;
    `old_per_token_logps` holding the recorded log-probs on those rows (and TRL's old log-probs on the others when it
    computes them); `replay_has_old_logps`, whether it did. `trainer.experience` is the buffer.
    """

    _tag_names = ["trl", "grpo", "trl-ext", "experience-replay", "exgrpo"]
    checkpoint_state_name = "replay_state"
    _name = "Replay GRPO"
    _paper = PAPER

    def __init__(self, model, reward_funcs=None, args: ReplayGRPOConfig | None = None, **kwargs):
        args = checked_args(args, ReplayGRPOConfig, "Replay-GRPO")
        refuse_rollout_func(
            kwargs,
            "ReplayGRPOTrainer",
            "it splices stored trajectories into TRL's own generation, "
            "which a rollout_func replaces. For multi-step episodes pass `environment_factory` or "
            "`tools`.",
        )
        check_datasets(kwargs, check_not_empty)
        super().__init__(model, reward_funcs=reward_funcs, args=args, **kwargs)
        # Reward columns that need the live environment: recorded at collection, kept when replayed.
        self._env_reward_columns = [
            i
            for i, f in enumerate(self.reward_funcs)
            if callable(f) and "environments" in inspect.signature(f).parameters
        ]

        if args.success_reward is None:
            self._success_index = 0
        elif args.success_reward in self.reward_func_names:
            self._success_index = self.reward_func_names.index(args.success_reward)
        else:
            raise ValueError(
                f"success_reward={args.success_reward!r} is not a reward function name; choose one of "
                f"{self.reward_func_names}."
            )
        self.experience = ExperienceManager(
            num_generations=self.num_generations,
            experience_lbound=args.experience_lbound,
            experience_rbound=args.experience_rbound,
            select_mode=args.exp_select_mode,
            max_trajectories_per_task=args.max_trajectories_per_task,
            max_buffer_tokens=args.max_buffer_tokens,
            max_policy_lag=args.max_policy_lag,
            bucket_weighting=args.bucket_weighting,
            seed=args.seed,
        )
        self.replay_active = False
        self._batch: ReplayBatch | None = None  # the latest training batch (also `_record` while it generates)
        self._capture_forward = None  # list receiving (logps, entropies) of the next policy forward

    # -- seams of GRPOTrainer ----------------------------------------------------------------------------------------
    def _replay_plan(self) -> ReplayPlan | None:
        """The plan of the training batch generating now, if it replays anything."""
        plan = self._record.plan if isinstance(self._record, ReplayBatch) else None
        return plan if plan is not None and plan.has_replay else None

    def _tokenize_prompts(self, prompts):
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        if (plan := self._replay_plan()) is not None:
            # Stored trajectories keep the prompt ids their log-probs were recorded with.
            prompt_ids = [
                stored if stored is not None else ids
                for ids, stored in zip(prompt_ids, plan.stored_prompt_ids, strict=True)
            ]
        return prompt_ids, images, multimodal_fields

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if (plan := self._replay_plan()) is not None and self._env_reward_columns:
            # In place: the batch's record holds this tensor.
            for row, trajectory in enumerate(plan.global_trajectories):
                if trajectory is not None and trajectory.env_rewards is not None:
                    for i in self._env_reward_columns:
                        rewards[row, i] = trajectory.env_rewards.get(self.reward_func_names[i], float("nan"))
        return rewards

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        """Run TRL's tool loop on the fresh rows only: a stored episode is over, and keeps its tool mask and messages."""
        plan = self._replay_plan()
        stored = plan.stored if plan is not None else [None] * len(completions)
        for i, trajectory in enumerate(stored):
            if trajectory is not None:  # no tool calls: TRL's loop leaves the row alone
                completions[i] = [{"role": "assistant", "content": ""}]
        tool_mask, completions, completion_ids, logprobs, *rest = super()._tool_call_loop(
            prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields
        )
        for i, trajectory in enumerate(stored):
            if trajectory is not None:
                n = trajectory.num_tokens
                tool_mask[i] = trajectory.tool_mask.int().tolist() if trajectory.tool_mask is not None else [1] * n
                completions[i] = trajectory.completion or completions[i]
        if isinstance(self._record, ReplayBatch):
            self._record.episodes = completions
        return tool_mask, completions, completion_ids, logprobs, *rest

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        capture = self._capture_forward
        if capture is None or (model is self.ref_model and model is not None):
            # A separate reference model is never captured (nor asked for entropies, which it may not compute).
            return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        self._capture_forward = None  # only the first (policy) forward: a reference-model pass may follow
        kwargs["compute_entropy"] = True
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        capture.extend([logps, entropies])
        return logps, entropies, aux

    def _fresh_generation(self, plan: ReplayPlan):
        """Route generation through a splice: generate the fresh rows only, insert stored completions.

        Wraps whatever `_generate_single_turn` is current (TRL's, or a test script), at instance level, for one call
        of `_generate_and_score_completions`. Every process generates `plan.fresh_max` rows (padding with repeats of a
        local prompt), one sample per row, so vLLM server mode slices the same row counts on every process.
        """
        inner = self._generate_single_turn

        def splice(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            if self._in_tool_loop:  # later turns of the fresh episodes
                return inner(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
            if images is not None or multimodal_fields:
                raise ValueError("ReplayGRPOTrainer supports text prompts only.")
            fresh = [i for i, stored in enumerate(plan.stored) if stored is None]
            padding = plan.fresh_max - len(fresh)
            rows = [prompt_ids[i] for i in fresh] + [prompt_ids[fresh[0] if fresh else 0]] * padding
            completions, logprobs = inner(rows, None, {}, 1)  # k < n: every process has fresh rows to generate
            out_ids, out_logprobs = [], []
            generated = iter(zip(completions, logprobs or [None] * len(completions), strict=True))
            for stored in plan.stored:
                if stored is None:
                    ids, lps = next(generated)
                    out_ids.append(ids)
                    out_logprobs.append(lps)
                else:
                    out_ids.append(stored.completion_ids.tolist())
                    # NaN: TRL gives these tokens no sampler correction (ratio 1) and leaves them out of its metrics.
                    out_logprobs.append([float("nan")] * stored.num_tokens)
            return out_ids, (out_logprobs if logprobs is not None else None)

        # Batches without replay groups make TRL's generation call unchanged.
        return scoped_call(self, _generate_single_turn=splice) if plan.has_replay else nullcontext()

    # -- the batch -----------------------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        # Shapes: B = len(inputs) rows per process (G per group, groups possibly spanning processes), T the padded
        # completion length; TRL's rewards are gathered, (W * B, F), and so are the plan's per-row lists.
        if not self.model.training:  # evaluation: plain GRPO, the buffer is neither used nor fed
            return super()._generate_and_score_completions(inputs)
        args = self.args
        if not self.replay_active and self.state.max_steps > 0:
            self.replay_active = self.state.global_step / self.state.max_steps >= args.replay_start_ratio

        # 1. Plan: which groups replay which buffered task (the last k rows of each are stored trajectories), from
        #    gathered task ids and a buffer that is identical on every process, so every process plans alike. The
        #    previous batch's collection first: this batch is planned from the buffer it updates.
        self._flush_pending()
        self._log_buffer()
        plan = self._plan_batch(list(inputs))
        batch = self._batch = ReplayBatch(plan=plan)

        # 2. TRL's batch, once: the splice generates the fresh rows only and inserts the stored completions; every
        #    row is re-scored by the current reward functions and normalised within its group. The first policy
        #    forward (old log-probs, when TRL computes them) is captured for the collection.
        capture = []
        with self.recording(batch), scoped_call(self, _capture_forward=capture), self._fresh_generation(plan):
            output = super()._generate_and_score_completions(plan.local_inputs)
        if not (capture and capture[0] is output.get("old_per_token_logps")):
            capture = []  # TRL computed no old log-probs; the forward caught, if any, was the reference model's

        # 3. Judge the fresh rollouts of every group (gathered: every process judges the same rows)
        success = self._success(batch.rewards_per_func)
        scored = self._scored(batch.rewards_per_func)
        fresh = ~torch.tensor(plan.global_stored, device=success.device) & scored
        solve_rate = success[fresh].float().mean().item() if fresh.any() else 0.0
        logps, entropies = capture if capture else (None, None)  # (B, T) each

        # 4. Experience collection: this process's successful fresh rollouts of tasks in the collection window
        outcomes, wanted = self._group_outcomes(plan, success, scored)
        local = [i - plan.offset for i in wanted if plan.offset <= i < plan.offset + len(plan.local_inputs)]
        records = {plan.offset + i: self._local_record(batch, output, i) for i in local}
        records = {row: record for row, record in records.items() if record is not None}
        pending = PendingCollection(outcomes, records, self.state.global_step, records_expected=bool(wanted))
        self._collect_or_defer(batch, output, pending, logps, entropies)

        # 5. Mark the off-policy rows for the loss: `exp_mask` (B, T), their recorded log-probs as old log-probs
        if plan.has_replay:
            self._log_fresh_sampling_ratio(plan, output)
            self._add_replay_keys(output, plan)
        if args.replay_start_solve_rate is not None and solve_rate > args.replay_start_solve_rate:
            self.replay_active = True
        self._log_batch(plan, output, solve_rate)
        return output

    def _plan_batch(self, inputs: list[dict]) -> ReplayPlan:
        """Decide replay groups, their trajectories and retired-task replacements, identically on every process."""
        if any("image" in x or "images" in x for x in inputs[:1]):
            raise ValueError("ReplayGRPOTrainer supports text prompts only; the dataset has an image column.")
        n = self.num_generations
        examples = gather_object(inputs)
        task_ids = [task_id_of(x, self.args.task_id_column) for x in examples]
        num_groups = len(examples) // n
        group_tasks = [task_ids[g * n] for g in range(num_groups)]
        group_examples = [examples[g * n] for g in range(num_groups)]
        retired = [g for g in range(num_groups) if group_tasks[g] in self.experience.retired]

        # Experience mixing: which groups replay a buffered task, and which task
        replay = self._mix_experience(group_tasks, retired, len(inputs)) if self.replay_active else {}
        # Trajectory selection: the last k rows of each replay group are stored trajectories of its task
        stored, stored_prompts = self._select_trajectories(replay, len(examples))
        for g, task in replay.items():
            group_tasks[g], group_examples[g] = task, self.experience.task_examples[task]
        # Retired tasks left without a replay task take the prompt of another group
        replaced, kept = self._replace_retired(retired, replay, group_tasks, group_examples)
        # This process's rows
        local = local_rows(self.accelerator, len(inputs))
        new_inputs = [
            inputs[i - local.start] if group_tasks[i // n] == task_ids[i] else dict(group_examples[i // n])
            for i in range(local.start, local.stop)
        ]
        fresh_counts = [
            sum(1 for trajectory in stored[r * len(inputs) : (r + 1) * len(inputs)] if trajectory is None)
            for r in range(self.accelerator.num_processes)
        ]
        return ReplayPlan(
            local_inputs=new_inputs,
            stored=stored[local],
            stored_prompt_ids=stored_prompts[local],
            group_tasks=group_tasks,
            global_stored=[s is not None for s in stored],
            global_trajectories=stored,
            fresh_max=max(fresh_counts),
            offset=local.start,
            num_replay_groups=len(replay),
            retired_replaced=replaced,
            retired_kept=kept,
        )

    def _mix_experience(self, group_tasks: list[str], retired: list[int], local_count: int) -> dict[int, str]:
        """The replay groups (`exp_ratio` of the groups, every retired task's first) and the buffered task of each.

        Fewer buffered tasks than slots leave the rest fresh."""
        args, n = self.args, self.num_generations
        num_groups = len(group_tasks)
        target = math.floor(args.exp_ratio * num_groups + 0.5)
        owner = [(g * n) // local_count for g in range(num_groups)]
        by_rank: dict[int, list[int]] = {}
        for g in range(num_groups):
            if g not in retired:
                by_rank.setdefault(owner[g], []).append(g)
        for groups in by_rank.values():
            self.experience.rng.shuffle(groups)
        # Round robin over processes, so each generates about as many fresh rows as the others (less padding).
        balanced = [g for rnd in zip_longest(*by_rank.values()) for g in rnd if g is not None]
        candidates = retired + balanced[: max(target - len(retired), 0)]
        tasks = self.experience.sample_tasks(
            len(candidates), args.offpolicy_trajectories_per_task, self.state.global_step, exclude=group_tasks
        )
        return dict(zip(candidates, tasks, strict=False))

    def _select_trajectories(self, replay: dict[int, str], num_rows: int):
        """Per row of the gathered batch, the stored trajectory it replays (or None) and that trajectory's prompt ids."""
        n, k = self.num_generations, self.args.offpolicy_trajectories_per_task
        stored: list[Trajectory | None] = [None] * num_rows
        stored_prompts: list[list[int] | None] = [None] * num_rows
        for g, task in replay.items():
            trajectories = self.experience.select_trajectories(task, k, self.state.global_step)
            for j, trajectory in enumerate(trajectories):
                row = g * n + n - k + j
                stored[row] = trajectory
                stored_prompts[row] = self.experience.task_prompt_ids[task].tolist()
        return stored, stored_prompts

    def _replace_retired(self, retired, replay, group_tasks, group_examples) -> tuple[int, int]:
        """Give each retired group without a replay task a random other group's task (in place); returns how many
        retired groups were replaced and how many kept their task (no other group to take from)."""
        donors = [
            g for g in range(len(group_tasks)) if g not in replay and group_tasks[g] not in self.experience.retired
        ]
        replaced = kept = 0
        for g in retired:
            if g in replay:
                replaced += 1
            elif donors:
                donor = donors[self.experience.rng.randrange(len(donors))]
                group_tasks[g], group_examples[g] = group_tasks[donor], group_examples[donor]
                replaced += 1
            else:
                kept += 1
        return replaced, kept

    # -- held-out evaluation (trainers/seams/heldout.py) -------------------------------------------------------------------
    def _heldout_records(self, rows, num_samples):
        """`num_samples` answers per prompt with the training turn's settings, scored by every reward function.
        Per sample: each reward (`None` when not applicable) and success as in training (`None`: not judged)."""
        prompts = [row["prompt"] for row in rows]
        rewards = self._heldout_samples(rows, prompts, num_samples, standing_generation(self)).rewards
        success, scored = self._success(rewards).tolist(), self._scored(rewards).tolist()
        return [
            {
                "rewards": [None if math.isnan(value) else value for value in values],
                "success": float(ok) if judged else None,
            }
            for values, ok, judged in zip(rewards.tolist(), success, scored, strict=True)
        ]

    def _heldout_metrics(self, rows, records):
        """`accuracy` (the success rate), `mean@k`, `pass@k` and counts (`trl_ext.evaluation.heldout_metrics`), then
        `rewards/<name>/mean` per reward function and `reward`, the weighted sum's mean, as TRL logs them."""
        k = len(records) // len(rows)
        metrics = sample_accuracy([[r["success"] for r in records[i * k : (i + 1) * k]] for i in range(len(rows))])
        rewards = torch.tensor([[math.nan if v is None else v for v in r["rewards"]] for r in records])
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"] = rewards[:, i].nanmean().item()
        scored = ~torch.isnan(rewards).all(dim=1)
        total = (rewards * self.reward_weights.cpu()).nansum(dim=1)[scored]
        metrics["reward"] = total.mean().item() if total.numel() else math.nan
        return metrics

    def _success(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        values = rewards_per_func[:, self._success_index]
        target = torch.full_like(values, self.args.success_value)
        return torch.isclose(values, target) & ~torch.isnan(values)

    def _scored(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Rows the success reward could judge: `None` (NaN, e.g. no gold answer) is neither success nor failure."""
        return ~torch.isnan(rewards_per_func[:, self._success_index])

    def _group_outcomes(self, plan: ReplayPlan, success, scored) -> tuple[list[GroupOutcome], list[int]]:
        """Per group of the gathered batch, its fresh successes among its judged rollouts; and the gathered rows to
        store: the successful fresh rollouts of tasks in the collection window."""
        n = self.num_generations
        outcomes, wanted = [], []
        for g, task in enumerate(plan.group_tasks):
            rows = [i for i in range(g * n, (g + 1) * n) if not plan.global_stored[i] and scored[i]]
            wins = [i for i in rows if success[i]]
            outcomes.append(GroupOutcome(task, len(wins), len(rows)))
            if self.experience.collects(len(wins), len(rows)):
                wanted.extend(wins)
        return outcomes, wanted

    def _local_record(self, batch: ReplayBatch, output, i: int) -> CollectedRow | None:
        length = int(output["completion_mask"][i].sum().item())
        if length == 0:  # masked out (e.g. truncated with mask_truncated_completions): nothing to replay
            return None
        if self._sampler_masked(output, i):  # trains at weight 0 now: not a trajectory to replay at full weight
            return None
        plan = batch.plan
        rewards = batch.rewards_per_func[plan.offset + i]
        tools = "tool_mask" in output and batch.episodes is not None
        return CollectedRow(
            completion_ids=output["completion_ids"][i, :length].cpu(),
            # The entropy that ranks stored trajectories is the model's, over its own tokens.
            completion_mask=(output["completion_mask"][i] * output.get("tool_mask", 1)[i]).cpu()
            if tools
            else output["completion_mask"][i].cpu(),
            reward=float(torch.nansum(rewards * self.reward_weights.to(rewards.device)).item()),
            prompt_ids=output["prompt_ids"][i][output["prompt_mask"][i].bool()].cpu(),
            example=plan.local_inputs[i],
            tool_mask=output["tool_mask"][i, :length].bool().cpu() if tools else None,
            completion=batch.episodes[i] if tools else None,
            env_rewards={self.reward_func_names[c]: float(rewards[c]) for c in self._env_reward_columns} or None,
        )

    @staticmethod
    def _sampler_masked(output, i: int) -> bool:
        """Whether TRL's vLLM importance-sampling correction zeroed row `i`: its whole sequence (`sequence_mask`, the
        default) or any of its model tokens (`token_mask`), the sampler/trainer ratio being out of its bounds."""
        ratio = output.get("importance_sampling_ratio")
        if ratio is None:
            return False
        row = ratio[i]
        if row.numel() == 1:
            return bool(row.item() == 0)
        return bool((row[_model_tokens(output)[i]] == 0).any())

    def _log_fresh_sampling_ratio(self, plan: ReplayPlan, output) -> None:
        """Keep TRL's `sampling/importance_sampling_ratio/*` to the fresh rows (same aggregation: min, mean of the
        per-process means, max). A replayed row has no sampler log-probs: TRL gives it ratio 1, which measures
        nothing and would pull the figures towards 1. A collective: `plan` is the same on every process."""
        ratio = output.get("importance_sampling_ratio")
        if ratio is None:
            return
        fresh = torch.tensor([s is None for s in plan.stored], device=ratio.device)
        values = ratio[fresh].flatten() if ratio.size(1) == 1 else ratio[fresh][_model_tokens(output)[fresh]]
        if values.numel():
            local = torch.stack([values.min(), values.mean(), values.max()]).float()
        else:
            local = torch.full((3,), math.nan, device=ratio.device)
        gathered = self.accelerator.gather(local.unsqueeze(0)).view(-1, 3)
        metrics = self._metrics["train"]
        for column, (name, reduce) in enumerate((("min", nanmin), ("mean", torch.nanmean), ("max", nanmax))):
            key = f"sampling/importance_sampling_ratio/{name}"
            if metrics.get(key):  # TRL's value of this batch, over every row
                metrics[key][-1] = reduce(gathered[:, column]).item()

    def _add_replay_keys(self, output, plan: ReplayPlan):
        """`exp_mask` on the stored rows' completion tokens; their recorded log-probs in `old_per_token_logps`.

        On-policy rows keep TRL's old log-probs when TRL computed them. When it did not (aligned steps, no vLLM),
        their entries are zeros that the loss never reads (`replay_has_old_logps` is 0): as in GRPOTrainer, the
        current log-probs stand in for them.
        """
        completion_mask = output["completion_mask"]
        exp_mask = torch.zeros_like(completion_mask)
        old = output.get("old_per_token_logps")
        has_old = old is not None
        old = old.clone() if has_old else torch.zeros(completion_mask.shape, device=completion_mask.device)
        for i, trajectory in enumerate(plan.stored):
            if trajectory is None:
                continue
            length = trajectory.num_tokens
            exp_mask[i, :length] = completion_mask[i, :length]
            if self.args.exp_is_correct:
                old[i, :length] = trajectory.logps.to(old.device, old.dtype)
        output["exp_mask"] = exp_mask
        output["old_per_token_logps"] = old
        output["replay_has_old_logps"] = torch.tensor(has_old, device=completion_mask.device)

    # -- experience collection -----------------------------------------------------------------------------------
    # The fresh successes of a batch are stored with the log-probs and entropy of the policy's first forward pass over
    # them. When TRL computed old log-probs (that forward, at generation) they are collected at once. Otherwise the
    # collection waits for the first loss forward over those rows (same weights: TRL skips old log-probs only when no
    # optimizer step falls inside a generation batch), and is applied, identically on every process, before the next
    # batch is planned, at the end of training and before a checkpoint. The whole mechanism: `_collect_or_defer`,
    # `_collecting_forward`, `_flush_pending`, `_collect`.

    def _collect_or_defer(self, batch: ReplayBatch, output, pending: PendingCollection, logps, entropies) -> None:
        """Collect `pending` now with the generation forward's `logps` and `entropies` `(B, T)`, or (none) mark its
        rows in `output["replay_collect"]` (`(B,)`: the gathered row index, -1 for rows not stored) for the loss."""
        plan = batch.plan
        if logps is not None or not pending.records_expected:
            for row, record in pending.records.items():
                record.fill(logps[row - plan.offset], entropies[row - plan.offset])
            self._collect(pending)
            return
        batch.collection = pending
        rows = torch.full((len(plan.local_inputs),), -1, dtype=torch.long, device=output["completion_ids"].device)
        for row in pending.records:
            rows[row - plan.offset] = row
        output["replay_collect"] = rows

    @contextmanager
    def _collecting_forward(self, inputs: dict, needed: bool):
        """Capture the policy's `(log-probs, entropies)` of the loss forward inside the block (`needed`: the caller
        reads them) and give them to the rows of a waiting collection that this micro-batch holds."""
        pending = self._batch.collection if self._batch is not None else None
        collect = inputs.get("replay_collect") if pending is not None else None
        capture = []
        with scoped_call(self, _capture_forward=capture if needed or collect is not None else None):
            yield capture
        if collect is not None and capture:
            logps, entropies = capture
            for i in torch.nonzero(collect >= 0).flatten().tolist():
                record = pending.records.get(int(collect[i]))
                if record is not None and record.logps is None:
                    record.fill(logps[i], entropies[i])

    def _collect(self, pending: PendingCollection) -> None:
        """Gather the stored rows of every process and update the buffer, identically everywhere."""
        n = self.num_generations
        records = [
            (row, r.trajectory_fields(pending.step), r.prompt_ids, r.example)
            for row, r in pending.records.items()
            if r.logps is not None
        ]
        by_row = {row: rest for row, *rest in gather_object(records)} if pending.records_expected else {}
        for g, outcome in enumerate(pending.outcomes):
            for row in range(g * n, (g + 1) * n):
                if row in by_row:
                    fields, prompt, example = by_row[row]
                    outcome.candidates.append(Trajectory(task_id=outcome.task_id, **fields))
                    outcome.prompt_ids, outcome.example = prompt, example
        self.experience.update(pending.outcomes, pending.step)

    def _flush_pending(self) -> None:
        """Apply a collection that waited for the loss forward (a collective: every process calls it together)."""
        if self._batch is not None and self._batch.collection is not None:
            pending, self._batch.collection = self._batch.collection, None
            self._collect(pending)

    def train(self, *args, **kwargs):
        output = super().train(*args, **kwargs)
        self._flush_pending()  # the last generation batch's rollouts
        return output

    # -- the loss --------------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        if "exp_mask" not in inputs:  # no replayed rows: GRPOTrainer's loss
            with self._collecting_forward(inputs, needed=False):
                return super()._compute_loss(model, inputs)
        args = self.args
        mode = "train" if self.model.training else "eval"

        # 1. Split the loss tokens (B, T): on-policy (fresh rows) and off-policy (replayed rows), disjoint.
        exp_mask = inputs["exp_mask"]
        base = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
        on_mask, off_mask = base * (1 - exp_mask), base * exp_mask
        tool_mask = inputs["tool_mask"] if "tool_mask" in inputs else torch.ones_like(exp_mask)
        on_inputs = {**inputs, "tool_mask": tool_mask * (1 - exp_mask)}
        if not bool(inputs.get("replay_has_old_logps", True)):
            del on_inputs["old_per_token_logps"]  # TRL computed none: the parent uses the current log-probs

        # 2. GRPOTrainer's loss on the on-policy tokens; its forward's log-probs (B, T) serve the off-policy part too.
        with self._collecting_forward(inputs, needed=True) as capture:
            on_loss = super()._compute_loss(model, on_inputs)
        per_token_logps = capture[0]

        # 3. Off-policy tokens: importance ratio to the recorded log-probs, dual-clip or shaping loss (B, T), + KL.
        recorded = inputs["old_per_token_logps"] if args.exp_is_correct else None
        log_ratio, clamped = importance_log_ratio(per_token_logps, recorded)
        off_token_loss = off_policy_token_loss(
            log_ratio,
            inputs["advantages"],
            mode=args.off_policy_loss,
            epsilon_low=self.epsilon_low,
            cliprange_high=args.off_cliprange_high,
            clip_ratio_c=args.clip_ratio_c,
            shaping_beta=args.shaping_beta,
        )
        if self.beta != 0.0:  # TRL's KL term, on the off-policy tokens too
            off_token_loss = off_token_loss + self.beta * k3_kl(per_token_logps, inputs["ref_per_token_logps"])
        # 4. One aggregation over all tokens with the configured `loss_type`, as TRL normalises it (the token count
        #    `num_items_in_batch` is global: every process divides by the same number).
        loss = add_off_policy_loss(
            on_loss,
            off_token_loss,
            on_mask,
            off_mask,
            self.loss_type,
            accumulation_steps=self.current_gradient_accumulation_steps,
            max_completion_length=self.max_completion_length,
            num_items_in_batch=inputs.get("num_items_in_batch"),
            num_processes=self.accelerator.num_processes,
            steps_per_generation=args.steps_per_generation,
            training=mode == "train",
        )
        self._log_loss(mode, on_loss, off_token_loss, log_ratio, per_token_logps, recorded, on_mask, off_mask, clamped)
        return loss

    # -- metrics ---------------------------------------------------------------------------------------------------
    def _log_loss(
        self, mode, on_loss, off_token_loss, log_ratio, per_token_logps, recorded, on_mask, off_mask, clamped
    ):
        # Collective calls in the same order on every process, whether or not it holds off-policy rows.
        off = off_mask.bool()
        ratio = torch.exp(log_ratio.detach())
        drift = (recorded - per_token_logps.detach()).abs() if recorded is not None else torch.zeros_like(ratio)
        big = torch.finfo(ratio.dtype).max
        sums = torch.stack(
            [
                off_mask.sum().float(),
                (on_mask + off_mask).sum().float(),
                ratio[off].sum(),
                drift[off].sum(),
                off_token_loss.detach()[off].sum(),
                clamped.float().to(ratio.device),
            ]
        )
        total = self.accelerator.reduce(sums, reduction="sum")
        lowest = torch.where(off, ratio, torch.full_like(ratio, big)).min()
        highest = torch.where(off, ratio, torch.full_like(ratio, -big)).max()
        extremes = torch.stack([lowest, -highest])
        extremes = self.accelerator.gather(extremes).view(-1, 2).min(dim=0).values
        on = self.accelerator.gather(on_loss.detach().reshape(1)).mean()
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        metrics = self._metrics[mode]
        num_off, num_all = total[0].item(), total[1].item()
        metrics["replay/offpolicy_token_ratio"].append(num_off / max(num_all, 1.0))
        metrics["replay/on_pg_loss"].append(on.item() * accumulation)
        metrics["replay/log_ratio_clamped"].append(total[5].item())
        if num_off > 0:
            metrics["replay/importance_ratio_mean"].append(total[2].item() / num_off)
            metrics["replay/importance_ratio_min"].append(extremes[0].item())
            metrics["replay/importance_ratio_max"].append(-extremes[1].item())
            if recorded is not None:
                metrics["replay/logp_drift"].append(total[3].item() / num_off)
            metrics["replay/off_pg_loss"].append(total[4].item() / num_off)

    def _log_batch(self, plan: ReplayPlan, output, solve_rate: float):
        metrics = self._metrics["train"]
        fresh_local = torch.tensor([s is None for s in plan.stored], device=output["completion_mask"].device)
        fresh_tokens = (output["completion_mask"].sum(-1) * fresh_local).sum()
        metrics["replay/active"].append(float(self.replay_active))
        metrics["replay/replay_groups"].append(plan.num_replay_groups)
        metrics["replay/fresh_tokens"].append(self.accelerator.gather(fresh_tokens.reshape(1)).sum().item())
        metrics["replay/solve_rate"].append(solve_rate)
        metrics["replay/retired_replaced"].append(plan.retired_replaced)
        metrics["replay/retired_kept"].append(plan.retired_kept)

    def _log_buffer(self):
        """The buffer a batch is planned from (collections of earlier batches applied, this batch's not yet)."""
        metrics, exp = self._metrics["train"], self.experience
        metrics["replay/buffer_tasks"].append(exp.num_tasks)
        metrics["replay/buffer_trajectories"].append(exp.num_trajectories)
        metrics["replay/buffer_bytes"].append(exp.nbytes)
        metrics["replay/buffer_tokens"].append(exp.num_tokens)
        metrics["replay/num_retired"].append(len(exp.retired))
        for bucket in range(self.num_generations + 1):
            metrics[f"replay/bucket/{bucket}"].append(len(exp.difficulty2task.get(bucket, ())))

    # -- checkpoints -------------------------------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        self._flush_pending()  # a collective: the checkpoint holds every collection of the batches trained so far
        super()._save_checkpoint(model, trial)

    def checkpoint_state(self) -> dict:
        return {"experience": self.experience.state_dict(), "replay_active": self.replay_active}

    def load_checkpoint_state(self, state: dict) -> None:
        self.experience.load_state_dict(state["experience"])
        self.replay_active = bool(state["replay_active"])


def _model_tokens(output) -> torch.Tensor:
    """`(N, T)` bool: the completion tokens the model sampled (tool output, which has no sampler ratio, left out)."""
    mask = output["completion_mask"].bool()
    return mask & output["tool_mask"].bool() if "tool_mask" in output else mask
