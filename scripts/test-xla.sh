#!/usr/bin/env bash
# Build .venv-xla (torch and torch_xla at matching versions, apart from the main .venv,
# whose torch 2.13 cannot load torch_xla 2.9) and run tests_xla/ on the XLA CPU device.
#
#   bash scripts/test-xla.sh        (what `make test-xla` runs)
#
# torch_xla wheels are built against one torch release exactly, so both are pinned here.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.9.0
TORCH_XLA_VERSION=2.9.0
VENV=.venv-xla
PY=${PYTHON:-python3.11}

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
fi
if ! "$VENV/bin/python" -c "import torch_xla" >/dev/null 2>&1; then
    "$VENV/bin/pip" install --quiet "torch==${TORCH_VERSION}" "torch_xla==${TORCH_XLA_VERSION}"
    # jaxcore for its ParallelConfig (pure Python; its jax/flax pins come with it) and pytest.
    "$VENV/bin/pip" install --quiet -e . "pytest==9.2.0"
fi

export PJRT_DEVICE=CPU
export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8"
export CPU_NUM_DEVICES=8
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests_xla "$@"
