#!/usr/bin/env bash
# One device session on the H200: correctness first, then the measurements.
#   tools/gpu_session.sh smoke   # quick: every GPU test + short benches (find bugs cheaply)
#   tools/gpu_session.sh full    # the BENCHMARKS.md figures
# Writes logs and JSON under $OUT (default ./gpu-out). Each step has its own
# timeout and the session goes on after a failure, so one run gives every result.
set -u
phase=${1:-smoke}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*" | tee -a "$OUT/session.log"; }
step() {  # step NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  log "$name: $*"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc"
  tail -n 25 "$OUT/$name.log"
}
nvidia-smi -L | tee -a "$OUT/session.log"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' | tee -a "$OUT/session.log"
if [ "$phase" = smoke ]; then
  step gpu_engine_tests 240 python3 -m pytest -x -q -rs -p no:cacheprovider tests/integration/test_gpu_engines.py
  step kernel_tests 300 python3 -m pytest -q -rs -p no:cacheprovider --durations=10 tests/kernels
  step bench_engines_quick 120 python3 tools/bench_engines.py --steps 300 --models lstm_a --batches 1,8
  step e2e_quick 150 hft-infer bench -c configs/gpu.toml --rate 5000 --duration 2 --quiet --json "$OUT/e2e_quick.json"
elif [ "$phase" = final ]; then
  # the pacer/collector on core 2, the service placed by cpu.cores = "auto" (configs/gpu.toml)
  step bench_engines 200 python3 tools/bench_engines.py --steps 3000 --json "$OUT/bench_engines.json"
  for r in 10000 30000 50000 100000; do
    step e2e_$r 90 taskset -c 2 hft-infer bench -c configs/gpu.toml --rate $r --duration 5 --quiet --json "$OUT/e2e_$r.json"
  done
else
  step bench_kernels 260 python3 tools/bench_kernels.py
  cp -f bench_kernels.json "$OUT/" 2>/dev/null
  step bench_engines 200 python3 tools/bench_engines.py --steps 3000 --json "$OUT/bench_engines.json"
  step e2e_10k 100 hft-infer bench -c configs/gpu.toml --rate 10000 --duration 5 --quiet --json "$OUT/e2e_10k.json"
  step e2e_100k 100 hft-infer bench -c configs/gpu.toml --rate 100000 --duration 5 --quiet --json "$OUT/e2e_100k.json"
fi
log done
