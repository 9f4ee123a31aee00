"""`answer_refill_rounds` over two torchrun ranks holding different numbers of all-equal groups: both make the same
generation calls with the same row counts (no deadlock), and the gathered batch equals one process's."""

from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


SCRIPT = Path(__file__).parents[2] / "scripts" / "rlcr_refill_ranks.py"


def answer(call, gold):
    return f"<think>call {call}</think><answer>{gold}</answer>"


@pytest.mark.multiprocess
def test_ranks_make_equal_calls_and_match_one_process():
    single = run_torchrun(SCRIPT, nproc=1, timeout=600)[0]
    ranks = run_torchrun(SCRIPT, nproc=2, timeout=600)
    assert single["world_size"] == 1 and [r["world_size"] for r in ranks] == [2, 2]

    # Rank 0 has 2 all-equal groups (A, B), rank 1 one (D): round 1 regenerates 2 groups on each; after it each has
    # one (B; D); in round 3 rank 1 has none and fills the call with one of its own.
    assert ranks[0]["calls"] == ranks[1]["calls"] == [4, 4, 2, 2, 8]  # answers, 3 rounds, confidences
    assert single["calls"] == [8, 6, 4, 2, 16]

    expected = [
        answer(1, 1), answer(1, 0),  # A: replaced by round 1's mixed group
        answer(0, 2), answer(0, 2),  # B: all right in every round, its first answers kept
        answer(0, 3), answer(0, 0),  # C: mixed from the start
        answer(2, 4), answer(2, 0),  # D: replaced by round 2's mixed group
    ]  # fmt: skip
    assert ranks[0]["answers"] + ranks[1]["answers"] == single["answers"] == expected
    a = 0.5 / (0.5**0.5 + 1e-4)
    gathered = ranks[0]["answer_advantages"] + ranks[1]["answer_advantages"]
    assert gathered == pytest.approx(single["answer_advantages"], abs=1e-6)
    assert gathered == pytest.approx([a, -a, 0, 0, a, -a, a, -a], abs=1e-5)

    # Metrics come from gathered data: the same on both ranks and in one process.
    metrics = {
        "answer/refilled_groups": 2.0,
        "answer/refill_rows": 16.0,  # (2 + 1 + 1) groups per rank x 2 ranks x 2 answers
        "answer/frac_reward_zero_std_sampled": 0.75,  # A, B, D
        "frac_reward_zero_std": 0.25,  # B
    }
    assert ranks[0]["metrics"] == ranks[1]["metrics"] == pytest.approx(metrics)
    assert single["metrics"]["answer/refilled_groups"] == 2.0 and single["metrics"]["frac_reward_zero_std"] == 0.25
    assert single["metrics"]["answer/refill_rows"] == 12.0  # 3 + 2 + 1 groups x 2 answers (no fillers)
    assert ranks[0]["accuracy"] == single["accuracy"] == pytest.approx(5 / 8)

    # Groups split over the ranks are refused when refill is on.
    assert "answer_refill_rounds needs each prompt's num_generations=4 answers" in ranks[0]["refused"]
