"""Sandbox throughput: executions per second of `trl_ext.sandbox`, against an earlier design of the sandbox (its fork
server text from git, `--baseline-ref`) and a cold interpreter per snippet, in the same run.

    python benchmarks/sandbox_bench.py [--rounds 5] [--sandbox-n 300] [--cold-n 40] [--baseline-ref 160e146]
    python benchmarks/sandbox_bench.py --baseline-tree /path/to/other/checkout --results-name sandbox_vs_main

Two programs: a trivial one (`result = 1`) and a typical Absolute Zero program (a small function with a loop and a
dict, called once). Each runs sequentially and with 2 workers, (a) in the sandbox (fork server and zygote, one fresh
isolated child per snippet), (b) in the baseline sandbox (the fork server of `--baseline-ref`, driven by today's
host side: the design before issue 21, whose children were forked from the server itself, without a system-call
filter; or, with `--baseline-tree`, the whole sandbox package of another checkout, host side included), and (c) as a
cold `python -I -c` process per snippet (no isolation at all). Rounds are interleaved so that
load changes on a shared machine hit every configuration alike; the median and the minimum over rounds are
reported, with the load average. Also: the sandbox's overhead per execution (sequential wall time per snippet minus
the time the same code takes with `exec` in this process), the fork server's own measure of each execution, and the
CPU time the servers and their children spend per execution, which bounds throughput on an idle core.

Results: benchmarks/results/sandbox_throughput.json and .png (`--results-name` for another name).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from common import results_dir, write_result

import trl_ext.sandbox.pool as pool_module
from trl_ext.sandbox import SandboxPool
from trl_ext.sandbox.interpreter import sandbox_interpreter
from trl_ext.sandbox.pool import Limits


RESULTS = results_dir()
PROGRAMS = {
    "trivial": "result = 1",
    "typical": (
        "def f(nums, k):\n"
        "    counts = {}\n"
        "    best = 0\n"
        "    for i, n in enumerate(nums):\n"
        "        counts[n] = counts.get(n, 0) + 1\n"
        "        if counts[n] * k + i > best:\n"
        "            best = counts[n] * k + i\n"
        "    return best, sorted(counts)[:3]\n"
        "result = f([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9], 3)"
    ),
}


class BaselinePool(SandboxPool):
    """A pool whose servers run another fork server text (the comparison only)."""

    def __init__(self, source: Path):
        super().__init__()
        self.source = source

    def _acquire(self):
        current, pool_module.SERVER_SOURCE = pool_module.SERVER_SOURCE, self.source
        try:
            return super()._acquire()
        finally:
            pool_module.SERVER_SOURCE = current


def baseline_source(ref: str, directory: str) -> Path:
    text = subprocess.run(
        ["git", "show", f"{ref}:trl_ext/sandbox/forkserver.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout
    path = Path(directory) / "forkserver_baseline.py"
    path.write_text(text)
    return path


def baseline_commit(args) -> str:
    """The baseline's commit: `--baseline-ref` resolved, or the `--baseline-tree` checkout's HEAD (`-dirty` when its
    tracked files differ from it)."""
    tree = args.baseline_tree or Path(__file__).resolve().parents[1]
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, check=True, cwd=tree).stdout.strip()  # noqa: E731
    if not args.baseline_tree:
        return git("rev-parse", args.baseline_ref)
    return git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def baseline_tree_pool(tree: str) -> SandboxPool:
    """A pool of the sandbox package of another checkout (its host side, filter and fork server), imported under
    another name next to this one."""
    package = Path(tree).resolve() / "trl_ext" / "sandbox"
    spec = importlib.util.spec_from_file_location(
        "baseline_sandbox", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_sandbox"] = module
    spec.loader.exec_module(module)
    return module.SandboxPool()


def sandbox_rate(pool: SandboxPool, code: str, n: int, workers: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    results = pool.run_many([code] * n, "result", Limits(), workers)
    elapsed = time.perf_counter() - start
    assert all(r.ok for r in results), results[0]
    return n / elapsed, [r.duration_s for r in results]


def cold_rate(interpreter: str, code: str, n: int, workers: int) -> float:
    def once(_):
        done = subprocess.run(
            [interpreter, "-I", "-c", code + "\nprint(repr(result))"], capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(once, range(n)))
    return n / (time.perf_counter() - start)


def in_process_s(code: str, n: int = 2000) -> float:
    compiled = compile(code, "<snippet>", "exec")
    start = time.perf_counter()
    for _ in range(n):
        exec(compiled, {"__name__": "__main__"})
    return (time.perf_counter() - start) / n


def server_cpu_s(pool: SandboxPool) -> float:
    """CPU seconds of the pool's fork servers, their zygotes and every child they have reaped (psutil: user + system
    + children)."""
    total = 0.0
    for server in list(pool._servers):
        procs = [psutil.Process(server.proc.pid)]
        procs += procs[0].children(recursive=True)
        for proc in procs:
            try:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.NoSuchProcess:
                pass
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sandbox-n", type=int, default=300, help="snippets per sandbox measurement")
    parser.add_argument("--cold-n", type=int, default=40, help="snippets per cold-interpreter measurement")
    parser.add_argument(
        "--baseline-ref",
        default="160e146",
        help="git revision whose trl_ext/sandbox/forkserver.py is the baseline design",
    )
    parser.add_argument(
        "--baseline-tree", help="a checkout whose whole trl_ext/sandbox package is the baseline (instead of a ref)"
    )
    parser.add_argument("--results-name", default="sandbox_throughput", help="results file name, without suffix")
    args = parser.parse_args()

    interpreter = sandbox_interpreter()
    tmp = tempfile.TemporaryDirectory()
    baseline = (
        baseline_tree_pool(args.baseline_tree)
        if args.baseline_tree
        else BaselinePool(baseline_source(args.baseline_ref, tmp.name))
    )
    pools = {"sandbox": SandboxPool(), "baseline": baseline}
    info = pools["sandbox"].info()
    for pool in pools.values():
        pool.run_many(["result = 0"] * 8, "result", Limits(), 2)  # start both servers of each (warm-up)
    load_before = os.getloadavg()
    rates: dict[str, list[float]] = {}
    durations: dict[str, list[float]] = {}
    cpu_per_exec: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, code in PROGRAMS.items():
            for workers in (1, 2):
                for kind, pool in pools.items():
                    key = f"{name}/{kind}/{workers}w"
                    cpu = server_cpu_s(pool)
                    rate, dur = sandbox_rate(pool, code, args.sandbox_n, workers)
                    cpu_per_exec.setdefault(key, []).append((server_cpu_s(pool) - cpu) / args.sandbox_n)
                    rates.setdefault(key, []).append(rate)
                    durations.setdefault(key, []).extend(dur)
                rates.setdefault(f"{name}/cold/{workers}w", []).append(
                    cold_rate(interpreter, code, args.cold_n, workers)
                )
    load_after = os.getloadavg()
    for pool in pools.values():
        pool.close()

    summary = {}
    for name, code in PROGRAMS.items():
        inproc = in_process_s(code)
        row = {"in_process_ms": 1e3 * inproc}
        for workers in (1, 2):
            for kind in ("sandbox", "baseline", "cold"):
                values = rates[f"{name}/{kind}/{workers}w"]
                row[f"{kind}_per_s_{workers}w"] = statistics.median(values)
                row[f"{kind}_per_s_{workers}w_min"] = min(values)
            for kind in ("sandbox", "baseline"):
                row[f"{kind}_server_cpu_ms_per_exec_{workers}w"] = 1e3 * statistics.median(
                    cpu_per_exec[f"{name}/{kind}/{workers}w"]
                )
            # Per round, then the median: both ran in the same round, under the same load.
            ratios = [a / b for a, b in zip(rates[f"{name}/sandbox/{workers}w"], rates[f"{name}/baseline/{workers}w"])]
            row[f"vs_baseline_{workers}w_median"] = statistics.median(ratios)
            row[f"vs_baseline_{workers}w_min"] = min(ratios)
            row[f"speedup_vs_cold_{workers}w"] = row[f"sandbox_per_s_{workers}w"] / row[f"cold_per_s_{workers}w"]
        row["overhead_ms_per_exec"] = 1e3 / row["sandbox_per_s_1w"] - row["in_process_ms"]
        row["server_measured_ms_median"] = 1e3 * statistics.median(durations[f"{name}/sandbox/1w"])
        summary[name] = row
        print(
            f"{name}: sandbox {row['sandbox_per_s_1w']:.0f}/s sequential (min {row['sandbox_per_s_1w_min']:.0f}), "
            f"{row['sandbox_per_s_2w']:.0f}/s with 2 workers; baseline {row['baseline_per_s_1w']:.0f}/s and "
            f"{row['baseline_per_s_2w']:.0f}/s (per-round ratio, median {row['vs_baseline_1w_median']:.2f} and "
            f"{row['vs_baseline_2w_median']:.2f}); cold interpreter {row['cold_per_s_1w']:.1f}/s and "
            f"{row['cold_per_s_2w']:.1f}/s; server CPU {row['sandbox_server_cpu_ms_per_exec_1w']:.2f} ms/exec "
            f"(baseline {row['baseline_server_cpu_ms_per_exec_1w']:.2f})"
        )

    payload = {
        "command": "python benchmarks/sandbox_bench.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "machine": {"cpus": os.cpu_count(), "load_average_before": load_before, "load_average_after": load_after},
        "baseline": {"tree": args.baseline_tree, "commit": baseline_commit(args)},
        "isolation": info,
        "interpreter": interpreter,
        "summary": summary,
        "rounds": rates,
        "server_cpu_s_per_exec": cpu_per_exec,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_result(RESULTS / f"{args.results_name}.json", payload)  # no seeds: nothing is random
    plot(summary, RESULTS / f"{args.results_name}.png", load_before)


def plot(summary: dict, path: Path, load: tuple):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values, colors = [], [], []
    for name, row in summary.items():
        for kind, color in (("sandbox", "tab:blue"), ("baseline", "tab:cyan"), ("cold", "tab:gray")):
            for workers in (1, 2):
                labels.append(f"{name}\n{kind} {workers}w")
                values.append(row[f"{kind}_per_s_{workers}w"])
                colors.append(color)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    bars = ax.bar(range(len(values)), values, color=colors)
    ax.bar_label(bars, fmt="%.0f")
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylabel("executions / s")
    ax.set_title(
        f"trl_ext.sandbox (zygote, isolated child per snippet) vs its earlier design and a cold interpreter\n"
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at start"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
