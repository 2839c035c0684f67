#!/usr/bin/env bash
# One GPU check in under 8 minutes: the `base` model's MFU (bf16, fp32 master weights),
# the serving benchmark and a 2-layout parity check, each writing its JSON to OUT_DIR,
# with the XLA GPU flags of jaxcore.xla_flags (latency-hiding scheduler, collectives).
#
#   bash benchmarks/gpu_check.sh [--dry-run] [OUT_DIR]      (default OUT_DIR: benchmarks/results/gpu)
#
# --dry-run works on any machine (CPU included): it prints the commands with their time
# limits and runs the parity script's plan (backend, precision, attention kernel, layouts) without compiling a model, on a CPU
# backend started with every flag (XLA aborts on one it does not know). Python: $PYTHON,
# else the project's .venv (built by make), else python on PATH.
set -euo pipefail

DRY_RUN=0
OUT_DIR=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $arg (use --dry-run or an output folder)" >&2; exit 2 ;;
    *) OUT_DIR="$arg" ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The interpreter: $PYTHON if set, else the project's .venv (what `make` builds), else python.
if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  PY="python"
fi
if ! "$PY" -c 'import jax' 2>/dev/null; then
  echo "gpu_check.sh: $PY cannot import jax; run 'make .venv/.installed-test' (or pip install" \
    "-e '.[cuda]' on a GPU machine) or point PYTHON at an interpreter that has jaxcore" >&2
  exit 2
fi
OUT_DIR="${OUT_DIR:-benchmarks/results/gpu}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# The flags go in before any process imports JAX; a flag already in XLA_FLAGS keeps its value.
XLA_FLAGS="$("$PY" jaxcore/xla_flags.py)"
export XLA_FLAGS

# Seconds per step; they add up to 450 s, under the 8-minute budget.
STEPS=(
  "240 mfu_base.json $PY benchmarks/mfu_cpu.py --device gpu --model base --precision bf16 --batch 8 --steps 3 --rounds 3 --out $OUT_DIR/mfu_base.json"
  "150 serving.json $PY benchmarks/serving.py --quick --rounds 1 --out $OUT_DIR/serving.json"
  "60 gpu_parity.json $PY benchmarks/gpu_parity.py --out $OUT_DIR/gpu_parity.json"
)

if [[ "$DRY_RUN" == 1 ]]; then
  echo "XLA_FLAGS=$XLA_FLAGS"
  for s in "${STEPS[@]}"; do
    read -r limit json cmd <<<"$s"
    echo "would run (limit ${limit}s, writes $OUT_DIR/$json): $cmd"
  done
  # XLA aborts on a flag it does not know: the plan starts its CPU backend with them all.
  JAX_PLATFORMS=cpu "$PY" benchmarks/gpu_parity.py --dry-run
  echo "XLA accepted the flags"
  echo "dry run ok"
  exit 0
fi

if ! "$PY" -c 'import jax, sys; sys.exit(jax.devices()[0].platform != "gpu")'; then
  echo "gpu_check.sh: JAX sees no GPU here ($("$PY" -c 'import jax; print(jax.devices())')); " \
       "install jax[cuda12] on a GPU machine, or run with --dry-run." >&2
  exit 2
fi

mkdir -p "$OUT_DIR"
failed=0
for s in "${STEPS[@]}"; do
  read -r limit json cmd <<<"$s"
  echo "== $cmd (limit ${limit}s)"
  if ! timeout "$limit" $cmd; then
    echo "gpu_check.sh: FAILED or over ${limit}s: $cmd" >&2
    failed=1
  fi
done
ls -l "$OUT_DIR"
exit "$failed"
