"""The RLCR recipe's evaluation of the base model before the format warm-up runs on every rank, on the rank's training
device (tests/scripts/base_eval_ranks.py), never on one rank while the others wait in a collective."""

from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


SCRIPT = Path(__file__).parents[1] / "scripts" / "base_eval_ranks.py"


@pytest.mark.multiprocess
def test_every_rank_evaluates_the_base_model_on_its_training_device(tmp_path):
    ranks = run_torchrun(SCRIPT, nproc=2, args=[str(tmp_path)], timeout=300)
    assert [r["world_size"] for r in ranks] == [2, 2]
    for rank in ranks:
        assert rank["devices"] == [rank["training_device"]]  # moved to the device the rank trains on
        assert len(rank["rows"]) == 3
    assert ranks[0]["rows"] == ranks[1]["rows"]  # the same greedy evaluation on both
    assert [r["wrote"] for r in ranks] == [True, False]  # the main process writes the report
