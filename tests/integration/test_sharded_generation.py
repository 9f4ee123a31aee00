"""The model's own `model.generate` (greedy, not scripted) under ZeRO-3 and FSDP2 with two processes, for every
trainer's turns, with one rank's completions stopping before the other's: no hang, the same completions and figures
as one process; and FSDP2's all-gathers per generate call with and without `reshard_after_forward`.

One torchrun launch per process count runs every configuration in sequence (tests/scripts/sharded_generation.py).
The completions of a group are identical (greedy), so the advantages, the loss and its gradient are zero: the figures
that must agree are the completion lengths and the entropy of the trained model's forward over them.
"""

from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


pytest.importorskip("deepspeed")
SCRIPT = Path(__file__).parents[1] / "scripts" / "sharded_generation.py"
TRAINERS = ("rlcr", "replay", "absolute_zero")
# FSDP2 first, ZeRO-3 last: DeepSpeed's configuration outlives its trainer in the process
BACKENDS = ("fsdp2", "fsdp2_kept", "zero3")
NUM_LAYERS = 2  # the tiny model's decoder layers, each an FSDP2 unit


@pytest.fixture(scope="module")
def one_process():
    return run_torchrun(SCRIPT, nproc=1, args=[f"{t}:plain" for t in TRAINERS], timeout=300)[0]


@pytest.fixture(scope="module")
def two_processes():
    return run_torchrun(SCRIPT, nproc=2, args=[f"{t}:{b}" for b in BACKENDS for t in TRAINERS], timeout=480)


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("trainer", TRAINERS)
def test_two_processes_generate_what_one_does(one_process, two_processes, trainer, backend):
    single = one_process[f"{trainer}:plain"]
    ranks = [result[f"{trainer}:{backend}"] for result in two_processes]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["engine"] for r in ranks] == ["DeepSpeedEngine" if backend == "zero3" else "FSDP2"] * 2
    # per generate call (answers then confidences; proposals then solutions), rank 0's rows then rank 1's
    assert len(single["calls"]) == len(ranks[0]["calls"]) == len(ranks[1]["calls"])
    for whole, first, second in zip(single["calls"], ranks[0]["calls"], ranks[1]["calls"]):
        assert first["completions"] + second["completions"] == whole["completions"]
    # the first call's completions stop earlier on one rank than on the other
    assert max(ranks[0]["calls"][0]["lengths"]) != max(ranks[1]["calls"][0]["lengths"])
    for rank in ranks:
        assert rank["logged"].keys() == single["logged"].keys()
        for key, value in single["logged"].items():
            assert rank["logged"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.multiprocess
@pytest.mark.parametrize("trainer", TRAINERS)
def test_fsdp2_all_gathers_per_token_unless_kept_gathered(two_processes, trainer):
    # Both ranks run a forward per decoded token until the longest completion of either is done (synced_gpus).
    first, second = (result[f"{trainer}:fsdp2"]["calls"] for result in two_processes)
    steps = [max(a["lengths"] + b["lengths"]) for a, b in zip(first, second, strict=True)]
    for result in two_processes:
        resharded, kept = result[f"{trainer}:fsdp2"], result[f"{trainer}:fsdp2_kept"]
        for call, decoded in zip(resharded["calls"], steps, strict=True):
            assert call["all_gathers"] >= NUM_LAYERS * decoded  # every layer, every token
        # (transformers' `warning_once` shows it once per process; the script records each call)
        assert resharded["warnings"] and all("fsdp2_generation.yaml" in w for w in resharded["warnings"])
        # reshard_after_forward=False: each unit gathered once in the step's first call, none after (no backward yet)
        assert 0 < kept["calls"][0]["all_gathers"] <= kept["fsdp_units"]
        assert all(call["all_gathers"] == 0 for call in kept["calls"][1:])
        assert kept["warnings"] == []
