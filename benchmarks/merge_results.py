"""Merge result files of runs that belong together (e.g. the same ablation run in parts, on several machines) into
one result file, by script rather than by hand:

    python benchmarks/merge_results.py benchmarks/results/rlcr_ablation_h100.json run_a.json run_b.json

The output holds the runs' union, the settings every input shares, and per input its provenance and its own settings
(`merged_from`); the inputs' per-sample records (`records_file`, JSONL beside each) are concatenated beside it. The
output records the merge's own provenance.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import merge_results, write_result

from trl_ext.evaluation.records import read_jsonl


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="the merged result JSON (its records go beside it as .jsonl)")
    parser.add_argument("inputs", type=Path, nargs="+", help="result JSONs written by the benchmark scripts")
    args = parser.parse_args(argv)
    results = {path.name: json.loads(path.read_text()) for path in args.inputs}
    records = []
    for path, result in zip(args.inputs, results.values()):
        if result.get("records_file"):
            records += [{"file": path.name, **r} for r in read_jsonl(path.parent / result["records_file"])]
    merged = merge_results(results)
    write_result(args.output, merged, seeds=None, records=records or None)
    print(f"{len(merged['runs'])} runs from {len(results)} files -> {args.output}")


if __name__ == "__main__":
    main()
