"""Which part of the persistent engines' request path gives wrong results (issue 13; CUDA).

    python tools/diag_ring_order.py [--presets mlp_small,lstm_a]

At 59ceba3 (the DMA request ring) the kernel tests pass on the H200 host while the engine,
driven one small request at a time, diverges from the CPU engine from the first reuse of a
ring slot on (tools/diag_persistent.py: batches of one, 290-296 of 300 scores). This drives
the service's persistent engine over the self-check stream in batches of one and as the
self-check cuts it, under variants of the ring's submit, each against the CPU engine:

  graph          as served: one captured graph copies payload, then the header word (steps of
                 one or two entries go inline for the LSTMs since wave 44 (83d768c): the lead
                 reads them from the pinned slot; the variants below replace submit whole)
  graph+sync     the same, then the host waits for the copy stream (timing only)
  split+sync     payload copy, host waits for it, then the header copy (the header cannot
                 reach the device before the payload: if this one agrees and `graph` does
                 not, the header overtakes the payload inside the graph)
  ring5          as served with 5 ring slots instead of 3 (max_inflight 4)
  fenced         the host waits for the payload copy's event, then writes the header into
                 pinned memory, which the lead polls
  one-group      as served, with one row group per hidden block (LSTM: max_programs = blocks)
  slow-host      as served, with 300 µs between a request's answer and the next submit

Every variant but `fenced` runs the "dma" transport (header copied by the graph). Presets may
name a mode: lstm_a/stream.

Measured at 231792d (H200 host, 10:36 UTC): graph, split+sync and fenced alike diverge in the
single-request stream from the first reuse of a ring slot (lstm_a: row 3 with 3 slots, row 5
with 5), so the header does not overtake the payload: the fault is elsewhere. At 3520d9b
one-group, slow-host and stream mode diverge alike (lstm_a 292 of 300 each). Found at 08b885d:
the programs read the reused slot's payload (and the LSTM state) from a stale L1, because Triton's
pipeliner had turned their volatile loads into cp.async.ca copies; every variant agrees since.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from diag_persistent import N_SLOTS, TOL, _runtime

from hft_infer.kernels.persistent import LINE
from hft_infer.runner.gpu import KernelStep, PersistentEngine
from hft_infer.runner.self_check import check_stream, drive


def _split_sync(ring) -> None:
    """Replace ring.submit: payload copy, wait for it on the host, then the header copy."""
    stream = torch.cuda.current_stream()

    def submit(n: int, kind: int = 0) -> int:
        seq = ring.seq + 1
        if seq - ring.answered > ring.max_in_flight:
            raise RuntimeError("ring full")
        k = (seq - 1) % ring.n_requests
        ring._hdr_mv[k * LINE] = (seq & 0xFFFFFFFF) | (n << 32) | (kind << 48)
        nb = ring._copy_bytes[ring._bucket_of[n]]
        ring.dev[k, :nb].copy_(ring.host[k, :nb], non_blocking=True)
        stream.synchronize()
        ring.hdr_d[k * LINE:k * LINE + 1].copy_(ring.hdr_h[k * LINE:k * LINE + 1], non_blocking=True)
        ring.seq = seq
        return seq

    ring.submit = submit


def _graph_sync(ring) -> None:
    orig = ring.submit
    stream = torch.cuda.current_stream()

    def submit(n: int, kind: int = 0) -> int:
        seq = orig(n, kind)
        stream.synchronize()
        return seq

    ring.submit = submit


def _slow_host(ring) -> None:
    orig = ring.submit

    def submit(n: int, kind: int = 0) -> int:
        time.sleep(3e-4)
        return orig(n, kind)

    ring.submit = submit


VARIANTS = {"graph": ([], None), "graph+sync": ([], _graph_sync), "split+sync": ([], _split_sync),
            "ring5": (["runner.max_inflight=4"], None), "fenced": ([], None), "one-group": ([], None),
            "slow-host": ([], _slow_host)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="mlp_small,lstm_a")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("diag_ring_order: needs CUDA", file=sys.stderr)
        return 2
    for preset in args.presets.split(","):
        ref = _runtime(preset, "eager")
        data, slots, batches = check_stream(ref.store.width, N_SLOTS, 64)
        ones = [1] * len(data)
        want = {}
        for name, cut in (("batch1", ones), ("served", batches)):
            ref.engine.reset()
            want[name], _ = drive(ref.engine, ref.store, data, slots, cut)
        for variant in args.variants.split(","):
            extra, patch = VARIANTS[variant]
            PersistentEngine.transport = "fenced" if variant == "fenced" else "dma"
            orig_persistent = KernelStep.persistent
            if variant == "one-group":
                KernelStep.persistent = lambda self, ring, max_programs=None, _orig=orig_persistent: _orig(
                    self, ring, max_programs=getattr(self.w, "n_blocks", None))
            try:
                rt = _runtime(preset, "persistent", extra)
            finally:
                KernelStep.persistent = orig_persistent
            eng = rt.engine
            if patch is not None:
                patch(eng.ring)
            try:
                for name, cut in (("batch1", ones), ("served", batches)):
                    eng.reset()
                    got, _ = drive(eng, rt.store, data, slots, cut)
                    diff = np.abs(got.astype(np.float64) - want[name])
                    bad = np.flatnonzero(~(diff <= TOL))
                    first = f", first at row {bad[0]}" if len(bad) else ""
                    print(f"{preset:10s} {variant:11s} {name:7s} ring {eng.ring.n_requests}: {len(bad):4d} of "
                          f"{len(got)} differ, largest {np.nanmax(diff):.3g}{first}", flush=True)
            finally:
                eng.close()
            del rt, eng
    return 0


if __name__ == "__main__":
    sys.exit(main())
