#!/bin/bash
# session 7 device step: GPU tests, GELU (now erfc) on the GPU runner, and the CPU GEMM prefetch on the host CPU
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KILN_CACHE_DIR=/tmp/kc
mkdir -p $OUT
(lscpu | grep -E "Model name|Flags" | sed 's/Flags:.*\(avx512f\).*/Flags: avx512f yes/' | cut -c1-120) > $OUT/cpu.txt 2>&1
python3 -m pytest -q tests/gpu > $OUT/tests_gpu.txt 2>&1; tail -3 $OUT/tests_gpu.txt
python3 scratch_s7/gen_pf.py && g++ -O3 -march=native -fopenmp /tmp/pf2.cpp -o /tmp/pf2 && \
  for s in "64 1024 4096" "64 4096 1024" "256 768 2304" "256 3072 768" "1024 1024 1024"; do taskset -c 2 /tmp/pf2 $s; done > $OUT/pf.txt 2>&1
cat $OUT/cpu.txt $OUT/pf.txt
timeout 300 python3 -m benchmarks.runner --device cuda --dtype bf16 --models mlp,gpt --modes default --repeats 3 --calls 10 > $OUT/runner.txt 2>&1; tail -12 $OUT/runner.txt
