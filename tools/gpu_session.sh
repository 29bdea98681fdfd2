#!/usr/bin/env bash
# One device session on the H200 host, one call (the device tool allows 10 minutes a call):
#   tools/gpu_session.sh e2e       # (default) the harness and end-to-end table set, ~8 min
#   tools/gpu_session.sh smoke     # every GPU test + short benches (find bugs cheaply)
#   tools/gpu_session.sh kernels   # kernel and engine benchmarks
#   tools/gpu_session.sh land      # the landing set: GPU tests, e2e with floor, goodput, engines, ...
#   tools/gpu_session.sh final     # a landing commit's re-check after `land` ran on its engines
#   tools/gpu_session.sh diag      # tools/diag_persistent.py (persistent and graph), diag_graph_inputs.py
#   tools/gpu_session.sh persistent  # the persistent engines: GPU tests, diag, engines, e2e over both transports
#   tools/gpu_session.sh wave5     # issue 12's landing check: GPU tests, e2e per frame and over EventBatch, goodput
#   tools/gpu_session.sh wave6     # the persistent engines after the pipelining fix: PTX check, diagnostics, tests, engines, e2e
#   tools/gpu_session.sh wave7     # issue 18: shards on one GPU with CUDA MPS (tools/with_mps.sh) and without
#   tools/gpu_session.sh wave7cap  # issue 18: lstm_a shard capacity (a saturated shard) under MPS, SM shares, without MPS
#   tools/gpu_session.sh wave7p    # issue 18: GPU engine tests, then persistent shards sized to share the SMs, beside graph, under MPS
#   BASE_TGZ=F tools/gpu_session.sh wave8  # a sequential model's EventBatch column path against a baseline tree, same call
#   BASE_TGZ=F tools/gpu_session.sh wave8b # py-spy of lstm_a past capacity over EventBatch, this tree and the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave8c # a landing re-check: GPU engine and persistent tests, hotpath beside the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave9  # landing check: GPU + reference tests, hotpath beside the baseline, default goodput
#   BASE_TGZ=F tools/gpu_session.sh wave10 # low-rate latency: lstm_a at 10k (graph/zmq, persistent/iceoryx2) beside the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave10b # landing check: GPU tests, lstm_a at 10k beside the baseline, hot path
#   tools/gpu_session.sh wave10c           # one event per loop cycle on three cores (bench_hotpath --low-rate)
#   BASE_TGZ=F tools/gpu_session.sh wave10d # lstm_a persistent over iceoryx2 at 100k, beside the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave11 # landing check: GPU + reference tests; the CPU engine's step and e2e beside the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave11b # the CPU engine's step and e2e beside the baseline again, alternated, on a quiet host
#   BASE_TGZ=F tools/gpu_session.sh wave11c # the default model on the eager engine pinned and busy-polling, 2k and 10k, beside the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave11d # the same at 10k (two more pairs) and 20k (one), alternated
#   BASE_TGZ=F tools/gpu_session.sh wave12 # deadline admission: lstm_a's goodput and overload beside the baseline, GPU engine tests
#   BASE_TGZ=F tools/gpu_session.sh wave12b # LATE sheds too: lstm_a per-event frames at 100k and persistent/iceoryx2 at 100k alternated with the baseline, this tree's goodput, py-spy at 200k
#   tools/gpu_session.sh wave12c           # landing check: GPU engine tests; lstm_a per-event 100k, persistent/iceoryx2 100k, goodput
#   tools/gpu_session.sh wave12d           # the expected wait (queued + 1/2 places): GPU engine tests, lstm_a 100k per event, goodput
#   BASE_TGZ=F tools/gpu_session.sh wave13 # one event per cycle: GPU tests, the cycle's parts and lstm_a at 10k, this tree and the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave13b # + the gather of a few entries as ring slices: GPU tests, cycle parts, lstm_a and default at 10k
#   BASE_TGZ=F tools/gpu_session.sh wave13c # the persistent engine's one-event cycle by parts, lstm_a persistent over iceoryx2 at 10k and graph per event at 100k, beside the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave13d # landing check: GPU engine tests; lstm_a past capacity over EventBatch (numpy shed answers) beside the baseline; hot path rows
#   BASE_TGZ=F tools/gpu_session.sh wave13e # the overload sweeps again: lstm_a (EventBatch) and the default model, each beside the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave14 # GPU tests, the CPU engine's products on this host's core beside the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave14b # lstm_a and the default model at 10k, this tree and the baseline alternated
#   tools/gpu_session.sh wave14c           # landing check: GPU engine tests, in-flight ingest on the device engines, the default config's sweep to 1M
#   tools/gpu_session.sh wave14d           # GPU tests; lstm_a shards 1/2/4/8 fed EventBatch frames (one per shard) under MPS, 60k/s each
#   tools/gpu_session.sh wave14e           # landing check: the GPU engine, hot-path, shard-topic, products and self-check tests
#   tools/gpu_session.sh wave14f           # lstm_a shards (1, 8) over EventBatch under MPS with tf32 and bf16 products
#   BASE_TGZ=F tools/gpu_session.sh wave15 # GPU tests; the graph engine's LSTM step cut per batch size beside the baseline
#   BASE_TGZ=F tools/gpu_session.sh wave15a # wave15's engine pairs alone
#   BASE_TGZ=F tools/gpu_session.sh wave15c # 8 lstm_a shards under MPS, this tree and the baseline alternated
#   tools/gpu_session.sh wave15b           # lstm_a shards (1, 8) over EventBatch under MPS, fp32 and tf32
#   tools/gpu_session.sh wave16            # lstm_a shards (1, 8) with 64 and 1,024 instruments; py-spy of one shard
#   tools/gpu_session.sh wave16b           # with the pacer prepared before go: lstm_a shards 1/2/4/8 over 1,024 instruments
#   BASE_TGZ=F tools/gpu_session.sh wave16c # landing: GPU tests; lstm_a overload over 1,024 instruments beside the
#                                          # baseline; lstm_a shards 1/4/8 at 100k/s each and 8 at 125k/s
#   tools/gpu_session.sh wave16d           # landing: GPU tests; py-spy of one saturated lstm_a shard; shards 1/8
#   tools/gpu_session.sh wave18            # GPU tests; lstm_a shards 1/8 over 1,024 instruments with ingest.coalesce_us
#                                          # 0 / 250 / 1000; py-spy of one coalescing shard at 100k/s; COLUMNS_MIN sweep
#   tools/gpu_session.sh wave19            # a bf16 GPU service through replay --verify (the precision in its Status);
#                                          # the CPU engine's bf16 products on this host's core
#   tools/gpu_session.sh wave20            # issue 18 at 1M offered: lstm_a shards 1/4/10 at 100k/s each over 1,024
#                                          # instruments, 12 at 84k/s each (more shards, each further from capacity)
#   BASE_TGZ=F tools/gpu_session.sh wave21 # the host's SMT topology; 12 lstm_a shards at 84k/s each, this tree's
#                                          # placement (helpers off every shard's hot core) against the baseline's;
#                                          # py-spy of one saturated lstm_a shard at 100k/s
#   tools/gpu_session.sh wave22            # landing: GPU tests; 12 lstm_a shards at 84k/s and 10 at 100k/s again
#   tools/gpu_session.sh wave23            # where the saturated loop's stalls go (stall counters): 1 and 12 lstm_a shards
#   tools/gpu_session.sh wave24            # admission's margin: 1 and 12 saturated lstm_a shards against BASE_TGZ;
#                                          # 12 shards balanced by the feed's counts; a burst after a graph step
#                                          # (bench_cold_burst.py); 12 shards with max_batch 128; GPU tests
#   BASE_TGZ=F tools/gpu_session.sh wave24s # wave24's most telling rows for a short call (BUDGET_S ~300-400)
#   tools/gpu_session.sh wave24b           # 12 lstm_a shards by position / balanced, max_batch 64 / 128 (~300 s)
#   BASE_TGZ=F tools/gpu_session.sh wave25 # push_columns against BASE_TGZ: GPU tests, the burst's parts, one
#                                          # saturated lstm_a shard alternated; 12 balanced at max_batch 128 (~500 s)
#   tools/gpu_session.sh wave25b           # ingest.coalesce_us 0 / 2500: 1 saturated lstm_a shard (twice each,
#                                          # alternated), 12 balanced at max_batch 128 (~400 s)
#   tools/gpu_session.sh wave25c           # GPU tests; 12 balanced shards with gpu.toml's coalesce_us and 0;
#                                          # gpu.toml at 10k/s with and without it (~450 s)
#   tools/gpu_session.sh wave25d           # GPU tests; 12 balanced shards with coalesce_us 2500 and 0; one
#                                          # saturated shard (~300 s)
#   tools/gpu_session.sh wave26            # the H200 host: GPU tests; 12 balanced shards and one saturated shard,
#                                          # coalesce_us 2500 against 0 alternated (~560 s)
#   tools/gpu_session.sh wave26b           # coalesce_us 1500 / 3500 and max_batch 128 for 12 balanced shards;
#                                          # gpu.toml at 10k and 50k/s with 2500 and 0 (~440 s)
#   tools/gpu_session.sh wave26c           # GPU tests; gpu.toml at 10k / 50k/s with coalesce_us 2500 and 0
#                                          # (alternated twice); 1 and 12 saturated shards with 2500 (~560 s)
#   tools/gpu_session.sh wave26d           # GPU tests; gpu.toml at 50k/s with coalesce_us 2500 / 0; 12 shards over
#                                          # ZeroMQ and over iceoryx2, one saturated shard (~340 s)
#   BASE_TGZ=F tools/gpu_session.sh wave28m # GPU tests; 12 shards, this tree and BASE_TGZ's (the branch
#                                          # next/submit-ahead) alternated twice, then its step ahead and this
#                                          # tree at max_inflight 3; each core's load sampled (~360 s)
#   tools/gpu_session.sh wave28n           # 1.008M offered over 12, 11 and 10 lstm_a shards (one, two and three
#                                          # helper cores), alternated twice, each core's load sampled (~250 s)
#   BASE_TGZ=F tools/gpu_session.sh wave28q # 12 shards with bench's two helper cores (one collector) twice, around
#                                          # 11 shards a step ahead (BASE_TGZ: the branch) and not, at max_inflight 3,
#                                          # then the GPU tests (~290 s)
#   tools/gpu_session.sh wave28r            # the GPU tests, the GPU's rows/s ceiling at 11 processes in fp32 and tf32,
#                                          # 11 shards at 1.012M in tf32 and fp32, tf32 with 4 steps in flight (~250 s)
#   BASE_TGZ=F tools/gpu_session.sh wave29a # the lstm kernel's per-tile projection and spread head: the tf32
#                                          # ceiling beside BASE_TGZ's, shards at 1.012M (4 in flight) in tf32, in
#                                          # tf32 and bf16 with finer buckets, the GPU tests, bf16/fp32 ceilings,
#                                          # the engine's step beside BASE_TGZ's (~500 s)
#   BASE_TGZ=F tools/gpu_session.sh wave29b # wave29a's shards again with warm caches: BASE_TGZ's tree, this one,
#                                          # this one with finer buckets; the GPU tests and the kernels' (~520 s)
#   tools/gpu_session.sh wave29c           # 11 shards at 1.012M over 8 s of feed in tf32, bf16 and fp32 (4 in
#                                          # flight), tf32 at 1.1M, then the GPU tests (~420 s)
#   tools/gpu_session.sh wave29d           # 11 tf32 shards at 1.012M over 6 s of feed (~130 s)
#   tools/gpu_session.sh wave29e           # wave29d with ingest.coalesce_us = 0 (~130 s)
#   BASE_TGZ=F tools/gpu_session.sh wave30a # this tree against BASE_TGZ's over 11 tf32 shards at 1.012M, 6 s of
#                                          # feed, coalescing on and off, then this tree's GPU tests (~500 s)
#   tools/gpu_session.sh wave30b           # the GPU tests first; the host's speed (lscpu, a pinned ingest micro-bench,
#                                          # the graph step); 11 tf32 shards at 1.012M, 2.5 s of feed (~300 s)
#   tools/gpu_session.sh wave30c           # the host's speed; 11 tf32 shards at 75k and at 85k a shard (~200 s)
#   tools/gpu_session.sh wave30d           # 11 tf32 shards at 1.012M with a 10 ms deadline, and with coalesce_us 1000
#                                          # (~200 s)
#   tools/gpu_session.sh wave30e           # the host's speed; 11 tf32 shards at 1.012M: coalesce_us 2500 (gpu.toml),
#                                          # 1000, a 10 ms deadline, 1000 again, on one host (~200 s)
#   tools/gpu_session.sh wave30f           # the host's speed; 11 shards at 1.012M in tf32, bf16, bf16, tf32 (~260 s)
#   tools/gpu_session.sh wave30g           # the host's speed; 11 tf32 shards at 1.012M, gpu.toml and a 10 ms
#                                          # deadline (~150 s)
#   tools/gpu_session.sh wave31a           # the host's speed; 11 tf32 shards at 1.012M, runner.chain_steps on and off,
#                                          # alternated twice (~260 s)
#   tools/gpu_session.sh wave31b           # GPU tests; wave31a again (~450 s)
#   tools/gpu_session.sh wave31c           # the host's speed; gpu.toml at 200k, 100k, 10k with chain_steps on and
#                                          # off (~350 s)
#   tools/gpu_session.sh wave31d           # GPU tests (~160 s)
#   tools/gpu_session.sh wave32a           # the host's speed; 11 tf32 shards at 1.012M, chained and one step an
#                                          # iteration, py-spy on shards 0, 1, 5 (~330 s; py-spy from .whl/)
#   tools/gpu_session.sh wave32b           # GPU tests; COLUMNS_MIN 16/32/64 for bursts of 4-8 9-event frames (~200 s)
#   tools/gpu_session.sh wave32c           # GPU tests; 11 tf32 shards at 1.012M chained, ingest.read_gap_us 0 and
#                                          # 1000 alternated twice; the COLUMNS_MIN sweep (~400 s)
#   tools/gpu_session.sh wave33a           # GPU tests; issue 18's scaling 1 -> 4 (150k a shard, chained), twice; the one-event
#                                          # cycle by parts (graph, persistent); issue 19's runs at 10k (~430 s)
#   tools/gpu_session.sh wave34a           # GPU tests; scaling 1 -> 4 at 200k a shard (a single shard saturated),
#                                          # twice; issue 19's 10k runs over both transports (~360 s)
#   tools/gpu_session.sh wave35a           # GPU tests; the hot path's burst and publish rows (large steps answered
#                                          # from numpy columns and from tuples); issue 19's 10k runs; scaling
#                                          # 1 -> 4 at 200k a shard (~420 s)
#   tools/gpu_session.sh wave35b           # GPU tests; the hot path's rows (publish in thread CPU time and wall
#                                          # clock); issue 19's 100k runs; scaling 1 -> 4 at 300k a shard (~330 s)
#   tools/gpu_session.sh wave35c           # a launch's host cost, torch against ctypes (bench_launch); the publish
#                                          # crossover of numpy columns and tuples, steps of 16-96 (~90 s)
#   tools/gpu_session.sh wave35d           # GPU tests; publish rows at steps of 1, 32, 48, 64 (~130 s)
#   BASE_TGZ=F tools/gpu_session.sh wave36a # GPU tests; this tree against BASE_TGZ's: the one-event cycle (graph
#                                          # engine, lstm_a, by parts), then 11 chained tf32 shards at 1.012M
#                                          # alternated twice (~470 s; each step skipped past BUDGET_S)
#   tools/gpu_session.sh wave36b           # issue 12's throughput targets again: lstm_a (gpu.toml) at 200k for 10 s over
#                                          # EventBatch frames, as shipped and chained; both goodput curves (~300 s)
#   tools/gpu_session.sh wave36c           # GPU tests; the default config's goodput sweep again; lstm_a (gpu.toml) at
#                                          # 200k over 1,024 instruments; issue 13's engine rows (~450 s)
#   BASE_TGZ=F tools/gpu_session.sh wave37a # GPU tests; this tree's ingest against BASE_TGZ's (bench_hotpath
#                                          # --baseline), then lstm_a (gpu.toml) at 200k, new and base alternated
#                                          # twice, then issue 13's lstm_a graph rows twice (261 s on an H100
#                                          # host): landed the ring writes (wave 37)
#   BASE_TGZ=F tools/gpu_session.sh wave38a # GPU tests with the kernel tests; issue 13's engine rows (graph and
#                                          # persistent; lstm_a, lstm_b, mlp_small; batch 1 and 64), this tree and
#                                          # BASE_TGZ's alternated twice (wave38b: lstm_a only, ~540 s; wave38c:
#                                          # the landing tests and the persistent kernels' test, lstm_a once, ~290 s;
#                                          # wave38d: those tests only, ~190 s; wave38e: wave38b with lstm_b,
#                                          # ~450 s)
#   BASE_TGZ=F tools/gpu_session.sh wave40  # GPU tests with the kernel tests; publish (bench_hotpath --only-publish,
#                                          # steps of 1-64) this tree and BASE_TGZ's alternated twice; issue 13's
#                                          # lstm_a / lstm_b engine rows once each (~520 s; 373 s on an H100 host);
#                                          # wave40b: the landing tests, then publish (steps of 1-64) alternated
#                                          # three times (~200 s); wave40c: the default config's capacity over
#                                          # EventBatch frames at 200k / 500k and 3x, this tree and BASE_TGZ's
#                                          # interleaved by bench_overload (~250 s); wave40d: the landing
#                                          # tests alone (~130 s); wave41: the persistent kernel
#                                          # tests, then tools/sweep_persistent_geometry.py (~500 s); wave41b:
#                                          # the landing tests, then the sweep (~420 s); wave41d: the
#                                          # landing and persistent kernel tests, the tilings swept, the
#                                          # engine rows against BASE_TGZ's (~560 s); wave42: the emitted
#                                          # pass swept on and off (lstm_a, lstm_b, batches 1, 2, 8), then the
#                                          # landing and persistent kernel tests, the engine rows (~500 s); wave42d:
#                                          # lstm_a's sweep at 1 and 2, then the tests (~260 s: what ran at eb97ec8);
#                                          # wave42b: the engine rows against BASE_TGZ's, twice (~500 s);
#                                          # wave43: the landing and persistent kernel tests, then lstm_a's
#                                          # engine rows at 1, 2, 64 against BASE_TGZ's once (~480 s);
#                                          # wave43b: the emitted pass's exchange as tagged words: lstm_a's
#                                          # sweep on / off by phase, the engine rows back to back and 40 µs
#                                          # apart against BASE_TGZ's, then the landing tests (~540 s);
#                                          # wave43f: lstm_a's batch-1 sweep on / off, then this tree's batch-1
#                                          # engine rows (lstm_a, mlp_small) with the host's parts, no tests
#                                          # (~150 s); wave44: landing next/head-early + next/inline-small --
#                                          # the landing and persistent kernel tests, then lstm_a's sweep
#                                          # (phases) and the engine rows with their parts against BASE_TGZ's
#                                          # (~560 s); wave44b: the inline path back to back and 40 µs
#                                          # apart against BASE_TGZ's (lstm_a 1, 2), then lstm_b 1 and
#                                          # lstm_a 64 both ways (~320 s); wave44c: the lead takes the
#                                          # next request before it waits for the full pass -- the landing
#                                          # and persistent kernel tests, then lstm_a and lstm_b at 1, 2
#                                          # back to back and 40 µs apart against BASE_TGZ's (~560 s;
#                                          # run at branch next/take-early); wave44d: gpu.toml at 10k
#                                          # with the floor, persistent then graph (~170 s); wave44e: the
#                                          # same, then both at 100k, then bench_engines' floors with the
#                                          # inline row of 168 bytes and lstm_a b=1 (~430 s); wave44f:
#                                          # issue 19's floor and lstm_a persistent over iceoryx2 and
#                                          # ZeroMQ at 10k, then 100k (~340 s); wave45 (branches
#                                          # next/mlp-phases + next/one-warp-pinned): the landing and
#                                          # persistent kernel tests, then lstm_a's engine rows against
#                                          # BASE_TGZ's (~500 s); wave45b: those rows, this tree
#                                          # and BASE_TGZ's alternated twice, and the MLP sweep
#                                          # (~420 s); wave45m: the persistent MLP's phases by
#                                          # geometry, lstm_a's batch-1 phases (~220 s); wave46 (branch
#                                          # next/mlp-warps8): the landing and persistent kernel tests,
#                                          # mlp_small's engine rows against BASE_TGZ's, the MLP's batch
#                                          # tile and lstm_a's warps swept (~420 s); wave46d: wave46's
#                                          # lstm_a mismatches -- diag_kernel_repeat's variants at once --
#                                          # then the landing tests and mlp_small's rows (~520 s);
#                                          # wave46e: the diag's variants one after another (~280 s);
#                                          # wave47: the self-check stream 200 times a variant through the
#                                          # 4-shard lstm_a engine, then on every SM (~300 s);
#                                          # wave47b: the GPU tests, then the fix's self-check stream 150 times
#                                          # (default, narrow) (~380 s); wave47c: lstm_a's rows against
#                                          # BASE_TGZ (~120 s); wave47d: wave47b's stream alone (~120 s);
#                                          # wave48: wave47b then wave47c, to land docs/pending's 0001 (~520 s)
#   WORK=DIR tools/gpu_session.sh summary   # the summary of an unpacked gpu-e2e.tgz again
#
# e2e measures, in this order (each step has its own timeout; a step that would end
# past BUDGET_S is skipped and says so, so the call always ends in time with a summary):
#   raw ZeroMQ ipc ping-pong (PAIR and the harness's XPUB/SUB shape), pacer lateness
#   (spin, pinned) at 10k/100k/500k events/s, the harness floor (null service, placed by
#   configs/gpu.toml) at 10k/100k/500k, configs/gpu.toml and the default config at
#   several rates each with its floor from the same run (--with-floor), the null service
#   answering per event (per_instrument) at 100k, then the harness tests on this host.
#
# Every log starts with the provenance block: commit (git, else $HFT_COMMIT, and a digest
# of the source either way), machine (nproc, CPU model, GPU), versions, then the command.
# Every shards run (shards_inst) also gets NAME_accounting.log and NAME_timeline.log: per-shard totals
# and the per-interval timeline of its snapshots.jsonl (tools/shard_accounting.py).
# Only 8 files come back from a device call, so the logs, JSON and run directories go
# into $OUT/gpu-<phase>.tgz; $OUT/summary.md (tables, targets met or missed),
# $OUT/summary.json and $OUT/session.log come back beside it.
set -u
phase=${1:-e2e}
# an unknown phase stops here, before any device time is spent (a typo once ran the `kernels` benches instead)
if [ "$phase" != kernels ] && ! grep -qE "^(el)?if .*\"\\\$phase\" = $phase \]" "$0"; then
  echo "gpu_session.sh: unknown phase '$phase' (phases: kernels $(grep -E '^(el)?if ' "$0" \
       | grep -oE '"\$phase" = [A-Za-z0-9_]+ \]' | awk '{print $3}' | sort -uV | tr '\n' ' '))" >&2
  exit 2
fi
OUT=${OUT:-gpu-out}
BUDGET_S=${BUDGET_S:-540}
WORK=${WORK:-$(mktemp -d /tmp/gpu-session-XXXXXX)}  # `WORK=DIR tools/gpu_session.sh summary`: re-summarise
mkdir -p "$OUT" "$WORK/runs"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
T0=$(date +%s)

log() { echo "== $(date +%T) +$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/session.log"; }

provenance() {
  local commit dirty digest
  # HFT_COMMIT first: a device copy of the tree may carry an older .git than its files
  commit=${HFT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo "unknown (no .git here: pass HFT_COMMIT)")}
  dirty=$(git status --porcelain 2>/dev/null | grep -c . || true)
  # which (the device copy's count has been 4-17 at a clean commit): the first five, named
  [ "${dirty:-0}" -gt 0 ] 2>/dev/null && dirty="$dirty: $(git status --porcelain 2>/dev/null | head -5 | cut -c4- | tr '\n' ' ')"
  digest=$(find hft_infer transport kernels replay configs tools tests -type f \( -name '*.py' -o -name '*.toml' -o -name '*.sh' \) 2>/dev/null \
           | LC_ALL=C sort | xargs sha256sum 2>/dev/null | sha256sum | cut -c1-16)
  echo "commit: $commit (uncommitted files: ${dirty:-?}; source digest $digest)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  kernel: $(uname -r)"
  echo "machine: nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), affinity $(taskset -pc $$ 2>/dev/null | cut -d: -f2 | tr -d ' '), isolated $(cat /sys/devices/system/cpu/isolated 2>/dev/null || echo -), numa nodes $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>/dev/null | head -1 | grep . || echo none)"
  $PY - <<'EOF' 2>&1
import platform, sys
out = [f"python {platform.python_version()}"]
for name in ("torch", "triton", "zmq", "msgspec", "numpy", "hdrh"):
    try:
        m = __import__(name)
        v = getattr(m, "__version__", "?")
        if name == "zmq":
            v = f"{v} (libzmq {m.zmq_version()})"
        if name == "torch":
            v = f"{v} (cuda {m.version.cuda}, available {m.cuda.is_available()})"
        out.append(f"{name} {v}")
    except Exception as e:  # noqa: BLE001
        out.append(f"{name}: {type(e).__name__}")
print("versions: " + ", ".join(out))
EOF
}

# step NAME TIMEOUT CMD...: its log ($WORK/NAME.log) starts with the provenance and the command
step() {
  local name=$1 t=$2; shift 2
  local now=$(( $(date +%s) - T0 ))
  if [ $(( now + t )) -gt "$BUDGET_S" ]; then
    log "$name: SKIPPED (would end past the ${BUDGET_S}s budget: +${now}s now, timeout ${t}s)"
    echo "$name skipped" >> "$WORK/skipped.txt"
    return
  fi
  log "$name: $*"
  { cat "$WORK/provenance.txt"; echo "command: $*"; echo "timeout: ${t}s"; echo "---"; } > "$WORK/$name.log"
  timeout "$t" "$@" >> "$WORK/$name.log" 2>&1
  local rc=$?
  echo "--- exit $rc after $(( $(date +%s) - T0 - now ))s" >> "$WORK/$name.log"
  log "$name: exit $rc"
  tail -n 12 "$WORK/$name.log"
}

if ! $PY -c 'import hft_infer.app.cli' 2>/dev/null; then
  log "hft_infer not importable: pip install --no-deps -e ."
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3 | tee -a "$OUT/session.log"
fi
if ! $PY -c 'import hft_infer.app.cli' 2>/dev/null; then
  # no install possible: the package as pyproject.toml maps it (transport/ -> hft_infer/transport, ...)
  log "still not importable: a copy of the package tree on PYTHONPATH"
  pkg=$(mktemp -d /tmp/hft-pkg-XXXXXX)
  cp -r hft_infer "$pkg/hft_infer"
  for d in transport kernels replay configs; do cp -r "$d" "$pkg/hft_infer/$d"; done
  export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
fi
# The project's runtime dependencies, as pyproject.toml lists them (distribution names, looked up installed): a
# device machine without one fails every step at import (2026-12-05: tomli_w, which gpu-wheels does not fetch,
# cost a whole call), so stop here and say which
missing=$($PY -c '
import importlib.metadata as md, re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
def absent(name):
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return True
    return False
print(" ".join(n for n in (re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in deps) if absent(n)))' pyproject.toml)
if [ -n "$missing" ]; then
  log "missing modules: $missing -- put their wheels in .whl/ (e.g. pip download --no-deps -d .whl tomli_w threadpoolctl) and run again; no step run"
  exit 3
fi
if [ "$phase" != summary ] || [ ! -f "$WORK/provenance.txt" ]; then
  provenance > "$WORK/provenance.txt"
fi
tee -a "$OUT/session.log" < "$WORK/provenance.txt"

setup_base() {  # $base/py: python running the tree of BASE_TGZ (`git archive BASE hft_infer transport kernels replay configs | gzip`)
  base=$(mktemp -d /tmp/hft-base-XXXXXX)
  bash tools/baseline_tree.sh "${BASE_TGZ:?BASE_TGZ: a git archive of the baseline tree}" "$base" "$PY" >/dev/null
}

bench() {  # bench NAME TIMEOUT ARGS...: hft-infer bench with its JSON and run dir in $WORK
  local name=$1 t=$2; shift 2
  step "$name" "$t" $PY -m hft_infer bench "$@" --quiet --json "$WORK/$name.json" --run-dir "$WORK/runs/$name"
}

# The CPU engine's comparisons of wave 11 (this tree against BASE_TGZ's: setup_base first).
EAGER=(--set 'runner.engine="eager"')
PINNED=("${EAGER[@]}" --set 'cpu.cores="auto"' --set 'ingest.poll_mode="busy"')

models_cpu() {  # models_cpu NAME PYTHON: bench_models_cpu on core 3 (mlp_small, lstm_a; batch 1, 8, 64)
  step "$1" 80 env PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" taskset -c 3 "$2" tools/bench_models_cpu.py \
       --presets mlp_small lstm_a --batches 1 8 64 --no-compile --rounds 6
}

e2e_run() {  # e2e_run base|new NAME RATE ARGS...: bench at RATE events/s (3 s after 1 s of warm-up, with
  # the floor) by BASE_TGZ's tree or this one
  local who=$1 name=$2 rate=$3; shift 3
  local args=(--rate "$rate" --duration 3 --warmup 1 --with-floor "$@")
  if [ "$who" = base ]; then
    step "$name" 45 "$base/py" -m hft_infer bench "${args[@]}" --quiet --json "$WORK/$name.json" --run-dir "$WORK/runs/$name"
  else
    bench "$name" 45 "${args[@]}"
  fi
}

pairs_10k() {  # lstm_a (gpu.toml) and the default model (graph, busy, pinned) at 10k: this tree and BASE_TGZ's,
  # alternated, twice (new_g10k_K / base_g10k_K, new_d10k_K / base_d10k_K; setup_base first)
  local k
  for k in 1 2; do
    e2e_run new new_g10k_$k 10000 -c configs/gpu.toml
    e2e_run base base_g10k_$k 10000 -c "$PWD/configs/gpu.toml"
    e2e_run new new_d10k_$k 10000 --set 'ingest.poll_mode="busy"' --set 'cpu.cores="auto"'
    e2e_run base base_d10k_$k 10000 --set 'ingest.poll_mode="busy"' --set 'cpu.cores="auto"'
  done
}

pinned_pairs() {  # pinned_pairs RATE_K...: the eager engine pinned and busy-polling, baseline then this tree
  local run
  for run in "$@"; do
    e2e_run base "base_pin$run" "${run%_*}" "${PINNED[@]}"
    e2e_run new "new_pin$run" "${run%_*}" "${PINNED[@]}"
  done
}

warm_graph() {  # warm_graph NAME PYTHON: the step NAME, that tree's tf32 lstm_a graph step at batch 1, 8, 64
  # (compiles its kernels into the Triton cache before the shards start; its table is the host's graph step)
  step "$1" 60 env PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" "$2" tools/bench_engines.py --quick \
    --engines graph --models lstm_a/window --batches 1,8,64 --precision tf32
}

host_ingest() {  # the step host_ingest: one pinned core's EventBatch ingest, bursts of 1 and 64 frames (hostcal's)
  step host_ingest 60 taskset -c 5 $PY tools/bench_hotpath.py --run-sizes 93 --frame-sizes 9,64 --n 20000 --reps 3
}

columns_min_sweep() {  # the step columns_min: on one pinned core, ingest_batch.COLUMNS_MIN 16 / 32 / 64 over bursts of
  # 4-8 frames of 9 events (a saturated shard's, wave 32): where the column path starts to pay on this host
  step columns_min 90 taskset -c 5 $PY tools/bench_hotpath.py --run-sizes 93 --frame-sizes 9 --burst-frames 4,6,8 \
    --columns-min 16,32,64 --n 20000 --reps 3 --low-rate 0
}

hostcal() {  # the host's speed, for comparing device calls (wave30b): lscpu, one pinned core's ingest, the graph step
  step host_cpu 10 bash -c 'lscpu | grep -E "Model name|MHz|^L[123]|Thread|Core|Socket|NUMA node0"; grep -m1 -E "^flags" /proc/cpuinfo | wc -w'
  host_ingest
  warm_graph warm "$PY"
}

shards11() {  # shards11 NAME TIMEOUT RATE PRECISION [SET...]: waves 29-30's run -- 11 lstm_a shards balanced by the
  # feed's counts over 1,024 instruments, 4 steps in flight, every core sampled (PY, FEED_S: as shards_inst reads them)
  local name=$1 t=$2 rate=$3 prec=$4
  shift 4
  EXTRA_ARGS=--balance-shards cpu_sampled "$name" shards_inst "$name" "$t" 1024 "$rate" 11 lstm_a:11 \
    runner.precision="$prec" runner.max_inflight=4 "$@"
}

scaling_pair() {  # scaling_pair NAME RATE: issue 18's scaling 1 -> 4 (bench_shards computes it) -- lstm_a 1 and 4
  # shards at RATE events/s a shard over EventBatch frames, 1,024 instruments balanced, tf32, 4 in flight, chained
  EXTRA_ARGS=--balance-shards shards_inst "$1" 100 1024 "$2" "1 4" "lstm_a:1 lstm_a:4" runner.precision=tf32 \
    runner.max_inflight=4 runner.chain_steps=true
}

shm_10k() {  # the step `shm`: issue 19's runs at 10k events/s -- the floor and lstm_a persistent and auto (graph),
  # over iceoryx2 and over ZeroMQ (tools/bench_shm.sh)
  [ -f tools/bench_shm.sh ] && step shm 100 env BUDGET_S=95 RUNS="floor persistent auto" ORDER="floor:iceoryx2:10000 \
       persistent:iceoryx2:10000 auto:iceoryx2:10000 floor:zmq:10000 persistent:zmq:10000 auto:zmq:10000" \
       bash tools/bench_shm.sh "$WORK/shm"
}

# the GPU tests a landing commit runs (the real engines in a real service, and the hot path's)
LANDING_TESTS=(tests/integration/test_gpu_engines.py tests/integration/test_hotpath.py)

gpu_tests() {  # gpu_tests TIMEOUT PYTEST_ARGS...: the step `gpu_tests`, pytest quiet with skip reasons. A landing
  # depends on it, so a TIMEOUT past the call's budget shrinks to what is left (at least GPU_TESTS_MIN_S, 150:
  # LANDING_TESTS took 96-100 s on the H100 hosts) instead of skipping it (wave33a lost its GPU tests that way)
  local t=$1 left=$(( BUDGET_S - ($(date +%s) - T0) - 5 )); shift
  [ "$t" -gt "$left" ] && [ "$left" -ge "${GPU_TESTS_MIN_S:-150}" ] && t=$left
  step gpu_tests "$t" $PY -m pytest -q -rs -p no:cacheprovider "$@"
}

engines_ab() {  # engines_ab K TIMEOUT BENCH_ENGINES_ARGS...: tools/bench_engines.py with ARGS, this tree (step
  # engines_newK) then BASE_TGZ's (engines_baseK; setup_base first), on core 2
  local k=$1 t=$2; shift 2
  step "engines_new$k" "$t" taskset -c 2 $PY tools/bench_engines.py "$@" --json "$WORK/engines_new$k.json"
  step "engines_base$k" "$t" env PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" taskset -c 2 \
       "$base/py" tools/bench_engines.py "$@" --json "$WORK/engines_base$k.json"
}

engines_pair() {  # engines_pair K MODELS TIMEOUT [BATCHES]: bench_engines' graph and persistent rows of MODELS at
  # BATCHES (1,64), this tree (step engines_newK) then BASE_TGZ's (engines_baseK; setup_base first), on core 2
  local k=$1 models=$2 t=$3 batches=${4:-1,64}
  engines_ab "$k" "$t" --quick --engines graph,persistent --models "$models" --batches "$batches"
}

lead_poll_checks() {  # wave47b, wave48: the landing tests with the persistent kernel test, then the self-check
  # stream where wave 47 saw wrong scores and a stuck kernel (33 programs, each variant in a process of its own)
  gpu_tests 300 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  step diag_self_check 100 $PY tools/diag_self_check_repeat.py --repeat 150 --programs 33 --variant-timeout 48 \
       --variants default,narrow
}

lead_poll_price() {  # wave47c, wave48: lstm_a's engine rows against BASE_TGZ's (main: the poll before the fix)
  setup_base
  engines_ab 1 60 --quick --engines persistent --models lstm_a/window --batches 1,2,8
}

chain_alternation11() {  # wave 31: shards11 with runner.chain_steps on, off, on, off (steps shards11_chain, _one,
  # _chainb, _oneb), then the summary with each one's table after any steps named in "$@"
  local v
  for v in chain:true one:false chainb:true oneb:false; do
    shards11 "shards11_${v%%:*}" 70 92000 tf32 "runner.chain_steps=${v#*:}"
  done
  summarize
  verbatim "$@" shards11_chain shards11_one shards11_chainb shards11_oneb
}

hotpath_pair() {  # hotpath_pair NAME TIMEOUT ARGS...: tools/bench_hotpath.py ARGS on three cores (wave10c's
  # placement), this tree's package as new_NAME, then BASE_TGZ's with this tool as base_NAME (setup_base first)
  local name=$1 t=$2; shift 2
  step "new_$name" "$t" taskset -c 2-4 $PY tools/bench_hotpath.py "$@" --json "$WORK/new_$name.json"
  step "base_$name" "$t" env PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" taskset -c 2-4 "$base/py" \
       tools/bench_hotpath.py "$@" --json "$WORK/base_$name.json"
}

shards_1_8() {  # shards_1_8 TIMEOUT PRECISION...: step shards_PRECISION, lstm_a shards N = 1 and 8 over EventBatch
  # frames under MPS, 60k events/s each, with runner.precision = PRECISION
  local t=$1 prec; shift
  for prec in "$@"; do
    step "shards_$prec" "$t" env BUDGET_S=$(( t - 5 )) FLOOR=0 RATE_PER_SHARD=60000 FEED_BATCH=256 DURATION=2 \
         SHARDS="1 8" MODELS=lstm_a ORDER="lstm_a:1 lstm_a:8" EXTRA_SET="runner.precision=\"$prec\"" \
         bash tools/with_mps.sh bash tools/bench_shards.sh "$WORK/shards_$prec"
  done
}

shards_inst() {  # shards_inst NAME TIMEOUT INSTRUMENTS RATE_PER_SHARD "N..." ORDER [SET...]: step NAME, lstm_a shards
  # over EventBatch frames under MPS with a universe of INSTRUMENTS (the feed over all of them), no floor, 2 s each;
  # a run may take TIMEOUT - 10 s: 12 shards took ~40 s to be READY under MPS in wave24 (their graph captures and
  # self-checks share the GPU), and two 12-shard runs capped at 50-60 s timed out after their feed;
  # `PY=DIR/py shards_inst ...` runs a baseline tree's (bench_shards.sh reads PY); FEED_S=8: seconds of feed
  local name=$1 t=$2 inst=$3 rate=$4 shards=$5 order=$6 n
  shift 6
  # a feed longer than 2 s takes longer to build before it starts (~7 µs an event on the H100 hosts: wave29c's
  # 8.6M events, ~42 s in the bench process and ~15 s in the pacer's, ran past 70 s caps): the timeout grows by it
  n=$(echo "$shards" | tr ' ' '\n' | sort -n | tail -1)
  [ "${FEED_S:-2}" -gt 2 ] && t=$(( t + (FEED_S - 2) * rate * n * 7 / 1000000 ))
  step "$name" "$t" env BUDGET_S=$(( t - 5 )) RUN_CAP_S=$(( t - 10 )) FLOOR=0 \
       RATE_PER_SHARD="$rate" FEED_BATCH=256 DURATION="${FEED_S:-2}" SHARDS="$shards" MODELS=lstm_a ORDER="$order" \
       INSTRUMENTS="$inst" EXTRA_SET="universe.instruments=$inst $*" bash tools/with_mps.sh bash tools/bench_shards.sh \
       "$WORK/$name"
  shard_tables "$name"
}

shard_tables() {  # shard_tables NAME: step NAME's runs, per-shard totals and timeline (tools/shard_accounting.py)
  local name=$1 run runs=()
  for run in "$WORK/$name"/runs/*/; do
    [ -d "$run" ] && runs+=("$name-$(basename "$run")=$run")
  done
  [ ${#runs[@]} -gt 0 ] || return 0
  $PY tools/shard_accounting.py --header "$(head -1 "$WORK/provenance.txt")" "${runs[@]}" > "$WORK/${name}_accounting.log" 2>&1
  $PY tools/shard_accounting.py --timeline --header "$(head -1 "$WORK/provenance.txt")" "${runs[@]}" \
    > "$WORK/${name}_timeline.log" 2>&1
}

pyspy_watch() {  # pyspy_watch NAME SHARD...: in the background, for each SHARD, wait for its serve process (up to
  # 180 s) and record it with py-spy until it exits (1 kHz, --nonblocking: the process is never paused; speedscope
  # into $WORK/NAME_pyspy_shardS.json), py-spy on PYSPY_CORES (default 2,4: idle in waves 30-31's shard runs);
  # pyspy_report NAME waits for them and summarises (tools/pyspy_summary.py). py-spy comes with the device's
  # wheels (.whl/, not a project dependency); without it, no profiles and a line saying so
  command -v py-spy >/dev/null 2>&1 || { log "pyspy_watch: py-spy not on PATH: no profiles"; return 0; }
  local name=$1 s
  shift
  for s in "$@"; do
    ( pid=""
      for _ in $(seq 900); do pid=$(pgrep -n -f -- "--shard $s/") && break; sleep 0.2; done
      [ -n "$pid" ] || { echo "no serve --shard $s/ process within 180 s"; exit 0; }
      exec taskset -c "${PYSPY_CORES:-2,4}" py-spy record --nonblocking -r 1000 -f speedscope \
        -o "$WORK/${name}_pyspy_shard$s.json" -p "$pid" ) > "$WORK/${name}_pyspy_shard$s.log" 2>&1 &
    PYSPY_PIDS+=($!)
  done
}

pyspy_report() {  # pyspy_report NAME: wait (up to 60 s) for pyspy_watch's recorders, then the step NAME_pyspy,
  # the hot thread's feed window of each profile (tools/pyspy_summary.py)
  local pid files
  for pid in "${PYSPY_PIDS[@]}"; do timeout 60 tail --pid="$pid" -f /dev/null; done
  PYSPY_PIDS=()
  files=("$WORK/$1"_pyspy_shard*.json)
  [ -e "${files[0]}" ] && step "$1_pyspy" 120 $PY tools/pyspy_summary.py --top 40 "${files[@]}"
}
PYSPY_PIDS=()

cpu_sampled() {  # cpu_sampled NAME CMD...: CMD with every core's busy share sampled each 0.5 s into
  # $WORK/NAME_cpu.log (from /proc/stat: which cores a run saturates, e.g. the helpers' core 0)
  local name=$1 pid
  shift
  { head -1 "$WORK/provenance.txt"; echo "# per-core busy % each 0.5 s during $name (from /proc/stat)"; } \
    > "$WORK/${name}_cpu.log"  # the commit line first, as every log
  python3 -c '
import time
def read():
    out = {}
    for line in open("/proc/stat"):
        if line.startswith("cpu") and line[3].isdigit():
            f = line.split(); v = list(map(int, f[1:]))
            out[f[0]] = (sum(v) - v[3] - v[4], sum(v))
    return out
prev = read(); t0 = time.time()
while True:
    time.sleep(0.5)
    cur = read()
    print(f"{time.time() - t0:6.1f}", " ".join(f"{k[3:]}:{100 * (cur[k][0] - prev[k][0]) // max(1, cur[k][1] - prev[k][1])}"
                                                for k in cur), flush=True)
    prev = cur' >> "$WORK/${name}_cpu.log" 2>&1 &
  pid=$!  # the sampler itself (wave28m's ran in a subshell that kill left running)
  local gpid=""
  if command -v nvidia-smi >/dev/null; then  # the GPU's busy share and power beside it: is it the GPU that saturates?
    { head -1 "$WORK/provenance.txt"; echo "# GPU each 0.5 s during $name (nvidia-smi: time, kernel-busy %, memory-controller %, W, SM MHz)"; } \
      > "$WORK/${name}_gpu.log"
    nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,power.draw,clocks.sm --format=csv,noheader \
      -lms 500 >> "$WORK/${name}_gpu.log" 2>&1 &
    gpid=$!
  fi
  "$@"
  kill "$pid" $gpid 2>/dev/null
}

shards_alternated() {  # shards_alternated PREFIX ROUNDS TIMEOUT INSTRUMENTS RATE_PER_SHARD "N..." ORDER [SET...]:
  # shards_inst as PREFIX_new_R (this tree) and PREFIX_base_R (BASE_TGZ's: setup_base first), alternated ROUNDS times
  local prefix=$1 rounds=$2 r who
  shift 2
  for r in $(seq "$rounds"); do
    for who in new base; do
      if [ "$who" = base ]; then PY="$base/py" shards_inst "${prefix}_${who}_$r" "$@"; else shards_inst "${prefix}_${who}_$r" "$@"; fi
    done
  done
}

engines_pairs() {  # the graph engine's step through the runner, this tree and BASE_TGZ's alternated, twice
  # (lstm_a window and stream, lstm_b, mlp_small at batch 1, 8, 64; pinned to core 2; setup_base first)
  local who py r
  for r in 1 2; do
    for who in new base; do
      py=$PY; [ "$who" = base ] && py="$base/py"
      step "${who}_engines_$r" 100 env PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" taskset -c 2 $py \
           tools/bench_engines.py --quick --engines graph --models lstm_a/window,lstm_b/window,lstm_a/stream,mlp_small/window \
           --batches 1,8,64 --json "$WORK/${who}_engines_$r.json"
    done
  done
}

verbatim() {  # verbatim NAME...: each step's own table (its log past the provenance) into summary.md
  local name
  for name in "$@"; do
    [ -f "$WORK/$name.log" ] && { echo; echo "## $name"; echo; echo '```'; sed -n '/^---$/,$p' "$WORK/$name.log" | tail -n 60; echo '```'; } >> "$OUT/summary.md"
  done
}

summarize() {
  log "summary"
  $PY - "$WORK" "$OUT" <<'EOF' 2>&1 | tee -a "$OUT/session.log"
import json, sys
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])

def load(name):
    p = work / f"{name}.json"
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    # tools/benchlib.write_json wraps rows as {"meta": provenance, "result": rows}
    return doc["result"] if isinstance(doc, dict) and set(doc) == {"meta", "result"} else doc

def f(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"

def pct(s):
    return " / ".join(f(s.get(k)) for k in ("p50_us", "p99_us", "p999_us")) if s else "-"

def verdict(ok):
    return "-" if ok is None else ("**met**" if ok else "**missed**")

md = ["# hft-infer on the H200: harness floor and end to end", "", "```",
      (work / "provenance.txt").read_text().strip(), "```", ""]
summary = {"provenance": (work / "provenance.txt").read_text(), "targets": {}}
pp = load("pingpong") or []
pair = next((r for r in pp if r["pattern"] == "pair"), None)
md += ["## Raw ZeroMQ ipc round trip (`tools/bench_pingpong.py --n 100000`)", "",
       "| pattern | poll | cores (client, server) | p50 | p90 | p99 | p99.9 | max |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
for r in pp:
    s = r["rtt"]
    md.append(f"| {r['pattern']} | {r['poll']} | {r['client_core']}, {r['server_core']} | {f(s['p50_us'])} | {f(s['p90_us'])} "
              f"| {f(s['p99_us'])} | {f(s['p999_us'])} | {f(s['max_us'])} |")
pacer = load("pacer") or []
md += ["", "## Pacer lateness (`tools/bench_pacer.py`: the pacer process, a draining subscriber)", "",
       "| rate | pacer | core | achieved/s | p50 | p99 | p99.9 | max | received |",
       "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for r in pacer:
    s = r["lateness"]
    md.append(f"| {r['rate']} | {r['pacer']} | {r['core']} | {f(r['rate_achieved'], 0)} | {f(s['p50_us'])} | {f(s['p99_us'])} "
              f"| {f(s['p999_us'])} | {f(s['max_us'])} | {r['received']:,} |")
p100 = next((r for r in pacer if r["rate"] == "100000" and r["pacer"] == "spin"), None)
ok = p100["lateness"]["p99_us"] <= 5.0 if p100 else None
summary["targets"]["pacer_lateness_p99_100k_le_5us"] = ok
md += ["", f"Target: pacer lateness p99 <= 5 µs at 100k events/s: {verdict(ok)}"
       + (f" ({f(p100['lateness']['p99_us'])} µs)" if p100 else "")]

floors = [(n, load(n)) for n in ("floor_10k", "floor_100k", "floor_500k", "floor_100k_per_instrument")]
base = floors[0][1]
md += ["", "## Harness floor: the null service (configs/gpu.toml placement, busy polling)", "",
       "| run | offered/s | achieved/s | egress | tick_to_decision p50 / p99 / p99.9 | max | p99 vs 10k | send->service recv p50 / p99 | pacer lateness p99 | lost |",
       "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
for name, o in floors:
    if o is None:
        md.append(f"| {name} | not run or failed (see its log) |||||||||")
        continue
    t = o["tick_to_decision"]
    rel = t["p99_us"] / base["tick_to_decision"]["p99_us"] if base and t["p99_us"] else None
    md.append(f"| {name} | {f(o['rate_offered'], 0)} | {f(o['rate_achieved'], 0)} | {o['null_service']['egress']} | {pct(t)} "
              f"| {f(t['max_us'])} | {f(rel, 2)}x | {f(o['send_to_service_recv']['p50_us'])} / {f(o['send_to_service_recv']['p99_us'])} "
              f"| {f(o['pacer_lateness']['p99_us'])} | {o['accounting']['lost']:,} |")
for name in ("floor_100k", "floor_500k"):
    o = dict(floors).get(name)
    ok = (o["tick_to_decision"]["p99_us"] <= 2 * base["tick_to_decision"]["p99_us"] and o["accounting"]["lost"] == 0) \
        if o and base else None
    summary["targets"][f"{name}_p99_within_2x_of_10k"] = ok
    md.append(f"\nTarget: floor p99 at {name[6:]} within 2x of 10k: {verdict(ok)}")
ok = base["tick_to_decision"]["p99_us"] <= 1.5 * pair["rtt"]["p99_us"] if base and pair else None
summary["targets"]["floor_p99_le_1.5x_pingpong_p99"] = ok
md.append(f"\nTarget: floor p99 (10k) <= 1.5x raw PAIR ping-pong p99: {verdict(ok)}"
          + (f" ({f(base['tick_to_decision']['p99_us'])} against {f(pair['rtt']['p99_us'])} µs: "
             f"{base['tick_to_decision']['p99_us'] / pair['rtt']['p99_us']:.2f}x)" if base and pair else ""))

md += ["", "## End to end, each beside its floor from the same run (`bench --with-floor`)", "",
       "| run | engine | offered/s | achieved/s | tick_to_decision p50 / p99 / p99.9 | floor p50 / p99 / p99.9 | p99 / floor | service stage p50 / p99 | decided | shed | conflated | lost |",
       "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for name in ("gpu_10k", "gpu_30k", "gpu_50k", "gpu_100k", "default_10k", "default_30k"):
    o = load(name)
    if o is None:
        md.append(f"| {name} | not run or failed (see its log) ||||||||||")
        continue
    fl, a, sv = o.get("floor", {}), o["accounting"], o["stages"].get("service", {})
    md.append(f"| {name} | {o['engine']} | {f(o['rate_offered'], 0)} | {f(o['rate_achieved'], 0)} | {pct(o['tick_to_decision'])} "
              f"| {pct(fl.get('tick_to_decision'))} | {f((o.get('vs_floor') or {}).get('p99_us'), 2)}x "
              f"| {f(sv.get('p50_us'))} / {f(sv.get('p99_us'))} | {a['decided']:,} | {a['shed']:,} | {a['conflated']:,} | {a['lost']:,} |")
md += ["", "Latency in µs. Harness: " + (json.dumps(base["harness"]) if base else "-")]
skipped = (work / "skipped.txt").read_text().split("\n") if (work / "skipped.txt").exists() else []
if [s for s in skipped if s]:
    md += ["", "Skipped for time: " + ", ".join(s.split()[0] for s in skipped if s)]
(out / "summary.md").write_text("\n".join(md) + "\n")
summary["runs"] = {p.stem: json.loads(p.read_text()) for p in sorted(work.glob("*.json"))}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print("\n".join(md))
EOF
}

if [ "$phase" = summary ]; then
  summarize
  exit 0
fi
if [ "$phase" = e2e ]; then
  step pingpong 90 $PY tools/bench_pingpong.py --n 100000 --json "$WORK/pingpong.json"
  bench floor_10k 80 -c configs/gpu.toml --null-service --rate 10000 --duration 5 --warmup 1
  bench floor_100k 80 -c configs/gpu.toml --null-service --rate 100000 --duration 5 --warmup 1
  bench floor_500k 120 -c configs/gpu.toml --null-service --rate 500000 --duration 3 --warmup 1
  step pacer 100 $PY tools/bench_pacer.py --rates 10000,100000,500000 --pacers spin --seconds 2 \
       --json "$WORK/pacer.json"
  bench gpu_10k 150 -c configs/gpu.toml --with-floor --rate 10000 --duration 5 --warmup 1
  bench gpu_30k 110 -c configs/gpu.toml --with-floor --rate 30000 --duration 5 --warmup 1
  bench default_10k 90 --with-floor --rate 10000 --duration 5 --warmup 1
  bench gpu_50k 110 -c configs/gpu.toml --with-floor --rate 50000 --duration 4 --warmup 1
  bench default_30k 90 --with-floor --rate 30000 --duration 4 --warmup 1
  bench floor_100k_per_instrument 70 -c configs/gpu.toml --null-service --null-egress per_instrument \
        --rate 100000 --duration 3 --warmup 1
  step harness_tests 150 $PY -m pytest -q -rs -p no:cacheprovider tests/integration/test_harness.py \
       tests/unit/test_pacer_collector.py
  summarize
elif [ "$phase" = land ]; then
  # the landing set, one call (~9 min): GPU tests, the end-to-end headline beside its floor, the
  # goodput curve, the engines, the per-event costs, shards and the shared-memory transport when
  # their scripts exist; highest priority first (a step that would end past BUDGET_S is skipped)
  custom=$(ls tests/integration/test_gpu_custom_model.py tests/kernels/test_kernel_step.py 2>/dev/null)
  # the custom-model tests first: behind a slow engine the long engine tests ran out the step at 916d9c4
  gpu_tests 100 $custom tests/integration/test_gpu_engines.py \
       tests/kernels/test_kernel_persistent.py
  bench gpu_10k 50 -c configs/gpu.toml --with-floor --rate 10000 --duration 3 --warmup 1
  bench floor_10k 25 -c configs/gpu.toml --null-service --rate 10000 --duration 2 --warmup 1
  bench floor_100k 25 -c configs/gpu.toml --null-service --rate 100000 --duration 2 --warmup 1
  bench floor_500k 30 -c configs/gpu.toml --null-service --rate 500000 --duration 2 --warmup 1
  step pacer 25 $PY tools/bench_pacer.py --rates 100000 --pacers spin --seconds 2 --json "$WORK/pacer.json"
  bench gpu_100k 50 -c configs/gpu.toml --with-floor --rate 100000 --duration 3 --warmup 1
  step overload 100 $PY tools/bench_overload.py --rates 20000,50000,100000,200000,500000 --duration 2 \
       --overload 3,10 --overload-duration 3 --json "$WORK/overload.json" --plot "$WORK/goodput.png"
  step bench_engines 60 $PY tools/bench_engines.py --quick --models lstm_a/window,mlp_small/window \
       --batches 1,64 --json "$WORK/bench_engines.json"
  # its own budget inside the step's timeout (this script's BUDGET_S is in the environment)
  [ -f tools/bench_shards.sh ] && step shards 100 env BUDGET_S=92 RATE_PER_SHARD="${RATE_PER_SHARD:-50000}" \
       bash tools/bench_shards.sh "$WORK/shards"
  step hotpath 25 taskset -c 3 $PY tools/bench_hotpath.py --n 30000 --reps 3 --json "$WORK/hotpath.json"
  [ -f tools/bench_shm.sh ] && step shm 60 env BUDGET_S=55 bash tools/bench_shm.sh "$WORK/shm"
  step pingpong 20 $PY tools/bench_pingpong.py --n 20000 --json "$WORK/pingpong.json"
  summarize
  verbatim gpu_tests overload bench_engines shards hotpath shm
  cp -f "$WORK/goodput.png" "$OUT/" 2>/dev/null
elif [ "$phase" = final ]; then
  # what a landing commit re-measures when `land` already ran on its engines (one call, ~9.5
  # min): every GPU test to the end, the end-to-end headline at 10k and 100k beside its floor,
  # the shared-memory transport, shards below one shard's capacity, the goodput curve
  custom=$(ls tests/integration/test_gpu_custom_model.py tests/kernels/test_kernel_step.py 2>/dev/null)
  gpu_tests 170 $custom tests/integration/test_gpu_engines.py \
       tests/kernels/test_kernel_persistent.py tests/kernels/test_kernel_mlp.py
  bench gpu_10k 50 -c configs/gpu.toml --with-floor --rate 10000 --duration 3 --warmup 1
  bench gpu_100k 50 -c configs/gpu.toml --with-floor --rate 100000 --duration 3 --warmup 1
  # (written when the persistent engine was refused by its self-check, before 08b885d): floor and auto
  [ -f tools/bench_shm.sh ] && step shm 90 env BUDGET_S=85 RUNS="floor auto" ORDER="floor:iceoryx2:10000 \
       floor:zmq:10000 auto:iceoryx2:10000 auto:zmq:10000 floor:iceoryx2:100000 auto:iceoryx2:100000 \
       floor:zmq:100000 auto:zmq:100000" bash tools/bench_shm.sh "$WORK/shm"
  [ -f tools/bench_shards.sh ] && step shards 90 env BUDGET_S=84 RATE_PER_SHARD="${RATE_PER_SHARD:-20000}" \
       bash tools/bench_shards.sh "$WORK/shards"
  step overload 100 $PY tools/bench_overload.py --rates 20000,50000,100000,200000 --duration 2 \
       --overload 3,10 --overload-duration 3 --json "$WORK/overload.json" --plot "$WORK/goodput.png"
  summarize
  verbatim gpu_tests overload shards shm
  cp -f "$WORK/goodput.png" "$OUT/" 2>/dev/null
elif [ "$phase" = diag ]; then
  # the diagnostics prepared for the persistent engines' wrong results and the graph engine's time
  step diag_persistent 150 $PY tools/diag_persistent.py --engine persistent
  step diag_persistent_graph 90 $PY tools/diag_persistent.py --engine graph
  step diag_graph_inputs 90 $PY tools/diag_graph_inputs.py
  verbatim diag_persistent diag_persistent_graph diag_graph_inputs
elif [ "$phase" = persistent ]; then
  # the persistent engines behind the request ring: which transport is right, correctness, speed, end to end
  step diag_ring_order 150 $PY tools/diag_ring_order.py --variants graph,split+sync,ring5,fenced
  step persistent_tests 130 $PY -m pytest -q -rs -p no:cacheprovider tests/kernels/test_kernel_persistent.py \
       tests/integration/test_gpu_engines.py -k "persistent or floor"
  step bench_engines 110 $PY tools/bench_engines.py --quick --models lstm_a/window,mlp_small/window,lstm_b/window,lstm_a/stream \
       --batches 1,64 --json "$WORK/bench_engines.json"
  step diag_persistent 40 $PY tools/diag_persistent.py --engine persistent
  [ -f tools/bench_shm.sh ] && step shm 120 env BUDGET_S=115 RUNS="floor persistent" ORDER="floor:iceoryx2:10000 \
       persistent:iceoryx2:10000 floor:zmq:10000 persistent:zmq:10000 persistent:iceoryx2:100000 floor:iceoryx2:100000 \
       persistent:zmq:100000" bash tools/bench_shm.sh "$WORK/shm"
  summarize
  verbatim diag_ring_order persistent_tests bench_engines diag_persistent shm
elif [ "$phase" = wave4 ]; then
  # wave 4's landing re-check (one call): GPU tests, engines, the persistent diagnostics, e2e, per-event costs
  custom=$(ls tests/integration/test_gpu_custom_model.py tests/kernels/test_kernel_step.py 2>/dev/null)
  gpu_tests 170 $custom tests/integration/test_gpu_engines.py \
       tests/kernels/test_kernel_persistent.py tests/kernels/test_kernel_mlp.py
  step bench_engines 70 $PY tools/bench_engines.py --quick --models lstm_a/window,mlp_small/window \
       --batches 1,64 --json "$WORK/bench_engines.json"
  step diag_ring_order 80 $PY tools/diag_ring_order.py --presets lstm_a,lstm_a/stream,mlp_small \
       --variants graph,one-group,slow-host
  bench gpu_10k 50 -c configs/gpu.toml --with-floor --rate 10000 --duration 3 --warmup 1
  bench gpu_100k 50 -c configs/gpu.toml --with-floor --rate 100000 --duration 3 --warmup 1
  step hotpath 30 taskset -c 3 $PY tools/bench_hotpath.py --n 30000 --reps 3 --json "$WORK/hotpath.json"
  [ -f tools/bench_shm.sh ] && step shm 70 env BUDGET_S=65 RUNS="floor persistent" ORDER="floor:iceoryx2:10000 \
       persistent:iceoryx2:10000 floor:zmq:10000 persistent:zmq:10000" bash tools/bench_shm.sh "$WORK/shm"
  summarize
  verbatim gpu_tests bench_engines diag_ring_order hotpath shm
elif [ "$phase" = wave5 ]; then
  # wave 5's landing check of issue 12 (one call): GPU engine tests, the e2e headline at 10k/100k beside
  # its floor, the same over EventBatch frames, the goodput curve over EventBatch frames, per-event costs
  custom=$(ls tests/integration/test_gpu_custom_model.py 2>/dev/null)
  gpu_tests 130 $custom tests/integration/test_gpu_engines.py
  bench gpu_10k 50 -c configs/gpu.toml --with-floor --rate 10000 --duration 3 --warmup 1
  bench gpu_100k 50 -c configs/gpu.toml --with-floor --rate 100000 --duration 3 --warmup 1
  bench gpu_100k_batched 50 -c configs/gpu.toml --with-floor --rate 100000 --duration 3 --warmup 1 --feed-batch 256
  step overload 130 $PY tools/bench_overload.py --rates 20000,50000,100000,200000,500000 --duration 2 \
       --overload 3,10 --overload-duration 3 --feed-batch 256 --json "$WORK/overload.json" --plot "$WORK/goodput.png"
  step hotpath 30 taskset -c 3 $PY tools/bench_hotpath.py --n 30000 --reps 3 --json "$WORK/hotpath.json"
  summarize
  verbatim gpu_tests overload hotpath
  cp -f "$WORK/goodput.png" "$OUT/" 2>/dev/null
elif [ "$phase" = wave6 ]; then
  # the persistent engines after the pipelining fix (kernels/persistent.py, NUM_STAGES): the PTX check on
  # this host's Triton, the diagnostics that showed the wrong results, GPU tests, engines, e2e over both transports
  step asm 60 $PY tools/check_persistent_asm.py
  step diag_persistent 70 $PY tools/diag_persistent.py --engine persistent
  step diag_ring_order 70 $PY tools/diag_ring_order.py --presets lstm_a,lstm_a/stream,mlp_small --variants graph,ring5
  step persistent_tests 150 $PY -m pytest -q -rs -p no:cacheprovider tests/kernels/test_kernel_persistent.py \
       tests/integration/test_gpu_engines.py -k "persistent or floor"
  step bench_engines 110 $PY tools/bench_engines.py --quick --models lstm_a/window,mlp_small/window,lstm_b/window,lstm_a/stream \
       --batches 1,64 --json "$WORK/bench_engines.json"
  [ -f tools/bench_shm.sh ] && step shm 120 env BUDGET_S=115 RUNS="floor persistent" ORDER="floor:iceoryx2:10000 \
       persistent:iceoryx2:10000 floor:zmq:10000 persistent:zmq:10000 persistent:iceoryx2:100000 floor:iceoryx2:100000 \
       persistent:zmq:100000" bash tools/bench_shm.sh "$WORK/shm"
  summarize
  verbatim asm diag_persistent diag_ring_order persistent_tests bench_engines shm
elif [ "$phase" = wave7 ]; then
  # issue 18: N shards on one GPU under a private CUDA MPS daemon and without it, same per-shard rate as
  # db6427a (20k/s: one lstm_a shard keeps up), in one call; the floor (no GPU) once, in the pass without MPS
  step mps_probe 20 bash -c 'command -v nvidia-cuda-mps-control; nvidia-smi --query-gpu=name,compute_mode,mig.mode.current --format=csv'
  step shards_mps 250 env BUDGET_S=245 FLOOR=0 RATE_PER_SHARD=20000 \
       ORDER="lstm_a:1 lstm_a:4 lstm_a:8 default:1 default:4 lstm_a:2 default:8" bash tools/with_mps.sh bash tools/bench_shards.sh "$WORK/shards_mps"
  step shards 200 env BUDGET_S=195 RATE_PER_SHARD=20000 ORDER="lstm_a:1 lstm_a:4 default:1 default:4 lstm_a:8" \
       bash tools/bench_shards.sh "$WORK/shards"
  summarize
  verbatim mps_probe shards_mps shards
elif [ "$phase" = wave7cap ]; then
  # issue 18, capacity: 40k/s offered per shard saturates one lstm_a shard (~35k/s, BENCHMARKS wave 3), so the
  # 1->N efficiency is a capacity figure; under MPS with every client free to use all SMs, then with each
  # client's share of SMs capped (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE ~ 100/N), then without MPS, in one call
  step shards_cap_mps 150 env BUDGET_S=145 FLOOR=0 RATE_PER_SHARD=40000 SHARDS="1 2 4 8 12" MODELS=lstm_a \
       ORDER="lstm_a:1 lstm_a:4 lstm_a:8 lstm_a:12 lstm_a:2" bash tools/with_mps.sh bash tools/bench_shards.sh "$WORK/shards_cap_mps"
  step shards_cap_mps25 50 env BUDGET_S=45 FLOOR=0 RATE_PER_SHARD=40000 SHARDS=4 MODELS=lstm_a ORDER=lstm_a:4 \
       CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 bash tools/with_mps.sh bash tools/bench_shards.sh "$WORK/shards_cap_mps25"
  step shards_cap_mps12 50 env BUDGET_S=45 FLOOR=0 RATE_PER_SHARD=40000 SHARDS=8 MODELS=lstm_a ORDER=lstm_a:8 \
       CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12 bash tools/with_mps.sh bash tools/bench_shards.sh "$WORK/shards_cap_mps12"
  step shards_cap 80 env BUDGET_S=75 RATE_PER_SHARD=40000 SHARDS="1 4" MODELS=lstm_a ORDER="lstm_a:1 lstm_a:4" \
       bash tools/bench_shards.sh "$WORK/shards_cap"
  summarize
  verbatim shards_cap_mps shards_cap_mps25 shards_cap_mps12 shards_cap
elif [ "$phase" = wave7p ]; then
  # the GPU engine tests (the persistent program budget among them), then lstm_a shards at 20k/s each under MPS:
  # persistent kernels sized to SMs / N (runner.persistent_programs = 0) beside the graph engine, one call
  gpu_tests 170 tests/integration/test_gpu_engines.py \
       tests/kernels/test_kernel_persistent.py
  step shards_persistent_mps 130 env BUDGET_S=125 FLOOR=0 RATE_PER_SHARD=20000 SHARDS="1 2 4 8" MODELS=lstm_a \
       ORDER="lstm_a:1 lstm_a:4 lstm_a:2 lstm_a:8" EXTRA_SET='runner.engine="persistent"' \
       bash tools/with_mps.sh bash tools/bench_shards.sh "$WORK/shards_persistent_mps"
  step shards_graph_mps 70 env BUDGET_S=65 FLOOR=0 RATE_PER_SHARD=20000 SHARDS="1 4" MODELS=lstm_a \
       ORDER="lstm_a:1 lstm_a:4" bash tools/with_mps.sh bash tools/bench_shards.sh "$WORK/shards_graph_mps"
  summarize
  verbatim gpu_tests shards_persistent_mps shards_graph_mps
elif [ "$phase" = wave8 ]; then
  # issues 12/18: a sequential model's EventBatch runs as columns, against a baseline tree in the same call.
  # BASE_TGZ: `git archive BASE hft_infer transport kernels replay configs | gzip` (this host may lack BASE's
  # objects); it runs from PYTHONPATH with PYTHONSAFEPATH (no checkout ahead of it on the path)
  setup_base
  step base_probe 30 bash -c "cd /tmp && '$base/py' -c 'import hft_infer.ingest_batch as m; print(m.__file__)'"
  step hotpath 70 taskset -c 3 $PY tools/bench_hotpath.py --n 30000 --reps 3 --baseline "$base/pkg/hft_infer" \
       --json "$WORK/hotpath.json"
  step overload_lstm_a 250 $PY tools/bench_overload.py -c "$PWD/configs/gpu.toml" --rates 50000,100000,200000,300000 \
       --duration 2 --overload 3 --overload-duration 2 --feed-batch 256 --baseline-python "$base/py" \
       --json "$WORK/overload_lstm_a.json"
  bench gpu_100k_batched 45 -c configs/gpu.toml --with-floor --rate 100000 --duration 3 --warmup 1 --feed-batch 256
  bench gpu_200k_batched 45 -c configs/gpu.toml --with-floor --rate 200000 --duration 3 --warmup 1 --feed-batch 256
  gpu_tests 120 tests/integration/test_gpu_engines.py -k "not persistent"
  summarize
  verbatim base_probe hotpath overload_lstm_a gpu_tests
elif [ "$phase" = wave8b ]; then
  # where a sequential model's loop time goes past its capacity (lstm_a, 100k events/s over EventBatch frames):
  # py-spy of this tree and of BASE_TGZ's, then the e2e of both twice, alternated (the runs are bistable there)
  setup_base
  step prof_new 60 env FEED_BATCH=256 bash tools/profile_overload.sh "$WORK/prof_new" 100000 3 -c configs/gpu.toml
  step prof_base 60 env FEED_BATCH=256 PY="$base/py" bash tools/profile_overload.sh "$WORK/prof_base" 100000 3 \
       -c "$PWD/configs/gpu.toml"
  for k in 1 2; do
    bench new_100k_$k 45 -c configs/gpu.toml --rate 100000 --duration 3 --warmup 1 --feed-batch 256
    step base_100k_$k 45 "$base/py" -m hft_infer bench -c "$PWD/configs/gpu.toml" --rate 100000 --duration 3 --warmup 1 \
         --feed-batch 256 --quiet --json "$WORK/base_100k_$k.json" --run-dir "$WORK/runs/base_100k_$k"
  done
  for p in prof_new prof_base; do head -n 70 "$WORK/$p/spy_top.txt" > "$OUT/$p.txt" 2>/dev/null; done
  summarize
  verbatim new_100k_1 base_100k_1 new_100k_2 base_100k_2
elif [ "$phase" = wave8c ]; then
  # the landing re-check: every GPU engine and persistent-kernel test, then the per-event costs beside BASE_TGZ's
  setup_base
  gpu_tests 200 tests/integration/test_gpu_engines.py \
       tests/kernels/test_kernel_persistent.py
  step hotpath 70 taskset -c 3 $PY tools/bench_hotpath.py --n 30000 --reps 3 --baseline "$base/pkg/hft_infer" \
       --json "$WORK/hotpath.json"
  summarize
  verbatim gpu_tests hotpath
elif [ "$phase" = wave9 ]; then
  # the landing check of wave 9: GPU engine, persistent-kernel and reference tests (reference.preprocess
  # changed), the per-event ingest beside BASE_TGZ's (a conflating run now writes only each slot's
  # window), and the default config's goodput and overload as wave 5 measured it at 0d33765
  setup_base
  gpu_tests 200 tests/integration/test_gpu_engines.py \
       tests/kernels/test_kernel_persistent.py tests/unit/test_reference_split.py tests/unit/test_reference_shared.py
  step hotpath 70 taskset -c 3 $PY tools/bench_hotpath.py --n 30000 --reps 3 --baseline "$base/pkg/hft_infer" \
       --json "$WORK/hotpath.json"
  step overload_default 250 $PY tools/bench_overload.py --rates 50000,100000,200000 --duration 2 --overload 3,10 \
       --overload-duration 3 --feed-batch 256 --json "$WORK/overload_default.json"
  summarize
  verbatim gpu_tests hotpath overload_default
elif [ "$phase" = wave10 ]; then
  # low-rate latency (issue 12's 10k targets, issue 19's row): the idle loop folding one stage once it holds a
  # chunk, beside BASE_TGZ's folding every stage whenever it went idle; lstm_a at 10k events/s, graph engine
  # over zmq (alternated, with the floor) and persistent over iceoryx2; then py-spy of the service at 10k
  setup_base
  for k in 1 2; do
    bench new_g10k_$k 70 -c configs/gpu.toml --rate 10000 --duration 3 --warmup 1 --with-floor
    step base_g10k_$k 70 "$base/py" -m hft_infer bench -c "$PWD/configs/gpu.toml" --rate 10000 --duration 3 --warmup 1 \
         --with-floor --quiet --json "$WORK/base_g10k_$k.json" --run-dir "$WORK/runs/base_g10k_$k"
  done
  bench new_p10k_shm 70 -c configs/gpu.toml --rate 10000 --duration 3 --warmup 1 --transport iceoryx2 \
        --set 'runner.engine="persistent"' --with-floor
  step base_p10k_shm 70 "$base/py" -m hft_infer bench -c "$PWD/configs/gpu.toml" --rate 10000 --duration 3 --warmup 1 \
       --transport iceoryx2 --set 'runner.engine="persistent"' --quiet --json "$WORK/base_p10k_shm.json" \
       --run-dir "$WORK/runs/base_p10k_shm"
  bench new_p100k_shm 70 -c configs/gpu.toml --rate 100000 --duration 3 --warmup 1 --transport iceoryx2 \
        --set 'runner.engine="persistent"'
  step prof_new_10k 60 env FEED_BATCH=0 SPY_RATE=1000 bash tools/profile_overload.sh "$WORK/prof_new_10k" 10000 3 \
       -c configs/gpu.toml
  head -n 80 "$WORK/prof_new_10k/spy_top.txt" > "$OUT/prof_new_10k.txt" 2>/dev/null
  summarize
  verbatim new_g10k_1 base_g10k_1 new_g10k_2 base_g10k_2 new_p10k_shm base_p10k_shm new_p100k_shm
elif [ "$phase" = wave10b ]; then
  # the landing check of wave 10: GPU engine and persistent-kernel tests, lstm_a at 10k beside BASE_TGZ again
  # (alternated, with the floor: the idle fold and the packed DecisionBatch), the hot path's publish rows
  setup_base
  gpu_tests 200 tests/integration/test_gpu_engines.py \
       tests/kernels/test_kernel_persistent.py tests/unit/test_egress_frame.py tests/unit/test_metrics.py
  for k in 1 2; do
    bench new_g10k_$k 60 -c configs/gpu.toml --rate 10000 --duration 3 --warmup 1 --with-floor
    step base_g10k_$k 60 "$base/py" -m hft_infer bench -c "$PWD/configs/gpu.toml" --rate 10000 --duration 3 --warmup 1 \
         --with-floor --quiet --json "$WORK/base_g10k_$k.json" --run-dir "$WORK/runs/base_g10k_$k"
  done
  step hotpath 110 taskset -c 3 $PY tools/bench_hotpath.py --n 20000 --reps 3 --json "$WORK/hotpath.json"
  summarize
  verbatim gpu_tests new_g10k_1 base_g10k_1 new_g10k_2 base_g10k_2 hotpath
elif [ "$phase" = wave10c ]; then
  # one event per loop cycle on three cores (the main thread, libzmq's I/O thread and the CUDA driver's
  # threads not sharing one, as they do under the hot path's usual `taskset -c 3`), the GPU engines
  step hotpath_lowrate 150 taskset -c 2-4 $PY tools/bench_hotpath.py --n 2000 --reps 1 --low-rate 3000 \
       --json "$WORK/hotpath_lowrate.json"
  summarize
  verbatim hotpath_lowrate
elif [ "$phase" = wave10d ]; then
  # lstm_a on the persistent engine over iceoryx2 at 100k events/s, this tree and BASE_TGZ's alternated, as
  # wave 6 ran it (2 s, 64 instruments): bistable near the engine's capacity, or a regression?
  setup_base
  for k in 1 2; do
    bench new_p100k_$k 50 -c configs/gpu.toml --rate 100000 --duration 2 --warmup 0.5 --transport iceoryx2 \
          --set 'runner.engine="persistent"'
    step base_p100k_$k 50 "$base/py" -m hft_infer bench -c "$PWD/configs/gpu.toml" --rate 100000 --duration 2 \
         --warmup 0.5 --transport iceoryx2 --set 'runner.engine="persistent"' --quiet --json "$WORK/base_p100k_$k.json" \
         --run-dir "$WORK/runs/base_p100k_$k"
  done
  summarize
  verbatim new_p100k_1 base_p100k_1 new_p100k_2 base_p100k_2
elif [ "$phase" = wave11 ]; then
  # the landing check of wave 11 (the CPU engine at batch 1: scalar forms in kernels/reference.py, gemv):
  # the GPU tests that compare the kernels and engines with the reference and the CPU engine; then the
  # CPU engine on this host's cores, this tree and BASE_TGZ's alternated: bench_models_cpu (one core),
  # and the default model end to end on the eager engine at 10k events/s with the floor
  setup_base
  gpu_tests 260 tests/integration/test_gpu_engines.py \
       tests/kernels/test_kernel_step.py tests/kernels/test_kernel_persistent.py tests/unit/test_reference_split.py \
       tests/unit/test_reference_shared.py tests/unit/test_models_decision.py
  models_cpu new_models_cpu $PY
  models_cpu base_models_cpu "$base/py"
  e2e_run new new_eager10k 10000 "${EAGER[@]}"
  e2e_run base base_eager10k 10000 "${EAGER[@]}"
  summarize
  verbatim gpu_tests new_models_cpu base_models_cpu new_eager10k base_eager10k
elif [ "$phase" = wave11b ]; then
  # wave11's comparisons again on a settled host (wave11's first e2e ran while the GPU tests' compile
  # workers were still winding down: load average 31): the step on one core, then two alternated pairs
  # of the eager engine at 10k events/s, the baseline first
  setup_base
  sleep 20
  models_cpu base_models_cpu "$base/py"
  models_cpu new_models_cpu $PY
  for k in 1 2; do
    e2e_run base base_eager10k_$k 10000 "${EAGER[@]}"
    e2e_run new new_eager10k_$k 10000 "${EAGER[@]}"
  done
  summarize
  verbatim base_models_cpu new_models_cpu base_eager10k_1 new_eager10k_1 base_eager10k_2 new_eager10k_2
elif [ "$phase" = wave11c ]; then
  # the default model on the eager engine as a latency-minded CPU deployment runs it (pinned by
  # cpu.cores = "auto", busy polling; wave11b ran the default config: unpinned, event polling), this
  # tree and BASE_TGZ's alternated: at 2k events/s, where an event seldom waits for the one before, and 10k
  setup_base
  pinned_pairs 2000_1 2000_2 10000_1
  summarize
  verbatim base_pin2000_1 new_pin2000_1 base_pin2000_2 new_pin2000_2 base_pin10000_1 new_pin10000_1
elif [ "$phase" = wave11d ]; then
  # wave11c's 10k pair again, twice, and one pair at 20k events/s (this tree and BASE_TGZ's alternated)
  setup_base
  pinned_pairs 10000_2 10000_3 20000_1
  summarize
  verbatim base_pin10000_2 new_pin10000_2 base_pin10000_3 new_pin10000_3 base_pin20000_1 new_pin20000_1
elif [ "$phase" = wave12 ]; then
  # deadline admission for stateful models (scheduler.admission): lstm_a (sequential) offered past what it
  # steps, over EventBatch frames (the goodput sweep and 3x/10x, this tree and BASE_TGZ's interleaved by
  # bench_overload) and over one event per frame at 100k (issue 12's first table), then the GPU engine tests
  # (the stepper's shed answers changed)
  setup_base
  step overload_lstm_a 280 $PY tools/bench_overload.py -c "$PWD/configs/gpu.toml" --rates 50000,100000,200000,300000 \
       --duration 2 --overload 3,10 --overload-duration 2 --feed-batch 256 --baseline-python "$base/py" \
       --json "$WORK/overload_lstm_a.json"
  e2e_run new new_g100k 100000 -c configs/gpu.toml
  e2e_run base base_g100k 100000 -c "$PWD/configs/gpu.toml"
  gpu_tests 130 tests/integration/test_gpu_engines.py
  summarize
  verbatim overload_lstm_a new_g100k base_g100k gpu_tests
elif [ "$phase" = wave12b ]; then
  # wave12 plus LATE (stale-on-arrival events of a stateful model shed unapplied): lstm_a one event per
  # frame at 100k (wave12's collapse of this tree) and on the persistent engine over iceoryx2 at 100k
  # (wave 10's bistable row), this tree and BASE_TGZ's alternated; this tree's goodput over EventBatch
  # frames (the baseline's is wave12's, same session); the GPU engine tests
  setup_base
  for k in 1 2; do
    e2e_run new new_g100k_$k 100000 -c configs/gpu.toml
    e2e_run base base_g100k_$k 100000 -c "$PWD/configs/gpu.toml"
  done
  bench new_p100k_shm 50 -c configs/gpu.toml --rate 100000 --duration 2 --warmup 0.5 --transport iceoryx2 \
        --set 'runner.engine="persistent"'
  step base_p100k_shm 50 "$base/py" -m hft_infer bench -c "$PWD/configs/gpu.toml" --rate 100000 --duration 2 \
       --warmup 0.5 --transport iceoryx2 --set 'runner.engine="persistent"' --quiet --json "$WORK/base_p100k_shm.json" \
       --run-dir "$WORK/runs/base_p100k_shm"
  step overload_lstm_a 150 $PY tools/bench_overload.py -c "$PWD/configs/gpu.toml" --rates 50000,100000,200000,300000 \
       --duration 2 --overload 3,10 --overload-duration 2 --feed-batch 256 --json "$WORK/overload_lstm_a.json"
  gpu_tests 100 tests/integration/test_gpu_engines.py
  step prof_200k 60 env FEED_BATCH=256 bash tools/profile_overload.sh "$WORK/prof_200k" 200000 3 -c configs/gpu.toml
  head -n 70 "$WORK/prof_200k/spy_top.txt" > "$OUT/prof_200k.txt" 2>/dev/null
  summarize
  verbatim new_g100k_1 base_g100k_1 new_g100k_2 base_g100k_2 new_p100k_shm base_p100k_shm overload_lstm_a gpu_tests
elif [ "$phase" = wave12c ]; then
  # the landing check of wave 12 (LATE also for events their queue would make stale; the one-pass pick):
  # the GPU engine tests, then this tree alone (the baseline's runs are wave12/wave12b's, same session):
  # lstm_a one event per frame at 100k twice, on the persistent engine over iceoryx2 at 100k, and its
  # goodput over EventBatch frames from 30k (wave12b had no rate with shed <= 1 %)
  gpu_tests 100 tests/integration/test_gpu_engines.py
  for k in 1 2; do
    bench new_g100k_$k 40 -c configs/gpu.toml --rate 100000 --duration 3 --warmup 1
  done
  bench new_p100k_shm 40 -c configs/gpu.toml --rate 100000 --duration 2 --warmup 0.5 --transport iceoryx2 \
        --set 'runner.engine="persistent"'
  step overload_lstm_a 130 $PY tools/bench_overload.py -c "$PWD/configs/gpu.toml" --rates 30000,50000,100000,200000 \
       --duration 2 --overload 3,10 --overload-duration 2 --feed-batch 256 --json "$WORK/overload_lstm_a.json"
  summarize
  verbatim gpu_tests new_g100k_1 new_g100k_2 new_p100k_shm overload_lstm_a
elif [ "$phase" = wave12d ]; then
  # LATE on the expected wait, (queued + 1/2) places (wave12c counted queued + 1): the GPU engine tests,
  # lstm_a one event per frame at 100k, and the goodput over EventBatch frames as wave12c ran it (from 50k:
  # the device time left)
  gpu_tests 100 tests/integration/test_gpu_engines.py
  bench new_g100k_1 40 -c configs/gpu.toml --rate 100000 --duration 3 --warmup 1
  step overload_lstm_a 120 $PY tools/bench_overload.py -c "$PWD/configs/gpu.toml" --rates 50000,100000,200000 \
       --duration 2 --overload 3,10 --overload-duration 2 --feed-batch 256 --json "$WORK/overload_lstm_a.json"
  summarize
  verbatim gpu_tests new_g100k_1 overload_lstm_a
elif [ "$phase" = wave13 ]; then
  # the one-event cycle (answers as typed columns, a step of one answered from scalars, no fold while a
  # step is in flight): the GPU engine tests and the answer tests, the cycle's phases and their parts
  # (bench_hotpath --cycle-parts, this tool on both trees' packages, three cores as wave10c), then lstm_a
  # at 10k with the floor, this tree and BASE_TGZ's alternated
  setup_base
  gpu_tests 120 tests/integration/test_gpu_engines.py \
       tests/unit/test_stepper_answers.py tests/unit/test_egress_frame.py
  hotpath_pair cycle 70 --only-low-rate --cycle-parts --low-rate 2000
  for k in 1 2; do
    e2e_run new new_g10k_$k 10000 -c configs/gpu.toml
    e2e_run base base_g10k_$k 10000 -c "$PWD/configs/gpu.toml"
  done
  summarize
  verbatim gpu_tests new_cycle base_cycle new_g10k_1 base_g10k_1 new_g10k_2 base_g10k_2
elif [ "$phase" = wave13b ]; then
  # wave13 plus the gather of a batch of a few entries as ring slices (runner/staging.py) and no poll at
  # submit for asynchronous engines: the GPU engine, persistent-kernel and gather tests, the cycle's parts
  # on both trees, then lstm_a and the default model (mlp_small, graph) at 10k with the floor, alternated
  setup_base
  gpu_tests 150 tests/integration/test_gpu_engines.py \
       tests/kernels/test_kernel_persistent.py tests/unit/test_row_gather.py tests/unit/test_stepper_answers.py
  hotpath_pair cycle 70 --only-low-rate --cycle-parts --low-rate 2000
  pairs_10k
  summarize
  verbatim gpu_tests new_cycle base_cycle new_g10k_1 base_g10k_1 new_d10k_1 base_d10k_1 new_g10k_2 base_g10k_2 \
           new_d10k_2 base_d10k_2
elif [ "$phase" = wave13c ]; then
  # issue 19's path at low rates: the persistent engine's one-event cycle by parts (this tool on both trees),
  # lstm_a on the persistent engine over iceoryx2 at 10k (wave 10: service p50 202 / p99 316 µs, slower than
  # graph over ZeroMQ), this tree and BASE_TGZ's alternated; then lstm_a one event per frame at 100k, one run
  # each (the answer columns changed: no loss of throughput?)
  setup_base
  hotpath_pair cycle_p 80 --only-low-rate --cycle-parts --low-rate 2000 --engine persistent
  for k in 1 2; do
    e2e_run new new_p10k_shm_$k 10000 -c configs/gpu.toml --transport iceoryx2 --set 'runner.engine="persistent"'
    e2e_run base base_p10k_shm_$k 10000 -c "$PWD/configs/gpu.toml" --transport iceoryx2 \
            --set 'runner.engine="persistent"'
  done
  bench new_g100k 45 -c configs/gpu.toml --rate 100000 --duration 3 --warmup 1
  step base_g100k 45 "$base/py" -m hft_infer bench -c "$PWD/configs/gpu.toml" --rate 100000 --duration 3 --warmup 1 \
       --quiet --json "$WORK/base_g100k.json" --run-dir "$WORK/runs/base_g100k"
  summarize
  verbatim new_cycle_p base_cycle_p new_p10k_shm_1 base_p10k_shm_1 new_p10k_shm_2 base_p10k_shm_2 new_g100k base_g100k
elif [ "$phase" = wave13d ]; then
  # the landing check of wave 13: the GPU engine tests, then lstm_a past its capacity over EventBatch frames
  # (a column run's shed answers go in as numpy: the overloaded stateful model's ingest), this tree and
  # BASE_TGZ's interleaved by bench_overload, then the hot path's burst rows of both trees
  setup_base
  gpu_tests 90 tests/integration/test_gpu_engines.py \
       tests/unit/test_row_gather.py tests/unit/test_stepper_answers.py
  step overload_lstm_a 230 $PY tools/bench_overload.py -c "$PWD/configs/gpu.toml" --rates 50000,100000,200000 \
       --duration 2 --overload 3,10 --overload-duration 2 --feed-batch 256 --baseline-python "$base/py" \
       --json "$WORK/overload_lstm_a.json"
  hotpath_pair hotpath 60 --n 20000 --reps 3 --low-rate 0
  summarize
  verbatim gpu_tests overload_lstm_a new_hotpath base_hotpath
elif [ "$phase" = wave13e ]; then
  # a second sample of wave13d's lstm_a sweep (its points past capacity went either way within one call), and
  # the default model's (conflating: the answer columns changed), each this tree and BASE_TGZ's interleaved
  setup_base
  step overload_lstm_a 220 $PY tools/bench_overload.py -c "$PWD/configs/gpu.toml" --rates 50000,100000,200000 \
       --duration 2 --overload 3,10 --overload-duration 2 --feed-batch 256 --baseline-python "$base/py" \
       --json "$WORK/overload_lstm_a.json"
  step overload_default 220 $PY tools/bench_overload.py --rates 50000,100000,200000 --duration 2 --overload 3,10 \
       --overload-duration 2 --feed-batch 256 --baseline-python "$base/py" --json "$WORK/overload_default.json"
  summarize
  verbatim overload_lstm_a overload_default
elif [ "$phase" = wave14 ]; then
  # the GPU engine tests and the CPU engine's products (models/products.py) on this host's core beside the
  # baseline. (At c79af38 this phase also ran the one-event cycle of the graph engine with a completion flag
  # written by the graph and cudaGraphLaunch through ctypes: no gain measured, both dropped; BENCHMARKS.md wave 14.)
  setup_base
  gpu_tests 200 tests/integration/test_gpu_engines.py tests/unit/test_products.py tests/unit/test_self_check.py
  models_cpu new_models_cpu "$PY"
  models_cpu base_models_cpu "$base/py"
  summarize
  verbatim gpu_tests new_models_cpu base_models_cpu
elif [ "$phase" = wave14b ]; then
  # lstm_a (gpu.toml) and the default model (graph, busy, pinned) at 10k, this tree and the baseline alternated
  setup_base
  pairs_10k
  summarize
  verbatim new_g10k_1 base_g10k_1 new_d10k_1 base_d10k_1 new_g10k_2 base_g10k_2 new_d10k_2 base_d10k_2
elif [ "$phase" = wave14c ]; then
  # landing check: the GPU engine tests, the device half of the in-flight ingest check, the products' and
  # self-check's unit tests; then the default config's goodput sweep to 1M events/s (issue 12: >= 500k offered
  # without collapse, decided >= 90 % of capacity) and lstm_a's goodput curve from 10k to 1M, over EventBatch frames
  gpu_tests 240 "${LANDING_TESTS[@]}" tests/unit/test_products.py \
       tests/unit/test_self_check.py
  step overload_default 300 $PY tools/bench_overload.py --rates 100000,200000,500000,1000000 --duration 2 \
       --overload 3 --overload-duration 2 --feed-batch 256 --json "$WORK/overload_default.json"
  step goodput_lstm_a 300 $PY tools/bench_overload.py -c "$PWD/configs/gpu.toml" \
       --rates 10000,50000,100000,200000,500000,1000000 --duration 2 --overload 3 --overload-duration 2 \
       --feed-batch 256 --json "$WORK/goodput_lstm_a.json"
  summarize
  verbatim gpu_tests overload_default goodput_lstm_a
elif [ "$phase" = wave14d ]; then
  # issue 18 with EventBatch feeds (one batch per shard under its own topic, codec.shard_batch_topic): the GPU
  # engine tests and the shard-topic tests, then lstm_a shards at 60k/s each over EventBatch frames under MPS
  gpu_tests 200 "${LANDING_TESTS[@]}" \
       tests/unit/test_shard_batch_topic.py tests/unit/test_products.py
  step shards_batched_mps 200 env BUDGET_S=195 FLOOR=0 RATE_PER_SHARD=60000 FEED_BATCH=256 DURATION=2 \
       SHARDS="1 2 4 8" MODELS=lstm_a ORDER="lstm_a:1 lstm_a:4 lstm_a:8 lstm_a:2" \
       bash tools/with_mps.sh bash tools/bench_shards.sh "$WORK/shards_batched_mps"
  summarize
  verbatim gpu_tests shards_batched_mps
elif [ "$phase" = wave14e ]; then
  # landing check after wave14d: the GPU engine and hot-path tests (the Reset test with a deadline past the
  # host's stalls), the shard-topic, products and self-check tests
  gpu_tests 240 "${LANDING_TESTS[@]}" \
       tests/unit/test_shard_batch_topic.py tests/unit/test_products.py tests/unit/test_self_check.py
  summarize
  verbatim gpu_tests
elif [ "$phase" = wave14f ] || [ "$phase" = wave15b ]; then
  # issue 18: lstm_a shards over EventBatch under MPS, 60k/s each, N = 1 and 8. wave14f: does a cheaper product
  # move the shards' GPU wall (tf32 and bf16 products: runner.precision, self-checked against the CPU)? wave15b:
  # fp32 and tf32 with the graph engine's step cut per batch size
  precs="tf32 bf16"; [ "$phase" = wave15b ] && precs="fp32 tf32"
  shards_1_8 125 $precs
  summarize
  verbatim $(for p in $precs; do echo "shards_$p"; done)
elif [ "$phase" = wave15 ]; then
  # the graph engine's LSTM step cut per batch size (kernels/lstm.py phased_geometry, one launch per phase): the
  # GPU engine, kernel-step, capture and hot-path tests; the engines' step through the runner, this tree and
  # BASE_TGZ's alternated (graph engine; lstm_a window and stream, lstm_b, mlp_small at batch 1, 8, 64)
  setup_base
  gpu_tests 230 tests/integration/test_gpu_engines.py tests/kernels/test_kernel_step.py \
       tests/kernels/test_kernel_graph_capture.py tests/integration/test_hotpath.py
  engines_pairs
  summarize
  verbatim gpu_tests new_engines_1 base_engines_1 new_engines_2 base_engines_2
elif [ "$phase" = wave15a ]; then
  # wave15's engine pairs alone (its baseline runs had failed: the tool's benchlib not on the path)
  setup_base
  engines_pairs
  summarize
  verbatim new_engines_1 base_engines_1 new_engines_2 base_engines_2
elif [ "$phase" = wave15c ]; then
  # wave15b's 8 shards, this tree against BASE_TGZ's (one launch with grid barriers, 4 hidden units per program)
  # alternated: tf32 twice, fp32 once
  setup_base
  for run in tf32:1 tf32:2 fp32:1; do
    prec=${run%%:*}
    for who in new base; do
      py=$PY; [ "$who" = base ] && py="$base/py"
      step "shards8_${prec}_${who}_${run##*:}" 45 env PY="$py" BUDGET_S=42 FLOOR=0 RATE_PER_SHARD=60000 \
           FEED_BATCH=256 DURATION=2 SHARDS=8 MODELS=lstm_a ORDER="lstm_a:8" EXTRA_SET="runner.precision=\"$prec\"" \
           bash tools/with_mps.sh bash tools/bench_shards.sh "$WORK/shards8_${prec}_${who}_${run##*:}"
    done
  done
  summarize
elif [ "$phase" = wave16 ]; then
  # issue 18: what sets one shard's capacity? A stateful model steps one row per instrument per step, so the
  # busiest instrument's rate is the step rate it needs. lstm_a shards N = 1 and 8 (fp32, MPS, EventBatch of 256,
  # bench's steps/s and busiest/s columns): the bench's 64 instruments (busiest 4.3 % of the feed) at 60k/s per
  # shard, then 1,024 instruments (universe.instruments = 1024; busiest 0.6 %) at 60k and 125k/s per shard; then
  # py-spy of one lstm_a service at 60k/s over 64 instruments and at 125k/s over 1,024
  for run in 64:60000 1024:60000 1024:125000; do
    shards_inst "shards_i${run%%:*}_r${run##*:}" 110 "${run%%:*}" "${run##*:}" "1 8" "lstm_a:1 lstm_a:8"
  done
  step prof_i64_60k 55 env FEED_BATCH=256 SPY_RATE=1000 bash tools/profile_overload.sh "$WORK/prof_i64_60k" 60000 3 \
       -c configs/gpu.toml
  step prof_i1024_125k 55 env FEED_BATCH=256 SPY_RATE=1000 bash tools/profile_overload.sh "$WORK/prof_i1024_125k" 125000 \
       3 -c configs/gpu.toml --instruments 1024 --set universe.instruments=1024
  summarize
  verbatim shards_i64_r60000 shards_i1024_r60000 shards_i1024_r125000
  for d in prof_i64_60k prof_i1024_125k; do cp -f "$WORK/$d/spy_top.txt" "$OUT/${d}_spy_top.txt" 2>/dev/null; done
elif [ "$phase" = wave16b ]; then
  # wave16 again with the pacer's preparation before `go` (the 8-shard runs' first sends were 0.4-1.1 s late):
  # py-spy (non-blocking) of one lstm_a service at 125k/s over 1,024 instruments; lstm_a shards over 1,024
  # instruments N = 1, 2, 4, 8 at 100k/s per shard and N = 8 at 125k/s (1M offered); 8 shards over the bench's 64
  # instruments at 60k/s per shard
  step prof_i1024_125k_nb 55 env FEED_BATCH=256 SPY_RATE=250 NONBLOCKING=1 bash tools/profile_overload.sh \
       "$WORK/prof_i1024_125k_nb" 125000 3 -c configs/gpu.toml --instruments 1024 --set universe.instruments=1024
  shards_inst shards_i1024_r100000 170 1024 100000 "1 2 4 8" "lstm_a:1 lstm_a:4 lstm_a:8 lstm_a:2"
  shards_inst shards_i1024_r125000 60 1024 125000 8 lstm_a:8
  shards_inst shards_i64_r60000 50 64 60000 8 lstm_a:8
  summarize
  verbatim shards_i1024_r100000 shards_i1024_r125000 shards_i64_r60000
  cp -f "$WORK/prof_i1024_125k_nb/spy_top.txt" "$OUT/prof_i1024_125k_nb_spy_top.txt" 2>/dev/null
elif [ "$phase" = wave16c ]; then
  # the deadline admission that counts the slots queued ahead of a new one (scheduler.py turn_wait_ns): the GPU
  # engine, hot-path, kernel-step and capture tests; lstm_a past capacity over 1,024 instruments, this tree and
  # BASE_TGZ's interleaved (bench_overload); lstm_a shards over 1,024 instruments N = 1, 4, 8 at 100k/s each and
  # N = 8 at 125k/s (1M offered)
  setup_base
  gpu_tests 200 tests/integration/test_gpu_engines.py tests/kernels/test_kernel_step.py \
       tests/kernels/test_kernel_graph_capture.py tests/integration/test_hotpath.py
  step overload_i1024 190 $PY tools/bench_overload.py -c configs/gpu.toml --set universe.instruments=1024 \
       --rates 50000,100000 --duration 2 --overload 3,10 --overload-duration 2 --feed-batch 256 \
       --baseline-python "$base/py" --json "$WORK/overload_i1024.json"
  shards_inst shards_i1024_r100000 110 1024 100000 "1 4 8" "lstm_a:1 lstm_a:8 lstm_a:4"
  shards_inst shards_i1024_r125000 50 1024 125000 8 lstm_a:8
  summarize
  verbatim gpu_tests overload_i1024 shards_i1024_r100000 shards_i1024_r125000
elif [ "$phase" = wave16d ]; then
  # the scheduler's one-slice pick past a batch of queued slots: the GPU tests; py-spy (non-blocking) of one lstm_a
  # service at 100k/s over 1,024 instruments (saturated: where a shard's ~600 µs per step go); lstm_a shards over
  # 1,024 instruments N = 1 and 8 at 100k/s each and N = 8 at 125k/s, with batches of up to 64 and of up to 256
  gpu_tests 200 tests/integration/test_gpu_engines.py tests/kernels/test_kernel_step.py \
       tests/kernels/test_kernel_graph_capture.py tests/integration/test_hotpath.py
  step prof_i1024_100k 55 env FEED_BATCH=256 SPY_RATE=250 NONBLOCKING=1 bash tools/profile_overload.sh \
       "$WORK/prof_i1024_100k" 100000 3 -c configs/gpu.toml --instruments 1024 --set universe.instruments=1024
  shards_inst shards_i1024_r100000 80 1024 100000 "1 8" "lstm_a:1 lstm_a:8"
  shards_inst shards_i1024_r125000 50 1024 125000 8 lstm_a:8
  # batches of up to 256 (buckets to 256): a step's fixed host costs over 4x the rows
  b256=("scheduler.max_batch=256" "runner.buckets=[1,2,4,8,16,32,64,128,256]")
  shards_inst shards_b256_i1024_r100000 80 1024 100000 "1 8" "lstm_a:1 lstm_a:8" "${b256[@]}"
  shards_inst shards_b256_i1024_r125000 50 1024 125000 8 lstm_a:8 "${b256[@]}"
  summarize
  verbatim gpu_tests shards_i1024_r100000 shards_i1024_r125000 shards_b256_i1024_r100000 shards_b256_i1024_r125000
  cp -f "$WORK/prof_i1024_100k/spy_top.txt" "$OUT/prof_i1024_100k_spy_top.txt" 2>/dev/null
elif [ "$phase" = wave18 ]; then
  # ingest.coalesce_us (stepper.py): while a full batch is queued, read the feed at most once per that long, so
  # that a saturated shard pays a burst's fixed cost once per many frames. GPU tests; lstm_a shards over 1,024
  # instruments N = 1 and 8 at 100k/s each, coalesce_us 250, 0 and 1000 (one call: contention varies call to call);
  # py-spy (non-blocking) of one shard at 100k/s with coalesce_us = 1000; where the column path starts to pay on
  # this host's core (ingest_batch.COLUMNS_MIN, set from the dev VM's crossover in wave 18), both model kinds
  gpu_tests 200 tests/integration/test_gpu_engines.py tests/kernels/test_kernel_step.py \
       tests/kernels/test_kernel_graph_capture.py tests/integration/test_hotpath.py tests/unit/test_feed_coalescing.py
  for c in 250 0 1000; do
    shards_inst "shards_c${c}_i1024_r100000" 75 1024 100000 "1 8" "lstm_a:1 lstm_a:8" "ingest.coalesce_us=$c"
  done
  step prof_c1000_i1024_100k 55 env FEED_BATCH=256 SPY_RATE=250 NONBLOCKING=1 bash tools/profile_overload.sh \
       "$WORK/prof_c1000_i1024_100k" 100000 3 -c configs/gpu.toml --instruments 1024 --set universe.instruments=1024 \
       --set ingest.coalesce_us=1000
  for kind in seq conf; do
    flag=; [ "$kind" = conf ] && flag=--conflating
    step "columns_min_$kind" 50 taskset -c 2 $PY tools/bench_hotpath.py --run-sizes 1024 --n 20000 --reps 2 \
         --columns-min 32,48,64,96 --frame-sizes 32,48,64,96 $flag
  done
  summarize
  verbatim gpu_tests shards_c250_i1024_r100000 shards_c0_i1024_r100000 shards_c1000_i1024_r100000 columns_min_seq \
       columns_min_conf
  cp -f "$WORK/prof_c1000_i1024_100k/spy_top.txt" "$OUT/prof_c1000_i1024_100k_spy_top.txt" 2>/dev/null
elif [ "$phase" = wave19 ]; then
  # runner.precision: a GPU service in bf16 and tf32 held by replay --verify to its precision's tolerance (its Status
  # says which; tests/integration/test_replay.py runs the CPU engine's case everywhere, the GPU engines' here); the
  # CPU engine's bf16 products (AMX or AVX512-BF16 where this host's core has them) against fp32, one thread
  gpu_tests 200 tests/integration/test_replay.py tests/unit/test_products.py tests/integration/test_gpu_engines.py
  for prec in bf16 tf32; do
    step "verify_$prec" 90 $PY -m hft_infer replay synthetic --events 20000 --max --feed-batch 64 --verify \
         --start-service -c configs/gpu.toml --set "runner.precision=\"$prec\"" --quiet --run-dir "$WORK/runs/verify_$prec"
  done
  step models_cpu_bf16 150 taskset -c 2 $PY tools/bench_models_cpu.py --presets mlp_small lstm_a lstm_b \
       --batches 1 8 64 --no-compile --rounds 3
  summarize
  verbatim gpu_tests verify_bf16 verify_tf32 models_cpu_bf16
elif [ "$phase" = wave20 ]; then
  # issue 18's 1M decided/s: 8 shards at 125k/s each decided less than at 100k/s each (waves 16c/16d: eight
  # saturated shards contend), so 1M is offered across more shards, each at or below the rate one shard keeps up
  # with (100k/s, wave18): 10 x 100k and 12 x 84k; N = 1 and 4 at 100k/s for the 1 -> 4 efficiency, same call
  shards_inst shards_i1024_r100000 170 1024 100000 "1 4 10" "lstm_a:10 lstm_a:1 lstm_a:4"
  shards_inst shards_i1024_r84000 90 1024 84000 12 lstm_a:12
  summarize
  verbatim shards_i1024_r100000 shards_i1024_r84000
elif [ "$phase" = wave21 ]; then
  # placement: each shard's libzmq IO (helper) threads were allowed on every core but its own hot core, i.e. on
  # the other shards' busy-polling cores (wave20's shard 9 of 12: IO threads on 0,4-5,7-15); now every shard's hot
  # core (and its SMT siblings) is kept free of helpers. The host's SMT topology first; then 12 lstm_a shards at
  # 84k/s each over 1,024 instruments, this tree and BASE_TGZ's alternated twice (the call-to-call spread is large);
  # BASE_TGZ: this tree with placement's `reserved = set()` (helpers off the shard's own hot core only), so that
  # both report the hot threads' preemptions (hot_preemptions, hot_runqueue_wait_us in each shard's service.json)
  gpu_tests 150 tests/integration/test_hotpath.py tests/unit/test_affinity.py tests/unit/test_stepper_answers.py
  step topology 15 bash -c 'lscpu; for c in /sys/devices/system/cpu/cpu[0-9]*; do
       echo "$(basename "$c") siblings $(cat "$c/topology/thread_siblings_list" 2>/dev/null)"; done'
  setup_base
  shards_alternated shards12 2 60 1024 84000 12 lstm_a:12
  # where one saturated shard's loop goes (py-spy without pausing it; profile_overload.sh now waits for the
  # service to be serving, wave18's caught its start-up)
  step prof_i1024_100k 55 env FEED_BATCH=256 SPY_RATE=250 NONBLOCKING=1 bash tools/profile_overload.sh \
       "$WORK/prof_i1024_100k" 100000 3 -c configs/gpu.toml --instruments 1024 --set universe.instruments=1024
  summarize
  verbatim gpu_tests topology shards12_new_1 shards12_base_1 shards12_new_2 shards12_base_2 prof_i1024_100k
  cp -f "$WORK/prof_i1024_100k/spy_top.txt" "$OUT/prof_i1024_100k_spy_top.txt" 2>/dev/null
elif [ "$phase" = wave22 ]; then
  # the eighteenth session's landing check: the GPU engine and hot-path tests, placement, the hot thread's counters; issue 18's
  # 1M offered again (12 x 84k/s, 10 x 100k/s over 1,024 instruments): another sample of this host's spread
  gpu_tests 200 "${LANDING_TESTS[@]}" \
       tests/unit/test_hot_thread_stats.py tests/unit/test_affinity.py
  shards_inst shards_i1024_r84000 60 1024 84000 12 lstm_a:12
  shards_inst shards_i1024_r100000 60 1024 100000 10 lstm_a:10
  summarize
  verbatim gpu_tests shards_i1024_r84000 shards_i1024_r100000
elif [ "$phase" = wave23 ]; then
  # the stall counters (hft_infer/loop_stalls.py) of saturated lstm_a shards: which phase the ~1.4 ms loop_gap
  # stalls of waves 20-22 come from (each shard's service.json: stalls, stall_<phase>_us)
  shards_inst shards_i1024_r100000 55 1024 100000 1 lstm_a:1
  [ "${WAVE23_SHARDS12:-1}" = 1 ] && shards_inst shards_i1024_r84000 60 1024 84000 12 lstm_a:12
  summarize
  verbatim shards_i1024_r100000 shards_i1024_r84000
elif [ "$phase" = wave24 ]; then
  # deadline admission's learned margin (87f86b8): wave23's saturated lstm_a shard (1,024 instruments, 100k/s)
  # decided 55k and stepped 55k rows stale; 1 and 12 shards, this tree and BASE_TGZ's (the commit before)
  # alternated; each shard's service.json has rejected_by_reason (STALE, LATE, QUEUE_FULL) and the margin
  gpu_tests 150 "${LANDING_TESTS[@]}"
  setup_base
  shards_alternated shards1 2 50 1024 100000 1 lstm_a:1
  shards_alternated shards12 1 90 1024 84000 12 lstm_a:12
  # the feed's lognormal activity puts 1.11x the mean events on the busiest of 12 shards by position:
  # the same run with the shards balanced by the feed's counts (bench --balance-shards)
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal 90 1024 84000 12 lstm_a:12
  # wave23 found ~75 % of a saturated shard's loop in ingest at ~7 µs an event, where bench_hotpath reads
  # the same frames back to back at ~1-2: the same burst back to back and after the service's own graph step
  step cold_burst 70 taskset -c 2 $PY tools/bench_cold_burst.py --reps 20 --json "$WORK/cold_burst.json"
  # each of 12 shards owns ~85 instruments: a step of up to 128 rows can take every queued one (this tree)
  shards_inst shards12_b128 90 1024 84000 12 lstm_a:12 scheduler.max_batch=128 "runner.buckets=[1,2,4,8,16,32,64,128]"
  summarize
  verbatim gpu_tests shards1_new_1 shards1_base_1 shards1_new_2 shards1_base_2 shards12_new_1 shards12_base_1 \
           shards12_bal cold_burst shards12_b128
elif [ "$phase" = wave24s ]; then
  # wave24 for a short call, most telling first: the GPU tests at the landing commit, 12 shards by
  # position against 12 balanced by the feed's counts (same tree, back to back), the cold burst, then
  # one saturated shard this tree against BASE_TGZ's; a step that would end past BUDGET_S is skipped
  gpu_tests 150 "${LANDING_TESTS[@]}"
  shards_inst shards12_pos 90 1024 84000 12 lstm_a:12
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal 90 1024 84000 12 lstm_a:12
  step cold_burst 70 taskset -c 2 $PY tools/bench_cold_burst.py --reps 20 --json "$WORK/cold_burst.json"
  setup_base
  shards_alternated shards1 1 50 1024 100000 1 lstm_a:1
  summarize
  verbatim gpu_tests shards12_pos shards12_bal cold_burst shards1_new_1 shards1_base_1
elif [ "$phase" = wave24b ]; then
  # wave24's two levers of 12 saturated lstm_a shards together (balanced by the feed's counts: +15 %; steps of up
  # to 128 rows: +17 %, each against one run by position): by position and balanced, at max_batch 64 and 128
  shards_inst shards12_pos 90 1024 84000 12 lstm_a:12
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal 90 1024 84000 12 lstm_a:12
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal_b128 90 1024 84000 12 lstm_a:12 scheduler.max_batch=128 \
    "runner.buckets=[1,2,4,8,16,32,64,128]"
  shards_inst shards12_pos_b128 90 1024 84000 12 lstm_a:12 scheduler.max_batch=128 "runner.buckets=[1,2,4,8,16,32,64,128]"
  summarize
  verbatim shards12_pos shards12_bal shards12_bal_b128 shards12_pos_b128
elif [ "$phase" = wave25 ]; then
  # the column path's push as numpy scatters (Scheduler.push_columns, cc15a15) against BASE_TGZ (the commit
  # before): the GPU tests at the landing commit, the burst's parts on this host's core, one saturated lstm_a
  # shard this tree and the base alternated; then 12 shards at 84k/s each (a step past BUDGET_S is skipped)
  gpu_tests 150 "${LANDING_TESTS[@]}"
  setup_base
  step cold_burst_new 75 taskset -c 2 $PY tools/bench_cold_burst.py --reps 15 --phases --json "$WORK/cold_burst_new.json"
  step cold_burst_base 75 env PYTHONPATH="tools${PYTHONPATH:+:$PYTHONPATH}" taskset -c 2 "$base/py" \
       tools/bench_cold_burst.py --reps 15 --phases --json "$WORK/cold_burst_base.json"
  shards_alternated shards1 1 50 1024 100000 1 lstm_a:1
  # issue 18's 1M offered with wave 23's two levers (balanced by the feed's counts; steps of up to 128 rows)
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal_b128 90 1024 84000 12 lstm_a:12 scheduler.max_batch=128 \
    "runner.buckets=[1,2,4,8,16,32,64,128]"
  summarize
  verbatim gpu_tests cold_burst_new cold_burst_base shards1_new_1 shards1_base_1 shards12_bal_b128
elif [ "$phase" = wave25b ]; then
  # ingest.coalesce_us past a loop iteration: a saturated lstm_a shard's burst is ~2/3 fixed cost (~470 µs after
  # the graph step on an H100 host's core, BENCHMARKS.md wave 24) and its iteration ~1.2 ms, so wave 18's 250 /
  # 1000 µs (time since the last read) almost never held a read; 2000-3000 should read every other iteration
  # while a full batch is queued (runs twice the size, one fixed cost per two steps). One shard alternated
  # twice, 0 against 2500; then 12 balanced shards at max_batch 128 with 0 and 2500
  for r in 1 2; do
    for c in 0 2500; do
      shards_inst "shards1_c${c}_$r" 50 1024 100000 1 lstm_a:1 "ingest.coalesce_us=$c"
    done
  done
  for c in 2500 0; do
    EXTRA_ARGS=--balance-shards shards_inst "shards12_bal_b128_c$c" 90 1024 84000 12 lstm_a:12 \
      scheduler.max_batch=128 "runner.buckets=[1,2,4,8,16,32,64,128]" "ingest.coalesce_us=$c"
  done
  summarize
  verbatim shards1_c0_1 shards1_c2500_1 shards1_c0_2 shards1_c2500_2 shards12_bal_b128_c2500 shards12_bal_b128_c0
elif [ "$phase" = wave25c ]; then
  # the landing check of coalescing's three-quarter rule and gpu.toml's coalesce_us = 2500: the GPU tests;
  # 12 balanced shards at max_batch 128 with it and with 0 (wave25b's held no read: a shard's full batch was
  # all its ~85 slots); gpu.toml at 10k/s with it and with 0 (below capacity nothing should wait); 12 balanced
  # shards at gpu.toml's max_batch 64
  gpu_tests 150 "${LANDING_TESTS[@]}"
  B128=(scheduler.max_batch=128 "runner.buckets=[1,2,4,8,16,32,64,128]")
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal_b128_c2500 90 1024 84000 12 lstm_a:12 "${B128[@]}"
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal_b128_c0 90 1024 84000 12 lstm_a:12 "${B128[@]}" \
    ingest.coalesce_us=0
  bench gpu_10k_c2500 50 -c configs/gpu.toml --rate 10000 --duration 2 --with-floor
  bench gpu_10k_c0 50 -c configs/gpu.toml --rate 10000 --duration 2 --with-floor --set ingest.coalesce_us=0
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal_c2500 90 1024 84000 12 lstm_a:12
  summarize
  verbatim gpu_tests shards12_bal_b128_c2500 shards12_bal_b128_c0 gpu_10k_c2500 gpu_10k_c0 shards12_bal_c2500
elif [ "$phase" = wave25d ]; then
  # coalescing past capacity at half the last step (no read found the socket empty for coalesce_us): the GPU
  # tests at the landing commit; 12 balanced shards (gpu.toml's max_batch 64) with gpu.toml's 2500 and with 0,
  # alternated; one saturated shard with 2500
  gpu_tests 150 "${LANDING_TESTS[@]}"
  for c in 2500 0; do
    EXTRA_ARGS=--balance-shards shards_inst "shards12_bal_c$c" 80 1024 84000 12 lstm_a:12 "ingest.coalesce_us=$c"
  done
  shards_inst shards1_c2500 45 1024 100000 1 lstm_a:1
  summarize
  verbatim gpu_tests shards12_bal_c2500 shards12_bal_c0 shards1_c2500
elif [ "$phase" = wave26 ]; then
  # coalescing past capacity on the H200 host (wave 24 ran on an H100 host): the GPU tests at the landing commit;
  # 12 balanced shards (gpu.toml's max_batch 64) with gpu.toml's 2500 and with 0, alternated; one saturated shard
  # with both; the second 12-shard pair last (a step past BUDGET_S is skipped)
  gpu_tests 150 "${LANDING_TESTS[@]}"
  for c in 2500 0; do
    EXTRA_ARGS=--balance-shards shards_inst "shards12_bal_c${c}_1" 80 1024 84000 12 lstm_a:12 "ingest.coalesce_us=$c"
  done
  for c in 2500 0; do
    shards_inst "shards1_c$c" 45 1024 100000 1 lstm_a:1 "ingest.coalesce_us=$c"
  done
  for c in 2500 0; do
    EXTRA_ARGS=--balance-shards shards_inst "shards12_bal_c${c}_2" 80 1024 84000 12 lstm_a:12 "ingest.coalesce_us=$c"
  done
  summarize
  verbatim gpu_tests shards12_bal_c2500_1 shards12_bal_c0_1 shards1_c2500 shards1_c0 shards12_bal_c2500_2 \
           shards12_bal_c0_2
elif [ "$phase" = wave26b ]; then
  # coalesce_us around gpu.toml's 2500 for 12 balanced shards (1500, 3500), 2500 with steps of up to 128 rows;
  # gpu.toml below capacity (10k and 50k/s) with 2500 and 0: reads held where nothing should wait
  for c in 1500 3500; do
    EXTRA_ARGS=--balance-shards shards_inst "shards12_bal_c$c" 80 1024 84000 12 lstm_a:12 "ingest.coalesce_us=$c"
  done
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal_b128_c2500 80 1024 84000 12 lstm_a:12 \
    scheduler.max_batch=128 "runner.buckets=[1,2,4,8,16,32,64,128]"
  for r in 10000 50000; do
    bench "gpu_${r}_c2500" 45 -c configs/gpu.toml --rate $r --duration 2 --with-floor
    bench "gpu_${r}_c0" 45 -c configs/gpu.toml --rate $r --duration 2 --with-floor --set ingest.coalesce_us=0
  done
  summarize
  verbatim shards12_bal_c1500 shards12_bal_c3500 shards12_bal_b128_c2500 gpu_10000_c2500 gpu_10000_c0 \
           gpu_50000_c2500 gpu_50000_c0
elif [ "$phase" = wave26c ]; then
  # coalescing's past-capacity hold only after a step of half a full batch (wave26b: gpu.toml at 10k/s held
  # 121 reads and its service stage doubled): GPU tests at the landing commit; gpu.toml at 10k and 50k/s with
  # 2500 and 0, alternated twice; one saturated shard and 12 balanced shards with 2500 (the hold must stay)
  gpu_tests 150 "${LANDING_TESTS[@]}"
  for r in 1 2; do
    for rate in 10000 50000; do
      bench "gpu_${rate}_c2500_$r" 45 -c configs/gpu.toml --rate $rate --duration 2 --with-floor
      bench "gpu_${rate}_c0_$r" 45 -c configs/gpu.toml --rate $rate --duration 2 --with-floor --set ingest.coalesce_us=0
    done
  done
  shards_inst shards1_c2500 45 1024 100000 1 lstm_a:1
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal_c2500 80 1024 84000 12 lstm_a:12
  summarize
  verbatim gpu_tests gpu_10000_c2500_1 gpu_10000_c0_1 gpu_50000_c2500_1 gpu_50000_c0_1 gpu_10000_c2500_2 \
           gpu_10000_c0_2 gpu_50000_c2500_2 gpu_50000_c0_2 shards1_c2500 shards12_bal_c2500
elif [ "$phase" = wave26d ]; then
  # 12 shards with the feed over iceoryx2 (no libzmq I/O thread for it: over ZeroMQ every shard's and the
  # pacer's share the one helper core): GPU tests at the landing commit; 12 balanced shards over iceoryx2 and over ZeroMQ with 2500; gpu.toml
  # at 50k/s with 2500 and 0; one saturated shard; 12 over iceoryx2 with 0 last (a step past BUDGET_S is skipped)
  gpu_tests 150 "${LANDING_TESTS[@]}"
  EXTRA_ARGS="--balance-shards --transport iceoryx2" shards_inst shards12_shm_c2500 80 1024 84000 12 lstm_a:12
  EXTRA_ARGS=--balance-shards shards_inst shards12_bal_c2500 80 1024 84000 12 lstm_a:12
  bench gpu_50000_c2500 45 -c configs/gpu.toml --rate 50000 --duration 2 --with-floor
  bench gpu_50000_c0 45 -c configs/gpu.toml --rate 50000 --duration 2 --with-floor --set ingest.coalesce_us=0
  shards_inst shards1_c2500 45 1024 100000 1 lstm_a:1
  EXTRA_ARGS="--balance-shards --transport iceoryx2" shards_inst shards12_shm_c0 80 1024 84000 12 lstm_a:12 \
    ingest.coalesce_us=0
  summarize
  verbatim gpu_tests shards12_shm_c2500 shards12_bal_c2500 gpu_50000_c2500 gpu_50000_c0 shards1_c2500 shards12_shm_c0
elif [ "$phase" = wave28m ]; then
  # the branch next/submit-ahead (BASE_TGZ) decided 104,944/s in 12 shards without a step ahead in wave27d
  # (every shard shed every event LATE from its second second; 890,187 with one ahead): the branch or the host?
  # This tree (main) and the branch alternated twice, then the branch a step ahead and this tree, both at
  # max_inflight 3 (what a step ahead needs on a GPU engine), each core's load sampled (cpu_sampled)
  gpu_tests 150 "${LANDING_TESTS[@]}"
  setup_base
  for r in 1 2; do
    EXTRA_ARGS=--balance-shards cpu_sampled shards12_main_$r shards_inst shards12_main_$r 60 1024 84000 12 lstm_a:12
    PY="$base/py" EXTRA_ARGS=--balance-shards cpu_sampled shards12_branch0_$r \
      shards_inst shards12_branch0_$r 60 1024 84000 12 lstm_a:12
  done
  PY="$base/py" EXTRA_ARGS=--balance-shards cpu_sampled shards12_branch1_if3 \
    shards_inst shards12_branch1_if3 60 1024 84000 12 lstm_a:12 runner.submit_ahead=1 runner.max_inflight=3
  EXTRA_ARGS=--balance-shards cpu_sampled shards12_main_if3 shards_inst shards12_main_if3 60 1024 84000 12 lstm_a:12 \
    runner.max_inflight=3
  summarize
  verbatim gpu_tests shards12_main_1 shards12_branch0_1 shards12_main_2 shards12_branch0_2 shards12_branch1_if3 \
    shards12_main_if3
elif [ "$phase" = wave28n ]; then
  # wave28m: in every 12-shard run the one helper core (0: every libzmq IO thread of the shards, the pacer and
  # the collectors) was 100 % busy while the feed ran, and the runs decided 302k-911k/s, in spells of every
  # event shed LATE (read > max_age after its send). The same 1.008M over 11 and 10 shards leaves cores 4 (and
  # 5) to the helpers too; alternated twice with 12
  for r in 1 2; do
    EXTRA_ARGS=--balance-shards cpu_sampled shards12_$r shards_inst shards12_$r 60 1024 84000 12 lstm_a:12
    EXTRA_ARGS=--balance-shards cpu_sampled shards11_$r shards_inst shards11_$r 60 1024 91637 11 lstm_a:11
    EXTRA_ARGS=--balance-shards cpu_sampled shards10_$r shards_inst shards10_$r 60 1024 100800 10 lstm_a:10
  done
  summarize
  verbatim shards12_1 shards11_1 shards10_1 shards12_2 shards11_2 shards10_2
elif [ "$phase" = wave28q ]; then
  # bench --shards now keeps two helper cores (12 shards on 16 cores: one collector); wave28n's 12 shards had one
  # (722k / 856k decided/s beside 11 shards' 911k / 962k). Around them, runner.submit_ahead (BASE_TGZ: the branch)
  # against none, both at max_inflight 3, over 11 shards
  setup_base
  EXTRA_ARGS=--balance-shards cpu_sampled shards12_h2_1 shards_inst shards12_h2_1 60 1024 84000 12 lstm_a:12
  PY="$base/py" EXTRA_ARGS=--balance-shards cpu_sampled shards11_ahead1_if3 shards_inst shards11_ahead1_if3 60 \
    1024 91637 11 lstm_a:11 runner.submit_ahead=1 runner.max_inflight=3
  EXTRA_ARGS=--balance-shards cpu_sampled shards11_main_if3 shards_inst shards11_main_if3 60 1024 91637 11 \
    lstm_a:11 runner.max_inflight=3
  EXTRA_ARGS=--balance-shards cpu_sampled shards12_h2_2 shards_inst shards12_h2_2 60 1024 84000 12 lstm_a:12
  gpu_tests 160 "${LANDING_TESTS[@]}"
  summarize
  verbatim shards12_h2_1 shards11_ahead1_if3 shards11_main_if3 shards12_h2_2 gpu_tests
elif [ "$phase" = wave28r ]; then
  # wave28q: 11 shards at 1.008M decided ~944k/s in fp32 a step ahead or not; the shards together stepped ~1M rows/s,
  # about the fp32 FMA rate of the lstm_a cut (67 us at batch 64 on the H200). Reduced precision's tensor-core products
  # (tf32; self-checked at start-up) against fp32 in the same call: first the GPU tests (this commit's), then the GPU
  # alone (11 processes stepping the engine back to back, tools/bench_gpu_ceiling.py), then the shards at 1.012M
  gpu_tests 160 "${LANDING_TESTS[@]}"
  cpu_sampled gpu_ceiling step gpu_ceiling 140 bash tools/with_mps.sh $PY tools/bench_gpu_ceiling.py --procs 11 \
    --batches 42,64 --precisions fp32,tf32 --seconds 2 --cores 5-15 --json "$WORK/gpu_ceiling.json"
  # 92k a shard: 1.012M offered, so that >= 1M decided means shed <= 1.2 % (issue 18 asks both)
  for prec in tf32 fp32; do
    EXTRA_ARGS=--balance-shards cpu_sampled "shards11_$prec" shards_inst "shards11_$prec" 60 1024 92000 11 lstm_a:11 \
      runner.precision=$prec
  done
  EXTRA_ARGS=--balance-shards cpu_sampled shards11_tf32_if4 shards_inst shards11_tf32_if4 60 1024 92000 11 \
    lstm_a:11 runner.precision=tf32 runner.max_inflight=4
  summarize
  verbatim gpu_tests gpu_ceiling shards11_tf32 shards11_fp32 shards11_tf32_if4
elif [ "$phase" = wave29a ]; then
  # kernels/lstm.py: layer 1's input projection per tile (every program projected every entry of the batch,
  # a serial pass per 16), and the head spread over the programs (one program ran it). The GPU's rows/s
  # ceiling at 42-row steps in tf32, BASE_TGZ's tree then this one; the shards at 1.012M in tf32 with 4 steps
  # in flight, then with finer buckets in tf32 and bf16; the GPU tests (engines, hot path, the kernels' own);
  # the ceiling in bf16 and fp32; the engine's step at batch 1, 8, 64 in both trees
  setup_base
  for who in base new; do
    py=$PY; [ "$who" = base ] && py="$base/py"
    cpu_sampled "ceiling_tf32_$who" step "ceiling_tf32_$who" 90 env PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" \
      bash tools/with_mps.sh "$py" tools/bench_gpu_ceiling.py --procs 11 --batches 42 --precisions tf32 --seconds 2 \
      --cores 5-15 --json "$WORK/ceiling_tf32_$who.json"
  done
  # gpu.toml's buckets pad a 42-row step to 64 rows (and 17-31 to 32): buckets every 4-8 rows beside them
  fine="runner.buckets=[1,2,4,8,12,16,20,24,28,32,40,48,56,64]"
  shards11 shards11_tf32_if4 60 92000 tf32
  for prec in tf32 bf16; do
    shards11 "shards11_${prec}_if4_fine" 60 92000 "$prec" "$fine"
  done
  gpu_tests 200 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_step.py \
    tests/kernels/test_kernel_graph_capture.py tests/kernels/test_kernel_persistent.py
  cpu_sampled ceiling_new step ceiling_new 90 bash tools/with_mps.sh $PY tools/bench_gpu_ceiling.py --procs 11 \
    --batches 42 --precisions bf16,fp32 --seconds 2 --cores 5-15 --json "$WORK/ceiling_new.json"
  for who in new base; do
    py=$PY; [ "$who" = base ] && py="$base/py"
    step "${who}_engines" 80 env PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" taskset -c 2 "$py" \
      tools/bench_engines.py --quick --engines graph --models lstm_a/window --batches 1,8,64 \
      --json "$WORK/${who}_engines.json"
  done
  summarize
  verbatim ceiling_tf32_base ceiling_tf32_new shards11_tf32_if4 shards11_tf32_if4_fine shards11_bf16_if4_fine \
    gpu_tests ceiling_new new_engines base_engines
elif [ "$phase" = wave29b ]; then
  # wave29a's shards ran with a cold Triton cache for the new kernels (each run cut off at its cap after the feed,
  # ~1.7k steps a shard a second where wave28r's host stepped ~3.4k, the GPU 70 % busy, bf16 no better): warm
  # both trees' tf32 kernels first, then 11 shards at 1.012M in tf32 with 4 in flight, BASE_TGZ's tree and this
  # one alternated, this one with finer buckets; then the GPU tests, the kernels' own last
  setup_base
  warm_graph warm_new "$PY"
  warm_graph warm_base "$base/py"
  fine="runner.buckets=[1,2,4,8,12,16,20,24,28,32,40,48,56,64]"
  PY="$base/py" shards11 shards11_base 70 92000 tf32
  shards11 shards11_new 70 92000 tf32
  shards11 shards11_new_fine 70 92000 tf32 "$fine"
  gpu_tests 170 "${LANDING_TESTS[@]}"
  step kernel_tests 150 $PY -m pytest -q -rs -p no:cacheprovider --durations=8 tests/kernels/test_kernel_step.py \
    tests/kernels/test_kernel_graph_capture.py tests/kernels/test_kernel_persistent.py
  summarize
  verbatim shards11_base shards11_new shards11_new_fine gpu_tests kernel_tests
elif [ "$phase" = wave29c ]; then
  # wave29b: 11 tf32 shards at 1.012M (4 in flight) decided ~92k/s each in every whole second of the feed but shed
  # ~3.5-4k events each LATE in one spell near its start, 1.6 % of a 2.5 s feed (both trees). The same over 8 s of
  # feed in tf32, bf16 and fp32, and tf32 at 1.1M (how much room is left); the GPU tests at the end
  warm_graph warm "$PY"
  for prec in tf32 bf16 fp32; do
    FEED_S=8 shards11 "shards11_${prec}_8s" 80 92000 "$prec"
  done
  FEED_S=8 shards11 shards11_tf32_8s_1100k 80 100000 tf32
  gpu_tests 170 "${LANDING_TESTS[@]}"
  summarize
  verbatim shards11_tf32_8s shards11_bf16_8s shards11_fp32_8s shards11_tf32_8s_1100k gpu_tests
elif [ "$phase" = wave29d ]; then
  # wave29c's 8 s feeds ran past their 70 s caps before the feed began (the bench process built 8.6M events for
  # ~42 s on one core, the pacer its frames for ~15 s more): one run of 6 s of feed with room for that
  FEED_S=6 shards11 shards11_tf32_6s 130 92000 tf32
  summarize
  verbatim shards11_tf32_6s
elif [ "$phase" = wave29e ]; then
  # wave29d's 6 s feed ran in the slow regime of wave29a (every shard coalescing its reads, ~1.9k steps/s of ~48 rows
  # where wave29b's fast runs stepped ~5.9k/s of ~16): the same run with ingest.coalesce_us = 0
  FEED_S=6 shards11 shards11_tf32_6s_c0 130 92000 tf32 ingest.coalesce_us=0
  summarize
  verbatim shards11_tf32_6s_c0
elif [ "$phase" = wave30a ]; then
  # A change to the serving path judged against BASE_TGZ's tree over 11 tf32 shards at 1.012M, 4 in flight, 6 s of
  # feed (this tree = next/feed-start, BASE_TGZ = main: wave 29's LATE spell near a feed's start, which a lazy
  # numpy.ma import in the first burst causes on the dev VM; or next/graph-warm-replay), each
  # tree with gpu.toml's ingest.coalesce_us (2,500) and with 0 (wave 29's slow regime held reads in every shard);
  # the GPU tests of this tree last, so that it can land from this call
  setup_base
  warm_graph warm "$PY"
  for c in 2500 0; do
    for who in base new; do
      py=$PY; [ "$who" = base ] && py="$base/py"
      PY="$py" FEED_S=6 shards11 "shards11_${who}_c$c" 100 92000 tf32 ingest.coalesce_us=$c
    done
  done
  gpu_tests 170 "${LANDING_TESTS[@]}"
  summarize
  verbatim shards11_base_c2500 shards11_new_c2500 shards11_base_c0 shards11_new_c0 gpu_tests
elif [ "$phase" = wave30b ]; then
  # Which regime a host's 11 shards at 1.012M land in (BENCHMARKS.md wave 30): every run of a device call has landed
  # in the same one, and the fast host's graph step was the quickest on the host side, so the host's own speed is
  # recorded beside the run: lscpu, one core's ingest of 9-event EventBatch frames (the shards' frames at 1M), the
  # graph step (bench_engines --quick). The GPU tests come first: a change lands from this call.
  gpu_tests 170 "${LANDING_TESTS[@]}"
  hostcal
  shards11 shards11_tf32 70 92000 tf32
  summarize
  verbatim gpu_tests host_cpu host_ingest warm shards11_tf32
elif [ "$phase" = wave30c ]; then
  # wave 30's cost model: a shard keeps up while its host cost per event (ingest + its share of a step's complete and
  # submit) stays under 1 / its rate; a host that decided ~80k/s a shard at 92k offered (c ~12.5 µs) should keep up at
  # 75k a shard with small steps and little shed, and not at 85k. Below the rate, no slow regime; above it, one.
  hostcal
  for rate in 75000 85000; do
    shards11 "shards11_${rate}" 70 "$rate" tf32
  done
  summarize
  verbatim host_ingest warm shards11_75000 shards11_85000
elif [ "$phase" = wave30d ]; then
  # wave30c's shards shed ~8 % at 75k, 85k and 92k a shard alike, with t2d p50 ~3.6 ms against the 5 ms deadline:
  # a latency limit, not a capacity one? With scheduler.max_age_us 10,000 the same load shows which (a diagnostic:
  # the target's deadline is 5 ms); coalesce_us 1000 shortens the socket's share of that latency (wire p50 ~1.3 ms
  # under 2500)
  hostcal
  shards11 shards11_age10ms 70 92000 tf32 scheduler.max_age_us=10000
  shards11 shards11_c1000 70 92000 tf32 ingest.coalesce_us=1000
  summarize
  verbatim host_ingest warm shards11_age10ms shards11_c1000
elif [ "$phase" = wave30e ]; then
  # wave30d's two runs came from a host quicker than wave30b/c's (hostcal): gpu.toml's coalescing beside them on one host
  hostcal
  for v in c2500:ingest.coalesce_us=2500 c1000:ingest.coalesce_us=1000 age10ms:scheduler.max_age_us=10000 \
           c1000b:ingest.coalesce_us=1000; do
    shards11 "shards11_${v%%:*}" 70 92000 tf32 "${v#*:}"
  done
  summarize
  verbatim host_ingest warm shards11_c2500 shards11_c1000 shards11_age10ms shards11_c1000b
elif [ "$phase" = wave30f ]; then
  # bf16 against tf32 on one host, alternated (wave 30: a quick host's GPU was 88-90 % busy at 1.012M in tf32; bf16's
  # steps are ~1.24x cheaper on the GPU, wave 29's ceiling), beside the host's speed
  hostcal
  for v in tf32 bf16 bf16b tf32b; do
    shards11 "shards11_$v" 70 92000 "${v%b}"
  done
  summarize
  verbatim host_ingest warm shards11_tf32 shards11_bf16 shards11_bf16b shards11_tf32b
elif [ "$phase" = wave30g ]; then
  # the 10 ms deadline beside gpu.toml's 5 ms on whatever host comes (wave30d/e ran it on a quick host only): on a slow
  # host, does the deadline alone take the shed under 1 % (a latency limit), or is the host short of capacity?
  hostcal
  for v in c2500:ingest.coalesce_us=2500 age10ms:scheduler.max_age_us=10000; do
    shards11 "shards11_${v%%:*}" 70 92000 tf32 "${v#*:}"
  done
  summarize
  verbatim host_ingest warm shards11_c2500 shards11_age10ms
elif [ "$phase" = wave31a ]; then
  # runner.chain_steps (every finished step collected, steps submitted while the engine takes one, per iteration)
  # against one of each, alternated on one host: wave 30's shed at 1.012M sat in the shards holding the busiest
  # instruments (shards 0-1 of 11: 5.8k and 4.4k events/s against 2-3.7k steps/s)
  hostcal
  chain_alternation11 host_ingest warm
elif [ "$phase" = wave31b ]; then
  # landing runner.chain_steps: the GPU tests at this commit, then wave31a's alternation once more on whatever host
  # comes (wave31a's was a slow one: chained 924,995 / 942,610 against 840,073 / 934,722)
  gpu_tests 300 "${LANDING_TESTS[@]}"
  hostcal
  chain_alternation11 gpu_tests host_ingest warm
elif [ "$phase" = wave31c ]; then
  # runner.chain_steps on one service (gpu.toml: lstm_a, 64 instruments, per-event frames), where the busiest
  # instrument carries 4.3 % of the feed: chained and one step an iteration alternated at 200k (issue 12's
  # "sustained >= 200k"), once each at 100k and 10k (the latency targets' rates), and 200k with 4 in flight
  hostcal
  for v in chain:true one:false chainb:true oneb:false; do
    bench "gpu_200k_${v%%:*}" 60 -c configs/gpu.toml --rate 200000 --duration 3 --warmup 1 \
      --set "runner.chain_steps=${v#*:}"
  done
  bench gpu_200k_chain_if4 60 -c configs/gpu.toml --rate 200000 --duration 3 --warmup 1 \
    --set runner.chain_steps=true --set runner.max_inflight=4
  for r in 100 10; do
    for v in chain:true one:false; do
      bench "gpu_${r}k_${v%%:*}" 60 -c configs/gpu.toml --rate "${r}000" --duration 3 --warmup 1 \
        --set "runner.chain_steps=${v#*:}"
    done
  done
  summarize
  verbatim host_ingest gpu_200k_chain gpu_200k_one gpu_200k_chainb gpu_200k_oneb gpu_200k_chain_if4 \
    gpu_100k_chain gpu_100k_one gpu_10k_chain gpu_10k_one
elif [ "$phase" = wave32a ]; then
  # where a saturated shard's hot thread spends its time: 11 tf32 shards at 1.012M, chained and one step an
  # iteration, each with py-spy on shard 0 (the busiest instruments), 1 and 5 (a typical one)
  hostcal
  for v in chain:true one:false; do
    pyspy_watch "shards11_${v%%:*}" 0 1 5
    shards11 "shards11_${v%%:*}" 80 92000 tf32 "runner.chain_steps=${v#*:}"
    pyspy_report "shards11_${v%%:*}"
  done
  summarize
  verbatim host_ingest warm shards11_chain shards11_one shards11_chain_pyspy shards11_one_pyspy
elif [ "$phase" = wave32b ]; then
  # the GPU tests at the landing commit; where the column path starts to pay on this host's core for a saturated
  # shard's bursts (wave 32: 28-48 events, 4-6 frames of 9), against the dev VM's (the per-event path cheaper there)
  gpu_tests 300 "${LANDING_TESTS[@]}"
  columns_min_sweep
  summarize
  verbatim gpu_tests columns_min
elif [ "$phase" = wave32c ]; then
  # ingest.read_gap_us (a saturated loop reads at most once per gap, meant for bursts long enough for the column
  # path -- wave 32's shards read 28-48 events a burst; wave 33 found more steps instead) against without, both chained, alternated on one host; the GPU
  # tests first (the tree's), the host's ingest speed, and bench_hotpath's COLUMNS_MIN sweep if time is left
  gpu_tests 300 "${LANDING_TESTS[@]}"
  host_ingest
  for v in chain:0 gap:1000 chainb:0 gapb:1000; do
    shards11 "shards11_${v%%:*}" 70 92000 tf32 runner.chain_steps=true "ingest.read_gap_us=${v#*:}"
  done
  columns_min_sweep
  summarize
  verbatim gpu_tests host_ingest shards11_chain shards11_gap shards11_chainb shards11_gapb columns_min
elif [ "$phase" = wave33a ]; then
  # where issue 18's scaling 1 -> 4 and issue 19's low-rate latency stand now (last measured in waves 16 and 13):
  # lstm_a 1 and 4 shards saturated (150k events/s a shard over EventBatch frames, 1,024 instruments, tf32, 4 in
  # flight, chained; bench_shards computes the efficiency) twice; the one-event cycle by parts on both GPU engines;
  # the floor and lstm_a persistent and graph over iceoryx2 and ZeroMQ at 10k; the GPU tests (the tree's) first
  gpu_tests 300 "${LANDING_TESTS[@]}"
  scaling_pair scal 150000
  scaling_pair scalb 150000
  for e in graph persistent; do
    step "lowrate_$e" 60 taskset -c 5 $PY tools/bench_hotpath.py --only-low-rate --cycle-parts --engine "$e" \
         --low-rate 3000 --n 3000 --reps 1
  done
  shm_10k
  summarize
  verbatim gpu_tests scal scalb lowrate_graph lowrate_persistent shm
elif [ "$phase" = wave34a ]; then
  # what wave33a left: a second clean scaling figure (wave33a's second single shard kept up with 150k, so 200k a
  # shard here) and issue 19's runs at 10k (skipped there); the GPU tests (the tree's) first
  gpu_tests 300 "${LANDING_TESTS[@]}"
  scaling_pair scal200 200000
  scaling_pair scal200b 200000
  shm_10k
  summarize
  verbatim gpu_tests scal200 scal200b shm
elif [ "$phase" = wave35a ]; then
  # landing Stepper._answer_columns (a step of stepper.ANSWER_COLUMNS_MIN requests or more answered from the
  # scheduler's numpy columns): the GPU tests first; bench_hotpath's burst rows (publish per decision, steps of
  # 32 and 64 also answered from tuples: the ratio); then what wave34a was for: issue 19's 10k runs over both
  # transports, and a second clean scaling figure (200k a shard: a single shard saturated)
  gpu_tests 300 "${LANDING_TESTS[@]}"
  step hotpath 120 taskset -c 5 $PY tools/bench_hotpath.py --n 20000 --reps 3 --low-rate 0 --json "$WORK/hotpath.json"
  shm_10k
  scaling_pair scal200 200000
  summarize
  verbatim gpu_tests hotpath shm scal200
elif [ "$phase" = wave35b ]; then
  # wave35a's publish rows were wall clock under taskset -c 5, where libzmq's I/O thread shares the loop's core
  # (the service gives it a helper core): bench_hotpath now also reports the loop thread's CPU time, and the
  # flush alone. Egress.batch_bytes caches each size's parts. Then issue 19's runs at 100k (wave35a's budget
  # ended before them) and scaling at 300k a shard (wave35a's single shard kept up with 200k)
  gpu_tests 300 "${LANDING_TESTS[@]}"
  step hotpath 120 taskset -c 5 $PY tools/bench_hotpath.py --n 20000 --reps 3 --low-rate 0 --json "$WORK/hotpath.json"
  [ -f tools/bench_shm.sh ] && step shm100k 100 env BUDGET_S=95 RUNS="floor persistent auto" RATES=100000 \
       ORDER="floor:iceoryx2:100000 persistent:iceoryx2:100000 persistent:zmq:100000 auto:iceoryx2:100000 \
       auto:zmq:100000" bash tools/bench_shm.sh "$WORK/shm100k"
  scaling_pair scal300 300000
  summarize
  verbatim gpu_tests hotpath shm100k scal300
elif [ "$phase" = wave35c ]; then
  # what a submit's CUDA graph replay costs the host through torch and through libcudart directly (ctypes), and
  # where answering a step from numpy columns starts to pay on this host (wave35b: not yet at 32, 0.86x at 64)
  step launch 60 taskset -c 5 $PY tools/bench_launch.py --n 20000 --json "$WORK/launch.json"
  step publish 90 taskset -c 5 $PY tools/bench_hotpath.py --only-publish --publish-sizes 1,16,24,32,48,64,96 \
       --reps 3 --json "$WORK/publish.json"
  summarize
  verbatim launch publish
elif [ "$phase" = wave35d ]; then
  # landing stepper.ANSWER_COLUMNS_MIN = 48 (wave35c's crossover on the GPU host): the GPU tests, the publish rows
  gpu_tests 300 "${LANDING_TESTS[@]}"
  step publish 60 taskset -c 5 $PY tools/bench_hotpath.py --only-publish --publish-sizes 1,32,48,64 --reps 3 \
       --json "$WORK/publish.json"
  summarize
  verbatim gpu_tests publish
elif [ "$phase" = wave36a ]; then
  # a change to the step's host side judged against BASE_TGZ's tree (built for branch next/cudart-launch, graphs
  # launched through libcudart, against main): the GPU tests first (a landing from this call), the one-event
  # cycle by parts on the graph engine (its submit holds the launch), then 11 chained tf32 shards at 1.012M, base
  # and new alternated twice
  setup_base
  gpu_tests 300 "${LANDING_TESTS[@]}"
  hotpath_pair cycle 60 --only-low-rate --cycle-parts --engine graph --low-rate 3000 --n 3000 --reps 1
  for k in 1 2; do
    for who in base new; do
      py=$PY; [ "$who" = base ] && py="$base/py"
      PY="$py" shards11 "shards11_${who}$k" 70 92000 tf32 runner.chain_steps=true
    done
  done
  summarize
  verbatim gpu_tests new_cycle base_cycle shards11_base1 shards11_new1 shards11_base2 shards11_new2
elif [ "$phase" = wave36b ]; then
  # issue 12's throughput targets on this tree (BENCHMARKS' figures for them were wave 14's, on the H200 host):
  # lstm_a sustained at 200k events/s for 10 s, events due together sent as one EventBatch frame of up to 256 (most
  # frames still carry one event at this rate; gpu.toml as shipped, then with chained steps and 4 in flight), then
  # the goodput curves (lstm_a 10k -> 1M, the default config 100k -> 1M)
  bench sustained200k 80 -c configs/gpu.toml --with-floor --rate 200000 --duration 10 --warmup 1 --feed-batch 256
  bench sustained200k_chained 80 -c configs/gpu.toml --with-floor --rate 200000 --duration 10 --warmup 1 \
        --feed-batch 256 --set runner.chain_steps=true --set runner.max_inflight=4
  step goodput_lstm_a 200 $PY tools/bench_overload.py -c "$PWD/configs/gpu.toml" \
       --rates 10000,50000,100000,200000,500000,1000000 --duration 2 --overload 3 --overload-duration 2 \
       --feed-batch 256 --json "$WORK/goodput_lstm_a.json"
  step goodput_default 170 $PY tools/bench_overload.py --rates 100000,200000,500000,1000000 --duration 2 \
       --overload 3 --overload-duration 2 --feed-batch 256 --json "$WORK/goodput_default.json"
  summarize
  verbatim sustained200k sustained200k_chained goodput_lstm_a goodput_default
elif [ "$phase" = wave36c ]; then
  # a landing (the GPU tests at this commit), wave36b's one default-config sweep repeated (its 500k point met issue
  # 12's criterion once), lstm_a at 200k over a universe of 1,024 (each instrument's share ~16x smaller than over
  # gpu.toml's 64, so the busiest instrument no longer sets the steps/s it needs), then issue 13's engine rows
  gpu_tests 300 "${LANDING_TESTS[@]}"
  step goodput_default2 170 $PY tools/bench_overload.py --rates 100000,200000,500000,1000000 --duration 2 \
       --overload 3 --overload-duration 2 --feed-batch 256 --json "$WORK/goodput_default2.json"
  bench sustained200k_1024 80 -c configs/gpu.toml --with-floor --rate 200000 --duration 10 --warmup 1 \
        --feed-batch 256 --instruments 1024 --set universe.instruments=1024
  step bench_engines 130 taskset -c 2 $PY tools/bench_engines.py --quick --engines graph,persistent \
       --models lstm_a/window,lstm_b/window,mlp_small/window --batches 1,64 --json "$WORK/bench_engines.json"
  summarize
  verbatim gpu_tests goodput_default2 sustained200k_1024 bench_engines
elif [ "$phase" = wave37a ]; then
  # a change to the ingest's row writes judged against BASE_TGZ's tree: the GPU tests first (a landing from this
  # call), bench_hotpath's ingest rows with BASE_TGZ's ingest modules loaded beside ours, then lstm_a at 200k events/s
  # (gpu.toml's 64 instruments: single-event frames, whose bursts store their books through write_books), new and
  # base alternated twice
  setup_base
  gpu_tests 300 "${LANDING_TESTS[@]}"
  step hotpath 120 taskset -c 5 $PY tools/bench_hotpath.py --n 20000 --reps 3 --low-rate 0 \
       --baseline "$base/pkg/hft_infer" --json "$WORK/hotpath.json"
  for k in 1 2; do
    e2e_run new "s200k_new$k" 200000 -c configs/gpu.toml --feed-batch 256
    e2e_run base "s200k_base$k" 200000 -c configs/gpu.toml --feed-batch 256
  done
  # issue 13's lstm_a batch-64 row met its p99 <= 100 µs in one run (wave36c): two more, batch 1 beside it
  for k in 1 2; do
    step "engines_lstm_a$k" 60 taskset -c 2 $PY tools/bench_engines.py --quick --engines graph \
         --models lstm_a/window --batches 1,64 --json "$WORK/engines_lstm_a$k.json"
  done
  summarize
  verbatim gpu_tests hotpath s200k_new1 s200k_base1 s200k_new2 s200k_base2 engines_lstm_a1 engines_lstm_a2
elif [ "$phase" = wave38a ] || [ "$phase" = wave38b ] || [ "$phase" = wave38c ] || [ "$phase" = wave38e ]; then
  # fewer dependent L2 trips in the LSTM kernels (persistent and launched): the GPU tests with the kernel tests
  # first (a landing from this call), then issue 13's engine rows, this tree and BASE_TGZ's alternated.
  # wave38a, as it ran (graph and persistent, lstm_a / lstm_b / mlp_small; 330 s of tests, 150 s steps): its
  # kernel tests outran 330 s, and its base runs lacked tools/ on their path (mended); wave38b: lstm_a only (the
  # MLP change was dropped), shorter steps; wave38c: wave38b cut to ~290 s (the persistent kernels' GPU test
  # only, one round); wave38e: wave38b with lstm_b's rows too (after wave38b found the graph step at batch 64
  # ~9 % slower, c's tile now loaded after the chunk loop there)
  setup_base
  lstm_tests=(tests/kernels/test_kernel_lstm_window.py tests/kernels/test_kernel_lstm_stream.py)
  kernel_tests=(tests/kernels/test_kernel_persistent.py "${lstm_tests[@]}")
  models38=lstm_a/window tests_s=360 step_s=45 rounds="1 2"
  case $phase in
    wave38a) kernel_tests=(tests/kernels/test_kernel_persistent.py tests/kernels/test_kernel_mlp.py "${lstm_tests[@]}")
             models38=lstm_a/window,lstm_b/window,mlp_small/window tests_s=330 step_s=150 ;;
    wave38c) kernel_tests=(tests/kernels/test_kernel_persistent.py) tests_s=200 rounds=1 ;;
    wave38e) models38=lstm_a/window,lstm_b/window tests_s=330 ;;
  esac
  gpu_tests "$tests_s" "${LANDING_TESTS[@]}" "${kernel_tests[@]}"
  for k in $rounds; do
    engines_pair "$k" "$models38" "$step_s"
  done
  summarize
  verbatim gpu_tests engines_new1 engines_base1 engines_new2 engines_base2
elif [ "$phase" = wave40 ]; then
  # answers as blocks, samples deferred to the fold (issue 12's publish target): the GPU tests with the
  # kernel tests first (a landing from this call), then publish this tree and BASE_TGZ's alternated twice,
  # then wave38e's engine rows once (the graph step at batch 64 after 859b325's fix, against BASE_TGZ)
  setup_base
  gpu_tests 300 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py \
            tests/kernels/test_kernel_lstm_window.py tests/kernels/test_kernel_lstm_stream.py
  for k in 1 2; do
    hotpath_pair "publish$k" 40 --only-publish --publish-sizes 1,8,16,32,64
  done
  engines_pair 1 lstm_a/window,lstm_b/window 45
  summarize
  verbatim gpu_tests new_publish1 base_publish1 new_publish2 base_publish2 engines_new1 engines_base1
elif [ "$phase" = wave40b ]; then
  # wave40 after ANSWER_COLUMNS_MIN 48 -> 12: the landing tests, then publish against BASE_TGZ three times
  setup_base
  gpu_tests 200 "${LANDING_TESTS[@]}"
  for k in 1 2 3; do
    hotpath_pair "publish$k" 40 --only-publish --publish-sizes 1,8,12,16,32,64
  done
  summarize
  verbatim gpu_tests new_publish1 base_publish1 new_publish2 base_publish2 new_publish3 base_publish3
elif [ "$phase" = wave41 ]; then
  # issue 13: the persistent kernel tests (the phase-stamp build among them), then where the persistent lstm_a's
  # small requests spend their device time (phase stamps) and which geometry serves them fastest
  gpu_tests 200 tests/kernels/test_kernel_persistent.py
  step sweep_geometry 330 $PY tools/sweep_persistent_geometry.py --cpu 2 --json "$WORK/sweep_geometry.json"
  summarize
  verbatim gpu_tests sweep_geometry
elif [ "$phase" = wave41b ]; then  # the landing tests, then the sweep (wave41's ran out of time on its first geometry)
  gpu_tests 200 "${LANDING_TESTS[@]}"
  step sweep_geometry 300 $PY tools/sweep_persistent_geometry.py --cpu 2 --json "$WORK/sweep_geometry.json"
  summarize
  verbatim gpu_tests sweep_geometry
elif [ "$phase" = wave41d ]; then
  # the persistent LSTM's wide tiling: the landing tests with the persistent kernel tests (both tilings against
  # float64), the kernel-level sweep (one tiling; both, with 32- and 64-row wide tiles; batches 1-64), then the
  # engine rows through the runner against BASE_TGZ's
  setup_base
  gpu_tests 300 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  step sweep_tilings 150 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 500 --batches 1,2,4,8,16,32,64 \
       --geometries 4/0/4/0,4/0/4/0/32,4/0/4/0/64 --json "$WORK/sweep_tilings.json"
  engines_pair 1 lstm_a/window,lstm_b/window 120 1,8,64  # 75 s ran out before lstm_b (both tilings compile longer)
  summarize
  verbatim gpu_tests sweep_tilings engines_new1 engines_base1
elif [ "$phase" = wave42 ]; then
  # issue 13's emitted pass: the kernel-level sweep with it (emit<=2) and without (0), lstm_a and lstm_b at
  # batches 1, 2, 8 (phase stamps), then the landing tests with the persistent kernel tests (both passes against float64)
  # (in order of need where the device time is short: each step that would end past BUDGET_S is skipped)
  step sweep_emit 100 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 500 --models lstm_a \
       --batches 1,2,8 --geometries 4/0/4/0/32 --emit 2,0 --json "$WORK/sweep_emit.json"
  gpu_tests 300 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  step engines_emit 100 taskset -c 2 $PY tools/bench_engines.py --quick --engines graph,persistent \
       --models lstm_a/window,lstm_b/window --batches 1,2,8 --json "$WORK/engines_emit.json"
  step sweep_emit_b 100 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 500 --models lstm_b \
       --batches 1,2,8 --geometries 4/0/4/0/32 --emit 2,0 --json "$WORK/sweep_emit_b.json"
  summarize
  verbatim sweep_emit gpu_tests engines_emit sweep_emit_b
elif [ "$phase" = wave42d ]; then  # wave42 in ~260 s: lstm_a's sweep at 1 and 2, then the tests, the kernel's first
  step sweep_emit 70 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 200 --models lstm_a \
       --batches 1,2 --geometries 4/0/4/0/32 --emit 2,0 --json "$WORK/sweep_emit.json"
  gpu_tests 300 tests/kernels/test_kernel_persistent.py "${LANDING_TESTS[@]}"
  summarize
  verbatim sweep_emit gpu_tests
elif [ "$phase" = wave42b ]; then
  # the emitted pass through the runner: bench_engines' lstm_a / lstm_b rows, this tree then BASE_TGZ's, twice
  setup_base
  engines_pair 1 lstm_a/window,lstm_b/window 120 1,2,8,64
  engines_pair 2 lstm_a/window,lstm_b/window 120 1,2,8,64
  summarize
  verbatim engines_new1 engines_base1 engines_new2 engines_base2
elif [ "$phase" = wave43 ]; then
  # landing next/review-wave42: its GPU tests, then the emitted pass through the runner (lstm_a) against BASE_TGZ's
  gpu_tests 300 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  setup_base
  engines_pair 1 lstm_a/window 90 1,2,64
  summarize
  verbatim gpu_tests engines_new1 engines_base1
elif [ "$phase" = wave43b ]; then
  step sweep_emit 70 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 300 --models lstm_a \
       --batches 1,2 --geometries 4/0/4/0/32 --emit 2,0 --json "$WORK/sweep_emit.json"
  setup_base
  engines_ab 1 80 --quick --engines persistent --models lstm_a/window --batches 1,2 --gaps 0,40
  gpu_tests 300 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  summarize
  verbatim sweep_emit engines_new1 engines_base1 gpu_tests
elif [ "$phase" = wave43f ]; then
  step sweep_emit 60 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 300 --models lstm_a \
       --batches 1 --geometries 4/0/4/0/32 --emit 2,0 --json "$WORK/sweep_emit.json"
  step engines_new1 80 taskset -c 2 $PY tools/bench_engines.py --quick --engines persistent \
       --models lstm_a/window,mlp_small/window --batches 1 --gaps 0,40 --json "$WORK/engines_new1.json"
  summarize
  verbatim sweep_emit engines_new1
elif [ "$phase" = wave44 ]; then
  gpu_tests 320 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  step sweep_emit 60 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 300 --models lstm_a \
       --batches 1,2 --geometries 4/0/4/0/32 --emit 2 --json "$WORK/sweep_emit.json"
  setup_base
  engines_ab 1 70 --quick --engines persistent --models lstm_a/window,mlp_small/window --batches 1,2
  summarize
  verbatim gpu_tests sweep_emit engines_new1 engines_base1
elif [ "$phase" = wave44b ]; then
  setup_base
  engines_ab 1 80 --quick --engines persistent --models lstm_a/window --batches 1,2 --gaps 0,40
  step engines_wide 150 taskset -c 2 $PY tools/bench_engines.py --quick --engines persistent \
       --models lstm_b/window,lstm_a/window --batches 1,64 --gaps 0,40 --json "$WORK/engines_wide.json"
  summarize
  verbatim engines_new1 engines_base1 engines_wide
elif [ "$phase" = wave44c ]; then
  gpu_tests 320 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  setup_base
  engines_ab 1 110 --quick --engines persistent --models lstm_a/window,lstm_b/window --batches 1,2 --gaps 0,40
  summarize
  verbatim gpu_tests engines_new1 engines_base1
elif [ "$phase" = wave44d ]; then
  # the service end to end at 10k events/s over the persistent engine's inline path, beside graph (gpu.toml)
  bench gpu_10k_persistent 80 -c configs/gpu.toml --set 'runner.engine="persistent"' --with-floor \
        --rate 10000 --duration 3 --warmup 1
  bench gpu_10k 80 -c configs/gpu.toml --with-floor --rate 10000 --duration 3 --warmup 1
  summarize
  verbatim gpu_10k_persistent gpu_10k
elif [ "$phase" = wave44e ]; then
  # wave44d again, then both engines at 100k (is the persistent engine ahead end to end? auto picks graph);
  # each bench needs ~45 s warm and more on a fresh machine (its kernels compile): 45 s steps all timed out
  P=(--set 'runner.engine="persistent"')
  bench gpu_10k_persistent 85 -c configs/gpu.toml "${P[@]}" --with-floor --rate 10000 --duration 3 --warmup 1
  bench gpu_10k 85 -c configs/gpu.toml --with-floor --rate 10000 --duration 3 --warmup 1
  bench gpu_100k_persistent 85 -c configs/gpu.toml "${P[@]}" --with-floor --rate 100000 --duration 2 --warmup 1
  bench gpu_100k 85 -c configs/gpu.toml --with-floor --rate 100000 --duration 2 --warmup 1
  # the floors again, the inline one also with lstm_a's 168-byte row (what the row's PCIe reads cost)
  step engines_floor 90 taskset -c 2 $PY tools/bench_engines.py --quick --engines persistent --models lstm_a/window \
       --batches 1 --gaps 0,40 --json "$WORK/engines_floor.json"
  summarize
  verbatim gpu_10k_persistent gpu_10k gpu_100k_persistent gpu_100k engines_floor
elif [ "$phase" = wave44f ]; then
  # issue 19's rows with the persistent engine's inline path (wave 44): the floor and lstm_a persistent over
  # iceoryx2 and ZeroMQ at 10k, then 100k (the runs compile on a fresh machine: 90 s a run)
  step shm 330 env BUDGET_S=320 RUN_CAP_S=90 RUNS="floor persistent" ORDER="floor:iceoryx2:10000 \
       persistent:iceoryx2:10000 floor:zmq:10000 persistent:zmq:10000 floor:iceoryx2:100000 \
       persistent:iceoryx2:100000" bash tools/bench_shm.sh "$WORK/shm"
  summarize
  verbatim shm
elif [ "$phase" = wave45 ]; then
  # branches next/mlp-phases + next/one-warp-pinned (stacked): the landing and persistent kernel tests, then
  # lstm_a's engine rows back to back and 40 µs apart against BASE_TGZ's (main), with the floors
  gpu_tests 320 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  setup_base
  engines_ab 1 85 --quick --engines persistent --models lstm_a/window --batches 1,2 --gaps 0,40
  summarize
  verbatim gpu_tests engines_new1 engines_base1
elif [ "$phase" = wave45b ]; then
  # wave45's engine rows again, this tree and BASE_TGZ's alternated twice (wave45 ran them once each, base
  # second, and its host-only parts read ~2 µs slower: the host, not the kernel), then wave45m's sweeps
  setup_base
  for k in 1 2; do
    engines_ab $k 85 --quick --engines persistent --models lstm_a/window --batches 1,2 --gaps 0,40
  done
  step sweep_mlp 150 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 300 --models mlp_small \
       --batches 1,2,8 --geometries 0/0/0/0,64/64/0/0,32/128/0/0,0/0/0/8 --json "$WORK/sweep_mlp.json"
  summarize
  verbatim engines_new1 engines_base1 engines_new2 engines_base2 sweep_mlp
elif [ "$phase" = wave46 ]; then
  # branch next/mlp-warps8 (the persistent MLP at 8 warps): the landing and persistent kernel tests, mlp_small's
  # engine rows (1, 8, 64; back to back and 40 µs apart) against BASE_TGZ's (main: 4 warps), then the sweeps: the
  # MLP's batch tile (16 against the engine's) at 8 and 4 warps, lstm_a's wide tiling + emitted pass at 2/4/8 warps
  gpu_tests 320 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  setup_base
  engines_ab 1 100 --quick --engines persistent --models mlp_small/window --batches 1,8,64 --gaps 0,40
  step sweep_mlp_bb 120 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 300 --models mlp_small \
       --batches 1,8,64 --geometries 0/0/0/0,0/0/0/0/16,0/0/0/4,0/0/0/4/16 --json "$WORK/sweep_mlp_bb.json"
  step sweep_lstm_warps 120 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 300 --models lstm_a \
       --batches 1,2 --geometries 4/0/4/0/32,4/0/2/0/32,4/0/8/0/32 --emit 2 --json "$WORK/sweep_lstm_warps.json"
  summarize
  verbatim gpu_tests engines_new1 engines_base1 sweep_mlp_bb sweep_lstm_warps
elif [ "$phase" = wave46d ]; then
  # wave46 saw lstm_a window fp32 answers diverge twice (the kernel test's request 12; the 4-shard engine's
  # self-check): which path -- the inline reads, the emitted pass -- by repeating the kernel test's child under
  # variants (at once, as the test runs its cases); then the landing tests and mlp_small's engine rows (4 warps,
  # 16-row tiles) against BASE_TGZ's (main: 4 warps, 32-row tiles)
  step diag_repeat_par 200 $PY tools/diag_kernel_repeat.py --steps 240 --rounds 2 --parallel \
       --variants default,inline0,emit0,plain --timeout 90
  gpu_tests 300 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  setup_base
  engines_ab 1 60 --quick --engines persistent --models mlp_small/window --batches 1,8,64
  summarize
  verbatim diag_repeat_par gpu_tests engines_new1 engines_base1
elif [ "$phase" = wave46e ]; then
  # wave46d's diag ran out of time (240-step runs, four at once, over 90 s each): the test's own 48 steps, the
  # variants one after another, the engine's build against every request through the copy graph
  step diag_repeat_seq 270 $PY tools/diag_kernel_repeat.py --steps 48 --rounds 3 --variants default,inline0 \
       --timeout 100
  summarize
  verbatim diag_repeat_seq
elif [ "$phase" = wave47 ]; then
  # lstm_a's intermittent divergence (wave 46): the self-check stream through the 4-shard engine (33 programs, 8
  # instruments: the shard test's) 200 times a variant -- with and without the inline reads and the emitted pass
  # -- each failing run reported by instrument with the path of its last request; then every SM
  step diag_self_check 300 $PY tools/diag_self_check_repeat.py --repeat 200 --programs 33 \
       --variants default,inline0,emit0,plain
  step diag_self_check_all 120 $PY tools/diag_self_check_repeat.py --repeat 200 --programs 0 --variants default
  summarize
  verbatim diag_self_check diag_self_check_all
elif [ "$phase" = wave47b ]; then
  # the lead's CTA-uniform poll (wave 47: warps leaving the inline build's poll loop at different polls put their
  # barriers out of step): the landing tests first (a landing needs them), then the self-check stream
  lead_poll_checks
  summarize
  verbatim diag_self_check gpu_tests
elif [ "$phase" = wave47d ]; then
  # wave47b's self-check stream alone (a short device budget: the fix's evidence before its landing tests)
  step diag_self_check 120 $PY tools/diag_self_check_repeat.py --repeat 200 --programs 33 --variant-timeout 58 \
       --variants default,narrow
  summarize
  verbatim diag_self_check
elif [ "$phase" = wave48 ]; then
  # landing docs/pending/0001-issue-13-lead-poll.patch in one call: wave47b (the landing tests with the persistent
  # kernel test, then the self-check stream 150 times a variant), then wave47c (lstm_a's rows against BASE_TGZ's,
  # main without the patch: the poll's price)
  lead_poll_checks
  lead_poll_price
  summarize
  verbatim gpu_tests diag_self_check engines_new1 engines_base1
elif [ "$phase" = wave47c ]; then
  # lstm_a's rows against BASE_TGZ's (main) to price the CTA-uniform poll
  lead_poll_price
  summarize
  verbatim engines_new1 engines_base1
elif [ "$phase" = wave45m ]; then
  # after wave45: where the persistent MLP's device time goes (phases by geometry: the packing's own, fewer
  # programs with wider blocks, 8 warps), and lstm_a's batch-1 phases with the one-warp pinned reads
  step sweep_mlp 150 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 300 --models mlp_small \
       --batches 1,2,8 --geometries 0/0/0/0,64/64/0/0,32/128/0/0,0/0/0/8 --json "$WORK/sweep_mlp.json"
  step sweep_emit 60 $PY tools/sweep_persistent_geometry.py --cpu 2 --steps 300 --models lstm_a \
       --batches 1,2 --geometries 4/0/4/0/32 --emit 2 --json "$WORK/sweep_emit.json"
  summarize
  verbatim sweep_mlp sweep_emit
elif [ "$phase" = wave40d ]; then
  gpu_tests 200 "${LANDING_TESTS[@]}"
  summarize
  verbatim gpu_tests
elif [ "$phase" = wave40c ]; then
  # what the cheaper publish of a large step does to the default config's capacity (mlp_small, graph, steps of
  # 64 past capacity): bench_overload's points, each run by this tree and BASE_TGZ's interleaved
  setup_base
  step overload_ab 300 $PY tools/bench_overload.py --rates 200000,500000 --duration 2 --overload 3 \
       --overload-duration 2 --feed-batch 256 --baseline-python "$base/py" --json "$WORK/overload_ab.json"
  summarize
  verbatim overload_ab
elif [ "$phase" = wave38d ]; then
  # the landing of next/fewer-trips with the device time left (~210 s): the landing tests and the persistent
  # kernels' GPU test only
  gpu_tests 190 "${LANDING_TESTS[@]}" tests/kernels/test_kernel_persistent.py
  summarize
  verbatim gpu_tests
elif [ "$phase" = wave31d ]; then
  # landing runner.chain_steps off by default (wave31c): the GPU tests at this commit
  gpu_tests 300 "${LANDING_TESTS[@]}"
  summarize
  verbatim gpu_tests
elif [ "$phase" = smoke ]; then
  step gpu_engine_tests 240 $PY -m pytest -x -q -rs -p no:cacheprovider tests/integration/test_gpu_engines.py
  step kernel_tests 300 $PY -m pytest -q -rs -p no:cacheprovider --durations=10 tests/kernels
  step bench_engines_quick 120 $PY tools/bench_engines.py --steps 300 --models lstm_a --batches 1,8
  bench e2e_quick 150 -c configs/gpu.toml --with-floor --rate 5000 --duration 2
else  # kernels
  step bench_kernels 260 $PY tools/bench_kernels.py
  cp -f bench_kernels.json "$WORK/" 2>/dev/null
  step bench_engines 200 $PY tools/bench_engines.py --steps 3000 --json "$WORK/bench_engines.json"
fi
tar czf "$OUT/gpu-$phase.tgz" -C "$WORK" . 2>/dev/null
log "done: $OUT/gpu-$phase.tgz ($(du -h "$OUT/gpu-$phase.tgz" | cut -f1)), $OUT/summary.md"
