"""Two processes report the held-out metrics of one (tests/scripts/heldout_ranks.py): RLCR greedy (answers, then
the confidence turn), Replay sampled (two samples per question) and Absolute Zero's solver (per level), five questions, so that the two ranks' shares are
padded and answered in chunks. Scripted answers must give the single process's metrics on both ranks; the tiny
model's real answers must give the same metrics on both ranks (and not hang). `evaluate()`, which adds them to TRL's
evaluation loss and metrics, gives the same on both ranks."""

import math
from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


SCRIPT = Path(__file__).parents[1] / "scripts" / "heldout_ranks.py"
TRAINERS = ["rlcr", "replay", "absolute_zero"]


def same(a, b):
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(b[key]), key
        else:
            assert b[key] == pytest.approx(value, abs=1e-9), key


@pytest.mark.multiprocess
def test_two_processes_report_the_metrics_of_one():
    single = run_torchrun(SCRIPT, nproc=1, args=TRAINERS, timeout=300)[0]
    ranks = run_torchrun(SCRIPT, nproc=2, args=TRAINERS, timeout=300)
    # by hand (scripted): RLCR answers 1+2 right, 4+4 wrong, 2*3 right, 9-5 unparsable, 7+1 without gold
    assert single["rlcr"]["scripted"]["eval_answer/accuracy"] == pytest.approx(0.5)
    assert single["rlcr"]["scripted"]["eval_num_missing_gold"] == 1
    # Replay: sample 0 as RLCR's, sample 1 flipped; 7+1 has no gold answer (unscored)
    assert single["replay"]["scripted"]["eval_mean@2"] == pytest.approx(0.5)
    assert single["replay"]["scripted"]["eval_pass@2"] == pytest.approx(1.0)
    # Absolute Zero: 15 right, 104 wrong, 40 right, 32 unparsable, 1+1 without gold (unscored)
    solver = single["absolute_zero"]["scripted"]
    assert solver["eval_accuracy"] == pytest.approx(0.5) and solver["eval_num_unscored"] == 1
    assert solver["eval_accuracy/level_1"] == pytest.approx(0.5) and solver["eval_accuracy/level_3"] == 1.0
    for name in TRAINERS:
        assert single[name]["world_size"] == 1 and [r[name]["world_size"] for r in ranks] == [2, 2]
        for rank in ranks:
            same(single[name]["scripted"], rank[name]["scripted"])
            logged = {k: v for k, v in rank[name]["logged"].items() if k not in ("step", "epoch")}
            same(rank[name]["real"], logged)  # returned as logged
        same(ranks[0][name]["real"], ranks[1][name]["real"])
        # evaluate(): TRL's loss (gathered: the same on both ranks) with the held-out metrics
        contract = [rank[name]["evaluate"] for rank in ranks]
        assert contract[0] == contract[1] and math.isfinite(contract[0]["loss"])
        assert "eval_loss" in contract[0]["keys"] and set(single[name]["real"]) <= set(contract[0]["keys"])
    # the same generation calls with the same row counts on both ranks: a share of 3 questions in chunks of 2 and 1
    assert ranks[0]["rlcr"]["calls"] == ranks[1]["rlcr"]["calls"] == [[2, 1], [2, 1], [1, 1], [1, 1]]
    assert ranks[0]["replay"]["calls"] == ranks[1]["replay"]["calls"] == [[4, 2], [2, 2]]
    assert ranks[0]["absolute_zero"]["calls"] == ranks[1]["absolute_zero"]["calls"] == [[2, 1], [1, 1]]
