"""The refill bookkeeping (trl_ext/core/refill.py) against hand-computed rounds."""

import math

import pytest
import torch

from trl_ext.core.refill import GroupRefill, equal_reward_groups, mixed_reward_groups


nan = math.nan


def test_equal_and_mixed_groups():
    values = torch.tensor([1.0, 1, 1, 0, 0, 0, 0, 1, nan, nan, 1, nan])
    assert equal_reward_groups(values, 2).tolist() == [True, False, True, False, False, True]
    assert mixed_reward_groups(values, 2).tolist() == [False, True, False, True, False, False]
    # groups of 3: [1, 1, 1] equal; [0, 0, 0]; [0, 1, nan] mixed; [nan, 1, nan] equal (one scored value)
    assert equal_reward_groups(values, 3).tolist() == [True, True, False, True]
    assert mixed_reward_groups(values, 3).tolist() == [False, False, True, False]


def two_rounds():
    """2 processes x 3 groups of 2 answers. Process 0: [1, 1] [1, 0] [0, 0]; process 1: [0, 1] [nan, nan] [1, 1]."""
    first = torch.tensor([1.0, 1, 1, 0, 0, 0, 0, 1, nan, nan, 1, 1])
    plan = GroupRefill(first, num_processes=2, group_size=2)
    assert plan.pending == [[0, 2], [2]] and plan.equal_before == 3  # the unscored group is not refilled
    # Round 1: K = 2; process 1 repeats its one pending group as a filler.
    assert plan.next_round() == [[0, 2], [2, 2]]
    # process 0: group 0 -> [1, 0] (mixed: replaced), group 2 -> [0, 0]; process 1: group 2 -> [1, 1], the
    # filler -> [0, 1] (mixed, but a filler: discarded)
    round1 = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 1])
    assert plan.accept(round1) == 1
    assert plan.pending == [[2], [2]]
    # Round 2: K = 1; process 0's group 2 stays [0, 0], process 1's group 2 becomes [0, 1].
    assert plan.next_round() == [[2], [2]]
    round2 = torch.tensor([0.0, 0, 0, 1])
    assert plan.accept(round2) == 1
    assert plan.pending == [[2], []] and plan.replaced == 2 and plan.round_sizes == [2, 1]
    return plan, [first, round1, round2]


def test_rounds_replace_only_mixed_real_slots():
    plan, _ = two_rounds()
    assert plan.source == [[(1, 0), (0, 1), (0, 2)], [(0, 0), (0, 1), (2, 0)]]
    assert plan.next_round() == [[2], [0]]  # a third round: process 1, with none pending, fills with its group 0


def test_filler_of_a_process_without_pending_groups_is_its_first_group():
    plan = GroupRefill(torch.tensor([1.0, 0, 1, 1, 0, 1, 0, 1]), num_processes=2, group_size=2)
    assert plan.next_round() == [[1], [0]]
    assert plan.accept(torch.tensor([1.0, 1, 0, 1])) == 0  # process 1's mixed filler replaces nothing
    assert plan.source == [[(0, 0), (0, 1)], [(0, 0), (0, 1)]]


def test_indices_into_the_rounds_batches():
    plan, rounds = two_rounds()
    # process 0's concatenation: 6 first rows, 4 of round 1, 2 of round 2; group 0 from round 1 slot 0
    assert plan.local_index(0) == [6, 7, 2, 3, 4, 5]
    assert plan.local_index(1) == [0, 1, 2, 3, 10, 11]  # group 2 from round 2 (rows 6 + 4 + 0, 1)
    # gathered: 12 first rows, 8 of round 1 (process 1's from 16), 4 of round 2 (process 1's from 22)
    assert plan.gathered_index() == [12, 13, 2, 3, 4, 5, 6, 7, 8, 9, 22, 23]
    assert plan.gathered_sources()[:2] == [(1, 0), (1, 1)] and plan.gathered_sources()[-2:] == [(2, 2), (2, 3)]
    final = torch.cat(rounds)[plan.gathered_index()]
    torch.testing.assert_close(final, torch.tensor([1.0, 0, 1, 0, 0, 0, 0, 1, nan, nan, 0, 1]), equal_nan=True)


def test_nothing_pending_means_no_round():
    plan = GroupRefill(torch.tensor([1.0, 0, 0, 1]), num_processes=1, group_size=2)
    assert plan.next_round() is None and plan.round_sizes == []
    assert plan.local_index(0) == plan.gathered_index() == [0, 1, 2, 3]


def test_misuse_raises():
    with pytest.raises(ValueError, match="whole groups"):
        GroupRefill(torch.zeros(6), num_processes=2, group_size=2)
    plan = GroupRefill(torch.zeros(4), num_processes=1, group_size=2)
    with pytest.raises(RuntimeError, match="next_round"):
        plan.accept(torch.zeros(4))
