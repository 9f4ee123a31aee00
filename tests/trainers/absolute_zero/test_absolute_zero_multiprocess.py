"""Two torchrun ranks, one of which holds the prompts that need reproposing: no deadlock, and the same batch and
metrics as one process."""

from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


SCRIPT = Path(__file__).parents[2] / "scripts" / "absolute_zero_ranks.py"


def by_role(result, role):
    return [a for a, r in zip(result["advantages"], result["row_kind"]) if r == role]


@pytest.mark.multiprocess
def test_repropose_on_one_rank_only():
    single = run_torchrun(SCRIPT, nproc=1, args=["8"], timeout=600)[0]
    ranks = run_torchrun(SCRIPT, nproc=2, args=["4"], timeout=600)
    assert single["world_size"] == 1 and [r["world_size"] for r in ranks] == [2, 2]
    assert Path(single["package"]).parent.parent == SCRIPT.parent.parent.parent  # this checkout's trl_ext

    # Same calls, same row counts on both ranks (the collectives line up): round 1 for all 4 prompts, round 2 for
    # C and D (one each), round 3 for D (rank 1 pads with a copy).
    assert ranks[0]["calls"] == ranks[1]["calls"] == [[2, 4], [2, 6], [2, 2], [2, 4], [2, 2], [2, 2]]
    assert single["calls"] == [[2, 8], [2, 10], [2, 4], [2, 6], [2, 2], [2, 2]]  # 5 questions, then 3, then 1

    # Rank 0's rows then rank 1's equal the single process's rows, role by role.
    for role in (0, 1):
        assert by_role(ranks[0], role) + by_role(ranks[1], role) == pytest.approx(by_role(single, role), abs=1e-6)
    solver_trained = [t for r in ranks for t, role in zip(r["trained"], r["row_kind"]) if role == 0]
    assert solver_trained == [True] * 6 + [False] * 2  # D is unresolved
    assert any(abs(a) > 0.1 for a in by_role(single, 1))  # proposer rewards [1, 1, 1, -0.5] have contrast

    assert ranks[0]["scripted_log"] == ranks[1]["scripted_log"]
    for key, value in single["scripted_log"].items():
        if not key.startswith("generation/"):  # padding rows are counted as generated
            assert ranks[0]["scripted_log"][key] == pytest.approx(value, abs=1e-6), key
    assert single["scripted_log"]["repropose/total_attempts"] == 3  # C and D, then D
    assert ranks[0]["real_log"] == ranks[1]["real_log"]
    assert ranks[0]["digest"] == ranks[1]["digest"]
