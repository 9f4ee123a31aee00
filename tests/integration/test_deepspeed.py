"""The three trainers under DeepSpeed ZeRO-2 and ZeRO-3 (CPU, one process) make the same updates as without DeepSpeed."""

from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


pytest.importorskip("deepspeed")
SCRIPT = Path(__file__).parents[1] / "scripts" / "deepspeed_steps.py"


TRAINERS = ("rlcr", "replay", "absolute_zero")


@pytest.fixture(scope="module")
def runs():
    # one launch: the plain runs first (DeepSpeed's configuration outlives its trainer in the process)
    configs = [f"{trainer}:{stage}" for stage in (0, 2, 3) for trainer in TRAINERS]
    return run_torchrun(SCRIPT, nproc=1, args=configs)[0]


@pytest.mark.multiprocess
@pytest.mark.parametrize("trainer", TRAINERS)
def test_zero_stages_match_plain_training(runs, trainer):
    plain = runs[f"{trainer}:0"]
    assert plain["engine"] != "DeepSpeedEngine" and len(plain["entropy"]) >= 3
    if trainer == "replay":
        assert max(plain["replayed"]) > 0  # replay groups were trained
    for stage in (2, 3):
        zero = runs[f"{trainer}:{stage}"]
        assert zero["engine"] == "DeepSpeedEngine" and zero["zero_stage"] == stage
        # the gradient norm of step t depends on the weights after step t - 1: equal norms, equal updates
        assert zero["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4), stage
        for key in ("loss", "entropy", "replayed"):
            assert zero[key] == pytest.approx(plain[key], abs=1e-6), (stage, key)
