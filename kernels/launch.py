"""CUDA graph launches without torch's wrapper: `cudaGraphLaunch` called through ctypes on the
libcudart that torch loaded.

Every step the loop submits replays a CUDA graph: the graph engine's model step
(runner/gpu.py) and the persistent engine's request copy (persistent.RequestRing, transport
"dma"). `CUDAGraph.replay()` sets a device guard, runs the RNG prologue of graphs that draw
random numbers (ours draw none), launches the instantiated graph on torch's current stream
and reads the driver's version; on an H100 host it took 5.14 µs p50 against 3.80 for the
same launch called directly (tools/bench_launch.py, BENCHMARKS.md wave 35): ~1.3 µs of the
host's time per step, at the 60-70k steps a second of a saturated shard ~9 % of its core.

`graph_launcher(graph, stream)` returns a call that launches the graph on that stream (fixed
when the launcher is made: the engines replay on one stream for their whole life) and raises
GraphLaunchError when CUDA reports an error. Where libcudart is not mapped into the process or
torch does not expose the graph's exec handle, the call is `graph.replay` itself (its stream
the current one, as always).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch


class GraphLaunchError(RuntimeError):
    """cudaGraphLaunch returned an error (the engines turn it into an EngineFailure)."""


_LIB: ctypes.CDLL | None = None
_LOOKED = False


def cudart() -> ctypes.CDLL | None:
    """The libcudart mapped into this process (torch's, once CUDA is initialised), its
    cudaGraphLaunch and cudaGetErrorName typed; None where there is none."""
    global _LIB, _LOOKED
    if _LOOKED:
        return _LIB
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "libcudart.so" in line})
    except OSError:  # not Linux
        paths = []
    if paths:
        lib = ctypes.CDLL(paths[0])
        lib.cudaGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cudaGraphLaunch.restype = ctypes.c_int
        lib.cudaGetErrorName.argtypes = [ctypes.c_int]
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        _LIB = lib
    _LOOKED = bool(paths)  # not found: looked for again next time (CUDA may not be initialised yet)
    return _LIB


def graph_launcher(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> Callable[[], None]:
    """A call that launches `graph` on `stream`, as `graph.replay()` does on the current stream."""
    lib = cudart()
    exec_of = getattr(graph, "raw_cuda_graph_exec", None)
    if lib is None or exec_of is None:
        return graph.replay
    graph_exec = ctypes.c_void_p(exec_of())
    if not graph_exec.value:  # not instantiated (captured with keep_graph and never instantiated)
        return graph.replay
    launch, stream_handle = lib.cudaGraphLaunch, ctypes.c_void_p(stream.cuda_stream)

    def launch_graph() -> None:
        err = launch(graph_exec, stream_handle)
        if err:
            raise GraphLaunchError(f"cudaGraphLaunch failed: {lib.cudaGetErrorName(err).decode()} ({err})")

    launch_graph.graph = graph  # the exec handle lives as long as its graph: keep it
    return launch_graph
