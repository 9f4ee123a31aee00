"""Two processes under ZeRO-3 and FSDP2 (and RLCR under DDP) make the same steps as one process.

One torchrun launch per process count runs every configuration in sequence (tests/scripts/sharded_steps.py); the
per-step loss and gradient norm of the two-process runs must match the one-process run at the same global batch.
The two ranks train different rows, so a missing gradient synchronisation shows: the `nosync` runs, with the
gradient reduce-scatter switched off, must not match.

RLCR runs with `share_prefix=True` (the default: one packed loss forward) and with `share_prefix=False` (one loss
forward per row kind); with the latter rank 0 gets a micro-batch of confidence rows
only while rank 1's micro-batches hold both kinds: before every process made the same forwards, this hung under DDP,
ZeRO-3 and FSDP2, which the launch's timeout turns into a failure.
"""

from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


pytest.importorskip("deepspeed")
SCRIPT = Path(__file__).parents[1] / "scripts" / "sharded_steps.py"
# rlcr: share_prefix=False; rlcr_packed: the default; rlcr_kl_answers: a reference model, none for the confidence turn
TRAINERS = ("rlcr", "rlcr_packed", "rlcr_kl_answers", "rlcr_temperatures", "replay", "absolute_zero")
BACKENDS = ("zero3", "fsdp2")
ENGINES = {"plain": "DistributedDataParallel", "zero3": "DeepSpeedEngine", "fsdp2": "FSDP2"}
# DDP first, ZeRO-3 last: DeepSpeed's configuration outlives its trainer in the process (a later plain run would be
# wrapped by DeepSpeed too); RLCR first, so that a hang fails the launch early
TWO_PROCESS = [
    "rlcr:plain",
    *(f"{t}:fsdp2" for t in TRAINERS),
    "rlcr:fsdp2:nosync",
    *(f"{t}:zero3" for t in TRAINERS),
    "rlcr:zero3:nosync",
]
CASES = [("rlcr", "plain"), *((t, b) for t in TRAINERS for b in BACKENDS)]


@pytest.fixture(scope="module")
def one_process():
    return run_torchrun(SCRIPT, nproc=1, args=[f"{t}:plain" for t in TRAINERS], timeout=300)[0]


@pytest.fixture(scope="module")
def two_processes():
    return run_torchrun(SCRIPT, nproc=2, args=TWO_PROCESS, timeout=480)


@pytest.mark.multiprocess
@pytest.mark.parametrize(("trainer", "backend"), CASES, ids=[f"{t}-{b}" for t, b in CASES])
def test_two_processes_make_the_steps_of_one(one_process, two_processes, trainer, backend):
    single = one_process[f"{trainer}:plain"]
    ranks = [result[f"{trainer}:{backend}"] for result in two_processes]
    assert single["world_size"] == 1 and [r["world_size"] for r in ranks] == [2, 2]
    assert [r["engine"] for r in ranks] == [ENGINES[backend]] * 2
    assert ranks[0]["rows"] != ranks[1]["rows"]  # the ranks trained different rows
    assert len(single["grad_norm"]) >= 2  # step 2 starts from the weights step 1 left
    for rank in ranks:
        assert rank["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
        assert rank["loss"] == pytest.approx(single["loss"], rel=1e-4, abs=1e-6)
    if trainer == "rlcr":  # rank 0 has a micro-batch without answer rows, rank 1 none
        assert [1] in ranks[0]["kinds"] and [0, 1] in ranks[0]["kinds"]
        assert all(kinds == [0, 1] for kinds in ranks[1]["kinds"])


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", BACKENDS)
def test_without_gradient_sync_the_steps_differ(one_process, two_processes, backend):
    """The negative control: each rank keeping its own gradient moves the figures well beyond the tolerance."""
    single = one_process["rlcr:plain"]["grad_norm"]
    unsynced = two_processes[0][f"rlcr:{backend}:nosync"]["grad_norm"]
    assert all(abs(a - b) > 0.05 * b for a, b in zip(unsynced, single, strict=True))


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["zero3", "fsdp2"])
def test_heldout_evaluation_under_sharding_agrees_on_every_process(backend):
    """`evaluate()` after ZeRO-3 or FSDP2 training: the model's own greedy answers (generation gathers the sharded
    parameters, a collective) on shares of two questions, rank 1's padded; no hang, the same metrics everywhere."""
    config = f"rlcr:{backend}:eval"
    ranks = [result[config] for result in run_torchrun(SCRIPT, nproc=2, args=[config])]
    assert [r["engine"] for r in ranks] == [ENGINES[backend]] * 2
    assert ranks[1]["eval"] == pytest.approx(ranks[0]["eval"], rel=0, abs=0, nan_ok=True)
    assert ranks[0]["eval"]["eval_num_questions"] == 3 and ranks[0]["eval"]["eval_num_samples"] == 3
