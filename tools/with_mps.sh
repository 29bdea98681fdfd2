#!/usr/bin/env bash
# Run a command with CUDA MPS (Multi-Process Service): a private MPS control daemon for this
# command's processes only, stopped when the command ends.
#
#   tools/with_mps.sh COMMAND [ARGS...]
#   e.g. tools/with_mps.sh tools/bench_shards.sh /tmp/shards-mps
#
# Why: N shard processes on one GPU are N CUDA contexts, and without MPS the GPU time-slices
# contexts (one context's kernels at a time) instead of running their small kernels side by
# side, so shard scaling stops at one GPU's worth of one process (BENCHMARKS.md, issue 18).
# Under MPS the shards' kernels share the SMs at once, as streams of one process would.
#
# What it does: a daemon started by this user with its pipe and log directories in a fresh
# temporary directory (CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY, exported to COMMAND:
# only processes that inherit them use this daemon, nothing else on the host does). It changes
# no GPU setting (compute mode, clocks, MIG stay as they are) and needs no root; it does need the
# GPU in the Default compute mode (an Exclusive_Process GPU takes only a system-wide MPS server,
# started by its administrator: then set CUDA_MPS_PIPE_DIRECTORY to that daemon's and run
# COMMAND directly). On exit (COMMAND's end, or a TERM/INT to this script) the daemon is told to
# quit and the directory is removed. A production host runs MPS as a system service instead
# (README, "Scale out: shards").
#
# Exit status: COMMAND's; 2 when MPS cannot be started (no nvidia-cuda-mps-control, no GPU, the
# daemon does not answer), with the reason on stderr.
set -u
if [ $# -lt 1 ]; then
  echo "usage: tools/with_mps.sh COMMAND [ARGS...]" >&2
  exit 2
fi
if ! command -v nvidia-cuda-mps-control > /dev/null; then
  echo "with_mps: nvidia-cuda-mps-control not found (it comes with the NVIDIA driver); run the command without MPS" >&2
  exit 2
fi
mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2> /dev/null | head -n 1)
case $mode in
  Default|"") ;;
  *) echo "with_mps: the GPU's compute mode is '$mode': only a system-wide MPS daemon can serve it" \
          "(set CUDA_MPS_PIPE_DIRECTORY to it and run the command directly)" >&2
     exit 2 ;;
esac
dir=$(mktemp -d "${TMPDIR:-/tmp}/hft-mps.XXXXXX") || exit 2
export CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"

stop_daemon() {
  echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
  # the daemon exits once its server has gone (bounded wait: it never outlives this script by much)
  for _ in $(seq 50); do
    [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] || break
    pgrep -u "$(id -u)" -f nvidia-cuda-mps-control > /dev/null || break
    sleep 0.1
  done
  rm -rf "$dir"
}

if ! nvidia-cuda-mps-control -d; then
  echo "with_mps: nvidia-cuda-mps-control -d failed (log: $CUDA_MPS_LOG_DIRECTORY)" >&2
  rm -rf "$dir"
  exit 2
fi
# the daemon answers on its control pipe once it is up
if ! timeout 10 bash -c 'until echo get_default_active_thread_percentage | nvidia-cuda-mps-control > /dev/null 2>&1; do sleep 0.1; done'; then
  echo "with_mps: the MPS daemon did not answer within 10 s; its log:" >&2
  cat "$CUDA_MPS_LOG_DIRECTORY"/control.log >&2 2> /dev/null
  stop_daemon
  exit 2
fi
echo "with_mps: MPS daemon up (pipe $CUDA_MPS_PIPE_DIRECTORY)" >&2

cmd_pid=
trap '[ -n "$cmd_pid" ] && kill -TERM "$cmd_pid" 2> /dev/null; wait; stop_daemon; exit 143' TERM INT
"$@" &
cmd_pid=$!
wait "$cmd_pid"
rc=$?
cmd_pid=
server_log=$CUDA_MPS_LOG_DIRECTORY/server.log
[ -s "$server_log" ] && grep -E "Server.*(started|exit|error)|Error|error" "$server_log" | tail -n 5 | sed 's/^/with_mps: server.log: /' >&2
stop_daemon
exit "$rc"
