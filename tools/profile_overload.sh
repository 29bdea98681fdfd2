#!/usr/bin/env bash
# Where the service's time goes under overload: `hft-infer bench` at RATE with EventBatch frames,
# and py-spy (pip install py-spy) sampling the service for SECONDS once the feed is flowing.
#   tools/profile_overload.sh OUTDIR [RATE=1500000] [SECONDS=3] [extra bench args...]
#   FEED_BATCH=0 tools/profile_overload.sh OUTDIR 10000 3 -c configs/gpu.toml   # one event per frame
# (FEED_BATCH: --feed-batch, default 256; 0 leaves it out. SPY_RATE: py-spy samples/s, default 200;
# NATIVE=1 adds native frames, e.g. time inside torch, libzmq or iceoryx2; NONBLOCKING=1 samples without
# stopping the service -- py-spy otherwise pauses it for every sample, which at 1,000 Hz took an lstm_a
# service at 125k events/s on the H200 host from 100k decided/s to 22k.)
# Writes OUTDIR/bench.log, OUTDIR/spy.txt (py-spy raw stacks) and OUTDIR/spy_top.txt (the
# frames by inclusive and by own share of the samples).
set -u
out=$1; rate=${2:-1500000}; secs=${3:-3}; shift 3 2>/dev/null || shift $#
mkdir -p "$out"
PY=${PY:-python3}
feed=${FEED_BATCH:-256}
[ "$feed" = 0 ] && feed_args=() || feed_args=(--feed-batch "$feed")
$PY -m hft_infer bench --rate "$rate" --duration 4 --warmup 1 "${feed_args[@]}" --run-dir "$out/run" "$@" \
    > "$out/bench.log" 2>&1 &
bench=$!
# the feed is generated first, then the pacer waits for every subscription (the service ready): wait for
# its final "N subscriptions" line -- not the "0 of N subscriptions so far" progress lines, which come
# while the service is still starting (a profile taken then samples its weight packing, not its loop)
for _ in $(seq 1 240); do
  grep -Eq "pacer: [0-9]+ subscriptions$" "$out/run/pacer.log" 2>/dev/null && break
  sleep 0.5
done
sleep 1.5
pid=$(pgrep -f "hft_infer serve" | head -1)
spy=$(command -v py-spy || echo "$(dirname "$(command -v $PY)")/py-spy")
[ -n "$pid" ] && timeout $((secs + 10)) "$spy" record -p "$pid" -d "$secs" -r "${SPY_RATE:-200}" ${NATIVE:+--native} ${NONBLOCKING:+--nonblocking} -f raw -o "$out/spy.txt" \
    > "$out/spy.log" 2>&1
wait $bench
$PY - "$out/spy.txt" > "$out/spy_top.txt" <<'PYEOF'
import collections, sys
incl, own, total = collections.Counter(), collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, n = line.rsplit(" ", 1)
    frames, n = stack.split(";"), int(n)
    total += n
    own[frames[-1]] += n
    for f in set(frames):
        incl[f] += n
print(f"{total} samples")
for title, c in (("inclusive", incl), ("own", own)):
    print(f"--- {title}")
    for f, n in c.most_common(40):
        print(f"{n / total:6.1%} {f[:160]}")
PYEOF
tail -3 "$out/bench.log"
