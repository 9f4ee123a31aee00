"""Configuration of [`ReplayGRPOTrainer`]."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.experience import BUCKET_WEIGHTINGS, SELECT_MODES
from ..core.offpolicy_loss import OFF_POLICY_LOSSES
from .base import TrlExtGRPOConfig


@dataclass
class ReplayGRPOConfig(TrlExtGRPOConfig):
    r"""
    Configuration for [`ReplayGRPOTrainer`]: GRPO with experience replay of successful trajectories (ExGRPO-style).

    Every [`~trl.GRPOConfig`] field applies; the names below follow the ExGRPO code base where it has one.

    Parameters:
        replay_start_ratio (`float`, *optional*, defaults to `0.35`):
            Replay starts once `global_step / max_steps` reaches this ratio. Before, training is plain GRPO while the
            buffer is collected.
        replay_start_solve_rate (`float`, *optional*):
            Alternative trigger (ExGRPO): replay also starts, and stays on, once the solve rate of a generation batch's
            fresh rollouts exceeds this value. `None` disables it.
        exp_ratio (`float`, *optional*, defaults to `0.5`):
            Fraction of the prompt groups of a generation batch that are replay groups once replay is active (rounded
            half up). If the buffer holds fewer replayable tasks, ordinary prompts fill the rest.
        offpolicy_trajectories_per_task (`int`, *optional*, defaults to `1`):
            `k`: stored trajectories in a replay group, next to `num_generations - k` fresh rollouts. Must be below
            `num_generations`, so that every group keeps a fresh baseline.
        max_trajectories_per_task (`int`, *optional*, defaults to `10`):
            Per-task cap on stored trajectories. At least `offpolicy_trajectories_per_task`.
        exp_select_mode (`str`, *optional*, defaults to `"argmin"`):
            Which successful rollout of a group is stored and which stored ones are replayed: `"argmin"` (lowest mean
            token entropy over the completion), `"argmax"` or `"random"`. Under the cap, `argmin`/`argmax` replace the
            worst stored trajectory, `random` is first-in first-out.
        experience_lbound (`int`, *optional*, defaults to `0`):
            Tasks are collected when `experience_lbound < successes`.
        experience_rbound (`int`, *optional*):
            ... and `successes < experience_rbound` (successes among `num_generations` fresh rollouts; exclusive).
            Defaults to `num_generations`: tasks solved every time are retired instead. ExGRPO's bound of the same
            name is inclusive (`lbound < successes <= rbound`): its value `r` is `r + 1` here (its recipe's 7 of 8
            rollouts is 8 here, the default).
        max_buffer_tokens (`int`, *optional*, defaults to `20_000_000`):
            Bound on the tokens held by the buffer (prompt ids once per task plus completion ids, ~8 bytes per
            completion token with its recorded log-prob). The oldest policy version is evicted first. `None`:
            unbounded.
        max_policy_lag (`int`, *optional*):
            Trajectories collected more than this many steps ago are not replayed. `None`: no age limit.
        bucket_weighting (`str`, *optional*, defaults to `"uniform"`):
            How replay tasks are drawn from the success buckets: `"uniform"` over non-empty buckets, or `"gaussian"`
            centred at `num_generations / 2` with sd 1 (ExGRPO).
        off_policy_loss (`str`, *optional*, defaults to `"clip"`):
            Loss of replayed tokens: `"clip"`, dual-clip PPO with range `[1 - epsilon_low, 1 + off_cliprange_high]` and
            `clip_ratio_c` for negative advantages; or `"shaping"`, `-A * w / (w + shaping_beta)` with the ratio `w`
            unclipped.
        off_cliprange_high (`float`, *optional*, defaults to `1.0`):
            Upper clip range of off-policy ratios.
        clip_ratio_c (`float`, *optional*, defaults to `3.0`):
            Dual-clip bound for negative advantages on off-policy tokens. Greater than 1.
        shaping_beta (`float`, *optional*, defaults to `0.1`):
            `beta` of the shaping loss. Positive.
        exp_is_correct (`bool`, *optional*, defaults to `True`):
            Importance-correct replayed tokens with the log-probs recorded at collection. `False` uses the current
            log-probs (ratio 1).
        success_value (`float`, *optional*, defaults to `1.0`):
            A rollout succeeds when its success reward equals this value.
        success_reward (`str`, *optional*):
            Name of the reward function whose value decides success. Defaults to the first reward function
            (typically accuracy).
        task_id_column (`str`, *optional*, defaults to `"task_id"`):
            Dataset column holding a stable task id. When the dataset has no such column, the id is a hash of the
            prompt.
    """

    replay_start_ratio: float = field(
        default=0.35, metadata={"help": "Replay starts at global_step / max_steps >= this."}
    )
    replay_start_solve_rate: float | None = field(
        default=None, metadata={"help": "Also start replay once a batch's fresh solve rate exceeds this."}
    )
    exp_ratio: float = field(default=0.5, metadata={"help": "Fraction of groups that are replay groups."})
    offpolicy_trajectories_per_task: int = field(
        default=1, metadata={"help": "k: stored trajectories per replay group (< num_generations)."}
    )
    max_trajectories_per_task: int = field(default=10, metadata={"help": "Per-task cap on stored trajectories."})
    exp_select_mode: str = field(default="argmin", metadata={"help": "argmin | argmax | random (by mean entropy)."})
    experience_lbound: int = field(default=0, metadata={"help": "Collect tasks with successes > this."})
    experience_rbound: int | None = field(
        default=None,
        metadata={"help": "Collect tasks with successes < this (exclusive; ExGRPO's inclusive r is r + 1 here)."},
    )
    max_buffer_tokens: int | None = field(
        default=20_000_000, metadata={"help": "Bound on buffered tokens; oldest policy version evicted first."}
    )
    max_policy_lag: int | None = field(default=None, metadata={"help": "Do not replay trajectories older than this."})
    bucket_weighting: str = field(default="uniform", metadata={"help": "uniform | gaussian bucket sampling."})
    off_policy_loss: str = field(default="clip", metadata={"help": "clip | shaping loss on replayed tokens."})
    off_cliprange_high: float = field(default=1.0, metadata={"help": "Upper clip range of off-policy ratios."})
    clip_ratio_c: float = field(default=3.0, metadata={"help": "Dual-clip bound for negative advantages (> 1)."})
    shaping_beta: float = field(default=0.1, metadata={"help": "beta of the shaping loss w / (w + beta)."})
    exp_is_correct: bool = field(default=True, metadata={"help": "Importance-correct with recorded log-probs."})
    success_value: float = field(default=1.0, metadata={"help": "Reward value that counts as a success."})
    success_reward: str | None = field(
        default=None, metadata={"help": "Reward function deciding success (default: the first one)."}
    )
    task_id_column: str = field(default="task_id", metadata={"help": "Dataset column with a stable task id."})

    def __post_init__(self):
        super().__post_init__()
        # A replayed group's fresh rows go to vLLM one per request.
        self.check_generation_kwargs("generation_kwargs", None, one_per_request=self.use_vllm)
        n, k = self.num_generations, self.offpolicy_trajectories_per_task
        for name in ("replay_start_ratio", "exp_ratio"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1] (got {value}).")
        if self.replay_start_solve_rate is not None and not 0.0 <= self.replay_start_solve_rate <= 1.0:
            raise ValueError(
                f"replay_start_solve_rate must be in [0, 1] or None (got {self.replay_start_solve_rate})."
            )
        if not 1 <= k < n:
            raise ValueError(
                f"offpolicy_trajectories_per_task must be at least 1 and below num_generations={n} (got {k}): a "
                "replay group needs fresh rollouts for its baseline. Lower it or raise num_generations."
            )
        if self.max_trajectories_per_task < k:
            raise ValueError(
                f"max_trajectories_per_task ({self.max_trajectories_per_task}) must be at least "
                f"offpolicy_trajectories_per_task ({k}), or no task could ever be replayed."
            )
        if self.experience_rbound is None:
            self.experience_rbound = n
        if not 0 <= self.experience_lbound < self.experience_rbound <= n:
            raise ValueError(
                f"Need 0 <= experience_lbound < experience_rbound <= num_generations={n} (got "
                f"{self.experience_lbound}, {self.experience_rbound})."
            )
        if self.experience_rbound - self.experience_lbound < 2:
            raise ValueError(
                f"No success count lies strictly between experience_lbound={self.experience_lbound} and "
                f"experience_rbound={self.experience_rbound}: widen the window."
            )
        choices = {
            "exp_select_mode": SELECT_MODES,
            "bucket_weighting": BUCKET_WEIGHTINGS,
            "off_policy_loss": OFF_POLICY_LOSSES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed} (got {getattr(self, name)!r}).")
        if self.max_buffer_tokens is not None and self.max_buffer_tokens < 1:
            raise ValueError(f"max_buffer_tokens must be positive or None (got {self.max_buffer_tokens}).")
        if self.max_policy_lag is not None and self.max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0 or None (got {self.max_policy_lag}).")
        if not self.off_cliprange_high > 0:
            raise ValueError(f"off_cliprange_high must be positive (got {self.off_cliprange_high}).")
        if not self.clip_ratio_c > 1:
            raise ValueError(f"clip_ratio_c must be greater than 1 (got {self.clip_ratio_c}).")
        if not self.shaping_beta > 0:
            raise ValueError(f"shaping_beta must be positive (got {self.shaping_beta}).")
        if not self.task_id_column:
            raise ValueError("task_id_column must name a dataset column.")
