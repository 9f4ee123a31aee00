"""Two torchrun ranks agree with one process on the same RLCR batch, and neither deadlocks."""

from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


SCRIPT = Path(__file__).parents[2] / "scripts" / "rlcr_ranks.py"


def split(result):
    adv, kind = result["advantages"], result["row_kind"]
    return [a for a, k in zip(adv, kind) if k == 0], [a for a, k in zip(adv, kind) if k == 1]


@pytest.mark.multiprocess
def test_two_ranks_match_a_single_process():
    single = run_torchrun(SCRIPT, nproc=1, args=["4"], timeout=600)[0]
    ranks = run_torchrun(SCRIPT, nproc=2, args=["2"], timeout=600)
    assert single["world_size"] == 1 and [r["world_size"] for r in ranks] == [2, 2]

    # Each group of G_a = 4 answers spans both ranks; gathered, the advantages equal the single-process ones.
    answers, confidences = split(single)
    rank_answers = [split(r)[0] for r in ranks]
    rank_confidences = [split(r)[1] for r in ranks]
    assert rank_answers[0] + rank_answers[1] == pytest.approx(answers, abs=1e-6)
    assert rank_confidences[0] + rank_confidences[1] == pytest.approx(confidences, abs=1e-6)
    assert any(abs(a) > 0 for a in confidences)  # the prompt-level normalisation had something to normalise

    # Metrics are computed on gathered data: identical on both ranks and equal to the single process.
    assert ranks[0]["scripted_log"] == ranks[1]["scripted_log"]
    for key, value in single["scripted_log"].items():
        assert ranks[0]["scripted_log"][key] == pytest.approx(value, abs=1e-6), key
    assert ranks[0]["real_log"] == ranks[1]["real_log"]
    assert ranks[0]["digest"] == ranks[1]["digest"]
