"""Proposer rewards and padded row counts, pure functions over one generation batch (docs/design.md, Absolute
Zero); their advantages are `trl_ext.core.advantages.group_advantages` / `batch_baseline_advantages`.

A question group is the `K` proposals of one seed prompt. Each proposal is invalid (`learnable is None`), or valid
with a learnability verdict and a solve rate (fraction of its solver responses counted as solved).
"""

from __future__ import annotations

from collections.abc import Sequence


MODES = ("learnability", "azr", "azr_code")


def proposer_rewards(
    learnable: Sequence[bool | None],
    solve_rates: Sequence[float | None],
    unresolved: bool,
    mode: str,
    invalid_reward: float = -1.0,
    repropose_penalty: float = -0.5,
    uniform_reward: float = -0.5,
) -> list[float]:
    """Rewards of one question group's proposals.

    - `"learnability"` (seeds): 1.0 if learnable, 0.0 if not; `repropose_penalty` for every valid proposal of a prompt
      still unresolved after the last repropose attempt.
    - `"azr"` (the Absolute Zero paper): `1 - solve_rate` when `0 < solve_rate < 1`, else 0.
    - `"azr_code"` (Absolute Zero's released code): `1 - solve_rate` when `0 < solve_rate < 1`, else
      `uniform_reward` (-0.5 there): a valid question that every response, or none, solves is penalised, not neutral.
    Invalid proposals get `invalid_reward` in every mode.
    """
    if mode not in MODES:
        raise ValueError(f"proposer_reward_mode must be one of {MODES} (got {mode!r}).")
    rewards = []
    for ok, rate in zip(learnable, solve_rates, strict=True):
        if ok is None:
            rewards.append(float(invalid_reward))
        elif mode == "learnability":
            rewards.append(float(repropose_penalty) if unresolved else float(ok))
        elif 0.0 < rate < 1.0:
            rewards.append(1.0 - rate)
        else:
            rewards.append(float(uniform_reward) if mode == "azr_code" else 0.0)
    return rewards


def padded_rows(num_rows: int, num_processes: int, multiple: int) -> int:
    """Rows per process when `num_rows` rows are spread over `num_processes` processes, each holding a multiple of
    `multiple` rows (TRL's `split_tensor_dict` drops a remainder); the extra rows are zero-loss padding."""
    per_process = -(-num_rows // num_processes)
    return -(-per_process // multiple) * multiple
