#!/bin/bash
# The GPU checks in one call of the device machine (H200): the Triton tests for real, then the runner.
#   bash tests/gpu/run_on_device.sh [runner args...]     (logs and JSON under $OUT when set)
# Environment: PROFILE_MODELS (default chain,resnet18; empty: no profile), SWEEP=1 (schedule sweep on chain).
set -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -x tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -4
python3 -m benchmarks.runner --device cuda "$@" --json "$OUT/runner.json" 2>&1 | tee "$OUT/runner.log" | tail -45
if [ "${SWEEP:-0}" = 1 ]; then
  python3 -m benchmarks.gpu_sched_sweep --model chain 2>&1 | grep -v "^DEBUG\|Warn\|warn" | tee "$OUT/sweep.log"
fi
if [ -n "${PROFILE_MODELS-chain,resnet18}" ]; then
  python3 -m benchmarks.gpu_profile --models "${PROFILE_MODELS-chain,resnet18}" --dtype bf16 2>&1 \
    | grep -v "^DEBUG\|Warning\|_warn" | tee "$OUT/profile.log" | tail -45
fi
