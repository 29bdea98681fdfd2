#!/usr/bin/env python3
"""What a step's host-side launch costs, by way of launching (CUDA; skips without a GPU).

    python tools/bench_launch.py [--n 20000] [--json out.json]

The loop's submit pays for a CUDA graph replay each step: the graph engine's model graph
(`GraphEngine._launch`: replay + an event record) and the persistent engine's request copy
(`RequestRing.submit`, transport "dma": a graph of two small host-to-device copies). This
times, on the host, each way of putting the same work on a stream, one call at a time with the
stream drained between calls (outside the timed part):

  graph replay, torch       CUDAGraph.replay() of a graph of two copies (the ring's shape: a
                            request's ids and rows, then its header word)
  graph launch, ctypes      cudaGraphLaunch of the same graph's exec handle, called through
                            ctypes on libcudart (no torch wrapper)
  graph of a copy and 10 kernels   the same two ways, for a graph of a model step's shape
  two copies, torch         Tensor.copy_(pinned, non_blocking=True) twice
  two copies, ctypes        cudaMemcpyAsync twice
  event record, torch / ctypes   torch.cuda.Event.record() / cudaEventRecord
  event query, torch / ctypes    torch.cuda.Event.query() / cudaEventQuery (the loop's poll)

Rows: p50 / p99 / p99.9 in µs, and each ctypes row's p50 over torch's. Wall clock
(time.perf_counter_ns); pin it (`taskset -c K`) on a host with cores to spare.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

import numpy as np
from benchlib import table, write_json


def _cudart() -> ctypes.CDLL:
    """The libcudart torch loaded (as the engines find it: kernels/launch.py), with the calls this
    benchmark makes beyond the engines' typed too."""
    from hft_infer.kernels.launch import cudart

    lib = cudart()
    if lib is None:
        raise SystemExit("bench_launch: libcudart is not mapped into this process (torch without CUDA?)")
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                    ctypes.c_void_p]
    lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cudaEventQuery.argtypes = [ctypes.c_void_p]
    for fn in (lib.cudaMemcpyAsync, lib.cudaEventRecord, lib.cudaEventQuery):
        fn.restype = ctypes.c_int
    return lib


def timed(fn, n: int, drain) -> np.ndarray:
    """µs of each of n calls of fn, the stream drained (drain()) after each, outside the timing."""
    out = np.empty(n)
    pc = time.perf_counter_ns
    for i in range(n):
        t = pc()
        fn()
        out[i] = pc() - t
        drain()
    return out / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_launch: no CUDA device; nothing to measure", file=sys.stderr)
        return 0
    dev = torch.device("cuda")
    stream = torch.cuda.Stream(device=dev)
    torch.cuda.set_stream(stream)
    cudart = _cudart()
    s_handle = ctypes.c_void_p(stream.cuda_stream)
    # the ring's request: ids and one row (~200 bytes), then the 8-byte header, from pinned memory
    host_req = torch.zeros(64, dtype=torch.int32).pin_memory()
    host_hdr = torch.zeros(2, dtype=torch.int32).pin_memory()
    dev_req = torch.zeros(64, dtype=torch.int32, device=dev)
    dev_hdr = torch.zeros(2, dtype=torch.int32, device=dev)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(stream)
    with torch.cuda.graph(g, stream=side):
        dev_req.copy_(host_req, non_blocking=True)
        dev_hdr.copy_(host_hdr, non_blocking=True)
    # a graph of a model step's shape: a copy and a chain of ten small kernels
    x = torch.zeros(256, device=dev)
    g10 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g10, stream=side):
        dev_req.copy_(host_req, non_blocking=True)
        for _ in range(10):
            x.add_(1.0)
    torch.cuda.synchronize()
    exec_handle = ctypes.c_void_p(g.raw_cuda_graph_exec())
    exec10 = ctypes.c_void_p(g10.raw_cuda_graph_exec())
    ev = torch.cuda.Event()
    drain = stream.synchronize
    H2D = 1  # cudaMemcpyHostToDevice
    req_args = (ctypes.c_void_p(dev_req.data_ptr()), ctypes.c_void_p(host_req.data_ptr()), host_req.nbytes, H2D,
                s_handle)
    hdr_args = (ctypes.c_void_p(dev_hdr.data_ptr()), ctypes.c_void_p(host_hdr.data_ptr()), host_hdr.nbytes, H2D,
                s_handle)

    def ctypes_copies():
        cudart.cudaMemcpyAsync(*req_args)
        cudart.cudaMemcpyAsync(*hdr_args)

    def torch_copies():
        dev_req.copy_(host_req, non_blocking=True)
        dev_hdr.copy_(host_hdr, non_blocking=True)

    ev.record(stream)  # torch creates the CUDA event at its first record: its handle exists from here
    ev.synchronize()
    ev_handle = ctypes.c_void_p(ev.cuda_event)
    cases = [
        ("graph replay, torch", g.replay),
        ("graph launch, ctypes", lambda: cudart.cudaGraphLaunch(exec_handle, s_handle)),
        ("graph of a copy and 10 kernels, torch", g10.replay),
        ("graph of a copy and 10 kernels, ctypes", lambda: cudart.cudaGraphLaunch(exec10, s_handle)),
        ("two copies, torch", torch_copies),
        ("two copies, ctypes", ctypes_copies),
        ("event record, torch", lambda: ev.record(stream)),
        ("event record, ctypes", lambda: cudart.cudaEventRecord(ev_handle, s_handle)),
        ("event query, torch", ev.query),
        ("event query, ctypes", lambda: cudart.cudaEventQuery(ev_handle)),
    ]
    # check that the ctypes calls do what their torch twins do (nonzero return = a CUDA error)
    host_req.fill_(7)
    host_hdr.fill_(9)
    assert cudart.cudaGraphLaunch(exec_handle, s_handle) == 0
    drain()
    assert int(dev_req.sum()) == 7 * 64 and int(dev_hdr.sum()) == 18, "the ctypes graph launch did not copy"
    host_req.fill_(3)
    assert cudart.cudaMemcpyAsync(*req_args) == 0
    drain()
    assert int(dev_req.sum()) == 3 * 64, "the ctypes copy did not copy"
    samples = {}
    for _ in range(2):  # two interleaved rounds: a busy host hits both alike
        for name, fn in cases:
            for _ in range(200):
                fn()
                drain()
            samples.setdefault(name, []).append(timed(fn, a.n // 2, drain))
    rows = []
    p50 = {}
    for name, _ in cases:
        v = np.concatenate(samples[name])
        p50[name] = float(np.percentile(v, 50))
        rows.append((name, p50[name], float(np.percentile(v, 99)), float(np.percentile(v, 99.9)),
                     statistics.median(float(np.percentile(r, 50)) for r in samples[name])))
    print(table(["call", "p50 µs", "p99 µs", "p99.9 µs", "median of round p50s"], rows, digits=2))
    for k in range(0, len(cases), 2):  # each torch row is followed by its ctypes twin
        t_name, c_name = cases[k][0], cases[k + 1][0]
        print(f"{c_name} / {t_name}: {p50[c_name] / p50[t_name]:.2f}x")
    if a.json:
        write_json(a.json, {"rows": [dict(zip(("call", "p50_us", "p99_us", "p999_us"), r)) for r in rows]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
