"""RLCR recipe runs made elsewhere (a GPU machine, say) collected into one result file, with every held-out answer.

    python benchmarks/recipe_runs.py NAME RUN_DIR [RUN_DIR ...] --device "NVIDIA H100 80GB HBM3" --commit SHA \
        --command "python recipes/rlcr.py --use_cpu false ..."

Each RUN_DIR is an RLCR recipe's output directory (`metrics.json`, `evaluation_settings.json`, `eval_<phase>.json` and
`.jsonl` for the phases base, before and after). Writes `benchmarks/results/NAME.json` (per run: the settings, the
times, and per phase the metrics with their bootstrap intervals and the sampling-agreement reference) and
`NAME.jsonl` (every held-out answer, tagged with its run and phase), then `NAME.png`. The run's own machine, commit and
command are recorded under `source`, since the collecting machine's provenance describes only the collection.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib


matplotlib.use("Agg")
import matplotlib.pyplot as plt
from common import results_dir, write_result


PHASES = ("base", "before", "after")
SHOWN = ("auroc", "auroc_within_groups", "brier_skill")  # what a constant or a level-only confidence cannot score


def collect(run_dir: Path) -> tuple[dict, list[dict]]:
    """One run's entry and its per-answer records."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    entry = {
        "settings": json.loads((run_dir / "evaluation_settings.json").read_text()),
        "seconds": metrics.get("seconds"),
        "phases": {},
    }
    records = []
    for phase in PHASES:
        path = run_dir / f"eval_{phase}.json"
        if not path.is_file():
            continue
        entry["phases"][phase] = {k: v for k, v in json.loads(path.read_text()).items() if k != "rows"}
        with open(run_dir / f"eval_{phase}.jsonl") as f:
            records += [{"run": run_dir.name, "phase": phase, **json.loads(line)} for line in f if line.strip()]
    return entry, records


def plot(result: dict, path: Path) -> None:
    """Per run, after RL: the stated confidence's AUROC, AUROC within levels and Brier skill, beside the sampling
    agreement's, with their 95% intervals."""
    runs = list(result["runs"])
    fig, axes = plt.subplots(1, len(SHOWN), figsize=(4.2 * len(SHOWN), 3.6))
    for ax, metric in zip(axes, SHOWN):
        for offset, (label, pick) in enumerate(
            (("stated confidence", lambda p: p), ("sampling agreement", lambda p: p.get("sampling_agreement") or {}))
        ):
            for i, run in enumerate(runs):
                phase = pick(result["runs"][run]["phases"].get("after", {}))
                value = phase.get(metric)
                if value is None:
                    continue
                low, high = (phase.get("intervals") or {}).get(metric) or (value, value)
                x = i + (offset - 0.5) * 0.3
                ax.errorbar(
                    x,
                    value,
                    yerr=[[value - low], [high - value]],
                    fmt="o",
                    color=f"C{offset}",
                    capsize=3,
                    label=label if i == 0 else None,
                )
        ax.axhline(0.5 if "auroc" in metric else 0.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(runs)), runs)
        ax.set_title(metric.replace("_", " "))
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{result['name']}: after RL, report split (dashed: what a constant scores)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="result file stem under benchmarks/results/")
    parser.add_argument("runs", nargs="+", type=Path, help="RLCR recipe output directories")
    parser.add_argument("--device", required=True, help="the machine the runs trained on")
    parser.add_argument("--commit", required=True, help="the commit the runs trained with")
    parser.add_argument("--command", action="append", required=True, help="each run's command line (repeatable)")
    args = parser.parse_args(argv)
    entries, records = {}, []
    for run_dir in args.runs:
        entries[run_dir.name], run_records = collect(run_dir)
        records += run_records
    seeds = sorted({entry["settings"].get("seed") for entry in entries.values()})
    result = {
        "name": args.name,
        "source": {"device": args.device, "commit": args.commit, "commands": args.command},
        "runs": entries,
    }
    path = write_result(results_dir() / f"{args.name}.json", result, seeds=seeds, records=records)
    plot(result, path.with_suffix(".png"))
    print(f"{path}: {len(entries)} runs, {len(records)} records")


if __name__ == "__main__":
    sys.exit(main())
