#!/bin/bash
# The fuzz and OpInfo sweeps (and tests/gpu) on the device machine: its 16 CPU cores run the 10,000-program fuzz
# in ~11 min and OpInfo over the whole op_db in ~1 min per dtype.  From the repo root, through the device tool:
#   BUDGET_S=580 FUZZ_FROM=0 FUZZ_TO=5000 FUZZ_STEP=1000 bash benchmarks/device_cpu_sweep.sh fuzz    (carry: .whl)
#   BUDGET_S=580 bash benchmarks/device_cpu_sweep.sh gpu opinfo
#   BUDGET_S=580 GPU_S=150 bash benchmarks/device_cpu_sweep.sh gpu perf    (tests/gpu - every test, GPU_X=-x to stop at
#   the first failure - then host time and the runner;
#   GPU_PYTEST=--ignore=tests/gpu/test_gpu_builds.py leaves out the zoo through the Triton target; since session
#   23 tests/gpu takes more than one 600-s call (25 tests in 170 s, 36 in 320 s): run it in two calls,
#   GPU_PYTEST=--ignore=tests/gpu/test_gpu_builds.py, then GPU_TESTS=tests/gpu/test_gpu_builds.py; since session
#   26 the builds file alone outlasts GPU_S=330 (33 fp32 tests reached in 330 s, the 8 bf16 ones take 125 s): give
#   it GPU_S=500 and BUDGET_S=560, or its bf16 tests alone (GPU_PYTEST="-k bf16") in a call of their own)
#   COMPILE_MODELS="encoder_fast decoder_fast" bash benchmarks/device_cpu_sweep.sh compile    (first-call breakdowns,
#   benchmarks/compile_profile.py --breakdown, one $OUT/compile_MODEL.log each; GC pauses counted;
#   COMPILE_EXTRA="--cprofile --top 45" COMPILE_LINES=400: each measured first call under cProfile too;
#   COMPILE_WORKERS=8: kiln's Triton compile workers on, started by the warm-up model - the A/B for making them
#   the default, see kiln/config.py compile_workers; COMPILE_TAG names the logs of a second run in the call)
#   DYN_BACKENDS=eager,inductor-dyn,kiln-dyn DYN_EXTRA="--breakdown 32,256" bash benchmarks/device_cpu_sweep.sh dynamic
#   HF_BACKENDS=kiln,inductor HF_CACHES="dynamic static" bash benchmarks/device_cpu_sweep.sh hf    (HF GPT-2 generate)
#   TRAIN_MODELS=mlp,gpt TRAIN_EXTRA=--compile-step bash benchmarks/device_cpu_sweep.sh train    (issue 20's training
#   benchmark, bf16 autocast at the sizes; eager, Inductor and kiln in default and reduce-overhead)
#   (issue 19's GPT over 15 lengths, benchmarks/dynamic_shapes.py; $OUT/dyn.{log,json})
#   BUDGET_S=560 ZOO_MODELS=bert,gpt2 ZOO_DTYPE=bf16 bash benchmarks/device_cpu_sweep.sh zoo    (the zoo benchmark:
#   eager, Inductor, kiln in default and reduce-overhead; rows as each model finishes, $OUT/zoo.json at the end;
#   ZOO_EXTRA="--tf32" passes runner options, ZOO_TAG names the output files - several zoo runs in one call;
#   ZOO_MODELS=all: every zoo model; $OUT/zoo*.json is rewritten after each model, so a run the time limit ends keeps
#   what it measured)
# .whl holds the expecttest wheel (pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl
# expecttest; .whl in .git/info/exclude).  Results come back as $OUT/fuzz.tgz and $OUT/opinfo.tgz (only 8 files
# come back from a call); RESULTS.md "session 12" has the first run.
set -u
export PYTHONPATH=$PWD  # (the working tree's kiln, whether or not the editable install below takes)
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /tmp/pip_e.log 2>&1 || tail -3 /tmp/pip_e.log
export PYTHONUNBUFFERED=1 KILN_CACHE_DIR=/tmp/kiln-cache
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-580} - ($(date +%s) - start) )); }
mkdir -p /tmp/fz
for what in "$@"; do
  # a step its timeout killed may leave compile workers running: they would slow every later measurement (session 34)
  pkill -f kiln.runtime.compile_worker > /dev/null 2>&1 || true
  case $what in
  gpu)
    timeout ${GPU_S:-240} python3 -m pytest -q ${GPU_X:-} ${GPU_TESTS:-tests/gpu} -p no:cacheprovider ${GPU_PYTEST:-} > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_tests.log | tail -15;;
  perf)
    # GPU default mode against Inductor: host vs device time per call, launch paths, then the suite runner
    mkdir -p /tmp/wrappers
    timeout $(( $(left) / 3 )) python3 -m benchmarks.host_time --models ${PERF_MODELS:-seed,resnet18,gpt} --dtype bf16 --launches --externs --cprofile --kernels ${KERNELS:-0} --dump /tmp/wrappers > $OUT/host_time.log 2>&1; echo "host_time rc=$?"; grep -v Warn $OUT/host_time.log | head -20
    tar -C /tmp/wrappers -czf $OUT/wrappers.tgz .
    timeout $(left) python3 -m benchmarks.runner --device cuda --dtype bf16 --backends eager,inductor,kiln --modes default,reduce-overhead --repeats 5 --calls 10 ${RUNNER_MODELS:+--models $RUNNER_MODELS} --json $OUT/runner.json > $OUT/runner.log 2>&1; echo "runner rc=$?"; grep "^| " $OUT/runner.log;;
  zoo)
    models="--models ${ZOO_MODELS:-bert}"; [ "${ZOO_MODELS:-}" = all ] && models=--full
    timeout $(left) python3 -m benchmarks.zoo --device cuda --dtype ${ZOO_DTYPE:-bf16} $models --modes ${ZOO_MODES:-default,reduce-overhead} --repeats ${ZOO_REPEATS:-3} --calls 10 ${ZOO_EXTRA:-} --json $OUT/zoo${ZOO_TAG:-}.json > $OUT/zoo${ZOO_TAG:-}.log 2>&1; echo "zoo${ZOO_TAG:-} rc=$?"; grep "^| " $OUT/zoo${ZOO_TAG:-}.log | grep -v geomean; grep -A40 "^kiln:" $OUT/zoo${ZOO_TAG:-}.log | head -40;;
  compile)  # first-call breakdown (cold caches, COMPILE_WARM compiled first): Inductor vs kiln, Triton's stages
    for m in ${COMPILE_MODELS:-encoder_fast}; do
      KILN_COMPILE_WORKERS=${COMPILE_WORKERS:-0} timeout $(left) python3 -m benchmarks.compile_profile --model $m --device cuda --dtype ${COMPILE_DTYPE:-bf16} --breakdown --warm ${COMPILE_WARM:-mha_self} ${COMPILE_EXTRA:-} > $OUT/compile_$m${COMPILE_TAG:-}.log 2>&1; echo "compile $m${COMPILE_TAG:-} rc=$?"; grep -v -i warn $OUT/compile_$m${COMPILE_TAG:-}.log | tail -${COMPILE_LINES:-30}
    done;;
  dynamic)  # issue 19's GPT over 15 lengths: DYN_BACKENDS, DYN_EXTRA (e.g. "--breakdown 32,256"), DYN_TAG
    timeout $(left) python3 -m benchmarks.dynamic_shapes --device cuda --dtype ${DYN_DTYPE:-bf16} --backends ${DYN_BACKENDS:-eager,inductor-dyn,kiln-dyn,kiln-dyn-static} --repeats 5 ${DYN_EXTRA:-} --json $OUT/dyn${DYN_TAG:-}.json > $OUT/dyn${DYN_TAG:-}.log 2>&1; echo "dynamic${DYN_TAG:-} rc=$?"; grep -v -i warn $OUT/dyn${DYN_TAG:-}.log | tail -${DYN_LINES:-40};;
  hf)  # HF GPT-2 generate on the GPU (issue 19 point 7): HF_BACKENDS, both caches
    for cache in ${HF_CACHES:-dynamic static}; do
      timeout $(left) python3 -m benchmarks.hf_decode --device cuda --dtype ${HF_DTYPE:-bf16} --backends ${HF_BACKENDS:-kiln,inductor,kiln-ro} --tokens 32 --cache $cache > $OUT/hf_$cache.log 2>&1; echo "hf $cache rc=$?"; grep -v -i "warn\|transformers\]" $OUT/hf_$cache.log | tail -5
    done;;
  train)  # issue 20's training benchmark on the GPU: TRAIN_MODELS, TRAIN_BACKENDS, TRAIN_EXTRA (e.g. "--compile-step")
    timeout $(left) python3 -m benchmarks.training --device cuda --size ${TRAIN_SIZE:-full} --autocast --models ${TRAIN_MODELS:-mlp,gpt,resnet18,bert,llama} --backends ${TRAIN_BACKENDS:-eager,inductor,kiln,inductor-ro,kiln-ro} --steps ${TRAIN_STEPS:-20} ${TRAIN_EXTRA:-} --json $OUT/train${TRAIN_TAG:-}.json > $OUT/train${TRAIN_TAG:-}.log 2>&1; echo "train${TRAIN_TAG:-} rc=$?"; grep -v -i "warn\|Profiler" $OUT/train${TRAIN_TAG:-}.log | tail -${TRAIN_LINES:-40};;
  replays)  # CUDA graphs over training steps (benchmarks/cuda_graph_replays.py): REPLAY_MODELS
    timeout $(left) python3 -m benchmarks.cuda_graph_replays --models ${REPLAY_MODELS:-mlp,gpt,resnet18} > $OUT/replays.log 2>&1; echo "replays rc=$?"; grep -v -i warn $OUT/replays.log | tail -20;;
  ab)  # AB_MODELS, AB_B (kiln options of B, e.g. "disabled_passes=merge_linears"), AB_MODE, AB_DTYPE
    timeout $(left) python3 -m benchmarks.ab_options --device cuda --dtype ${AB_DTYPE:-bf16} --mode ${AB_MODE:-default} --models ${AB_MODELS:-gpt2} --b "${AB_B}" --rounds 9 --calls 20 > $OUT/ab.log 2>&1; echo "ab rc=$?"; grep -v -i warn $OUT/ab.log | tail -8;;
  fuzz)
    a=${FUZZ_FROM:-0}; b=${FUZZ_TO:-10000}; step=${FUZZ_STEP:-500}; mkdir -p /tmp/fz
    while [ $a -lt $b ] && [ $(left) -gt ${FUZZ_CHUNK_S:-100} ]; do
      c=$(( a + step < b ? a + step : b ))
      timeout $(left) python3 -m kiln.testing.fuzz --seeds $a:$c --jobs 16 --dtype all --size ${FUZZ_SIZE:-full} --json /tmp/fz/fuzz_$a-$c.json > /tmp/fz/fuzz_$a-$c.log 2>&1
      echo "fuzz $a:$c rc=$? at $(( $(date +%s) - start )) s: $(grep -E '^[0-9]+ programs in' /tmp/fz/fuzz_$a-$c.log)"; grep -E "^seed|^group|failing seeds" /tmp/fz/fuzz_$a-$c.log | head -8
      tar -C /tmp/fz -czf $OUT/fuzz.tgz .
      a=$c
    done;;
  opinfo)
    for dt in ${OPINFO_DTYPES:-float32 bfloat16 float16}; do
      timeout $(left) python3 tests/opinfo_sweep.py --dtype $dt --jobs 16 --json /tmp/fz/opinfo_$dt.json > /tmp/fz/opinfo_$dt.log 2>&1
      echo "opinfo $dt rc=$? at $(( $(date +%s) - start )) s"; tail -6 /tmp/fz/opinfo_$dt.log; tar -C /tmp/fz -czf $OUT/opinfo.tgz $(cd /tmp/fz && ls opinfo_*)
    done;;
  esac
done
