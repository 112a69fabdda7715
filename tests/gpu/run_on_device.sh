#!/bin/bash
# The GPU checks in one call of the device machine (H200): the Triton tests for real, then the runner.
#   bash tests/gpu/run_on_device.sh [runner args...]     (logs and JSON under $OUT when set)
set -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -x tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
python3 -m benchmarks.runner --device cuda "$@" --json "$OUT/runner.json" 2>&1 | tee "$OUT/runner.log" | tail -40
python3 -m benchmarks.gpu_sched_sweep --model chain 2>&1 | grep -v "^DEBUG\|Warn\|warn" | tee "$OUT/sweep.log" | tail -14
python3 -m benchmarks.gpu_profile --models chain,gpt_b8x512,resnet18 --dtype bf16 2>&1 | tee "$OUT/profile.log" | grep -v "^DEBUG\|Warning" | tail -60
