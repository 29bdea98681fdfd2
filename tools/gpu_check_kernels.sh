#!/usr/bin/env bash
# One command on the GPU machine: the GPU kernel tests, then the quick kernel benchmark.
#   tools/gpu_check_kernels.sh OUTDIR        (~3.5 min on the H200, compiles included)
# Writes OUTDIR/{tests_launched_*,tests_persistent,bench_kernels}.log and bench_kernels.json;
# each log starts with the commit, the machine, torch/triton versions and the command.
# Test groups run side by side (compiles dominate; the GPU time-slices the processes, so
# they check correctness only); the benchmark runs alone afterwards.
set -u
OUT=${1:?usage: tools/gpu_check_kernels.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
python3 -c 'import hft_infer.kernels' 2>/dev/null || pip install -q -e . --no-deps
header() {  # header CMD...
  echo "# commit $(git rev-parse HEAD 2>/dev/null || echo unknown) ($(git rev-parse --abbrev-ref HEAD 2>/dev/null))"
  echo "# machine $(uname -srm), $(nproc) cores; $(nvidia-smi -L 2>/dev/null | head -1)"
  python3 -c 'import sys, torch, triton; print("# python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
  echo "# command: $*"
  echo "# started $(date -Is)"
}
run() {  # run NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  { header "$@"; timeout "$t" "$@"; echo "# exit $?"; } > "$OUT/$name.log" 2>&1
}
T="-q -rs -p no:cacheprovider --durations=5"
run tests_persistent 230 python3 -m pytest $T tests/kernels/test_kernel_persistent.py &
run tests_launched_window 230 python3 -m pytest $T tests/kernels/test_kernel_lstm_window.py &
run tests_launched_stream_mlp 230 python3 -m pytest $T tests/kernels/test_kernel_lstm_stream.py tests/kernels/test_kernel_mlp.py tests/kernels/test_kernel_ring.py &
run tests_launched_graph 230 python3 -m pytest $T tests/kernels/test_kernel_graph_capture.py &
wait
for f in "$OUT"/tests_*.log; do echo "== $f"; grep -E "passed|failed|error|# exit" "$f" | tail -3; done
run bench_kernels 200 python3 tools/bench_kernels.py --quick --json "$OUT/bench_kernels.json"
echo "== $OUT/bench_kernels.log"
sed -n '/== summary/,$p' "$OUT/bench_kernels.log"
grep -E "# exit" "$OUT/bench_kernels.log"
