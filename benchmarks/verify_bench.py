"""Verifier time bounds: wall time of one accuracy batch with N hostile answers, with and without the batch deadline,
and `normalize_answer` on nested `\\boxed{` against the nesting depth.

    python benchmarks/verify_bench.py        # writes benchmarks/results/verify_bounds.{json,png}

The JSON records its provenance (commit, package versions, device, command line; no seeds: nothing is random).

Hostile answers here are pairs that keep sympy busy until the per-pair budget (`0.8 * TRL_EXT_VERIFY_TIMEOUT_S`)
interrupts them; without a batch deadline they queue one after another.
"""

from __future__ import annotations

import math
import time

from common import results_dir, write_result

from trl_ext.rewards import normalize_answer
from trl_ext.rewards import verify as verify_module


COUNTS = [1, 2, 4, 8]
DEPTHS = [1_000, 4_000, 16_000, 64_000]
RESULTS = results_dir()


def hostile_pairs(n: int) -> list[tuple[str, str]]:
    """`n` distinct hostile pairs: four kinds in turn, the k-th of a kind with its constants shifted by k (the verifier
    checks each distinct pair once, so a repeated pair would cost nothing)."""
    kinds = [
        lambda k: ("\\log(5+e)", str(1_000_000 + k)),
        lambda k: ("10", f"\\sin({128 + k}x)"),
        lambda k: ("7", f"\\sin(x+1)^{{{60 + k}}}"),
        lambda k: ("42", f"(x+y+z+w)^{{{60 + k}}}"),
    ]
    return [kinds[i % len(kinds)](i // len(kinds)) for i in range(n)]


def batch_seconds(n: int, batch_timeout: float) -> tuple[float, int]:
    verify_module.VERIFY_BATCH_TIMEOUT_S = batch_timeout
    pairs = hostile_pairs(n)
    start = time.perf_counter()
    _, unverified = verify_module.verify_answers_counted(pairs)
    return time.perf_counter() - start, unverified


def main():
    default_deadline = verify_module.VERIFY_BATCH_TIMEOUT_S
    verify_module.verify_answer("1/2", "0.5")  # start the worker outside the timings
    hostile = {"per_pair_timeout_s": verify_module.VERIFY_TIMEOUT_S, "batch_timeout_s": default_deadline, "rows": []}
    for n in COUNTS:
        without, _ = batch_seconds(n, math.inf)
        with_deadline, unverified = batch_seconds(n, default_deadline)
        hostile["rows"].append(
            {
                "hostile_answers": n,
                "seconds_without_deadline": without,
                "seconds_with_deadline": with_deadline,
                "unverified": unverified,
            }
        )
        print(
            f"{n} hostile: {without:.1f} s without the batch deadline, {with_deadline:.1f} s with it "
            f"({unverified} unverified)"
        )
    boxed = []
    for depth in DEPTHS:
        text = "\\boxed{" * depth + "7" + "}" * depth
        start = time.perf_counter()
        assert normalize_answer(text) == "7"
        boxed.append({"depth": depth, "seconds": time.perf_counter() - start})
        print(f"boxed depth {depth}: {boxed[-1]['seconds'] * 1000:.1f} ms")

    RESULTS.mkdir(parents=True, exist_ok=True)
    write_result(RESULTS / "verify_bounds.json", {"hostile_batch": hostile, "nested_boxed": boxed})  # before the plot
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    rows = hostile["rows"]
    left.plot(COUNTS, [r["seconds_without_deadline"] for r in rows], marker="o", label="no batch deadline")
    left.plot(COUNTS, [r["seconds_with_deadline"] for r in rows], marker="o", label=f"deadline {default_deadline:g} s")
    left.set(xlabel="hostile answers in the batch", ylabel="seconds", title="accuracy batch, verify time")
    left.legend()
    right.plot(DEPTHS, [b["seconds"] * 1000 for b in boxed], marker="o")
    right.set(xlabel="\\boxed{ nesting depth", ylabel="ms", title="normalize_answer", xscale="log", yscale="log")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.savefig(RESULTS / "verify_bounds.png", dpi=110)


if __name__ == "__main__":
    main()
