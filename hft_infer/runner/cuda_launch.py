"""cudaGraphLaunch through ctypes: a CUDA graph's launch without torch's `CUDAGraph.replay()`.

`replay()` is the C++ launch plus torch's bookkeeping around it (a device guard, the random
generators' replay prologue, a driver-version query on every call). The graph engine's graphs
use no random generator and run on one device, so that bookkeeping does nothing for them; the
launch is `cudaGraphLaunch(graph.raw_cuda_graph_exec(), stream)` on the CUDA runtime that torch
itself loaded. `graph_launcher()` returns None where that runtime or the raw handle is not
there (a torch without `raw_cuda_graph_exec`), and the engine replays through torch.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable


def _loaded_cudart() -> str | None:
    """Path of the libcudart this process has mapped (torch's), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if "/libcudart" in path and ".so" in path:
                    return path
    except OSError:
        return None
    return None


def graph_launcher() -> Callable[[int, int], int] | None:
    """launch(exec_handle, stream_handle) -> cudaError_t (0: launched), or None if unavailable.
    Call after torch has initialised CUDA (so its runtime is mapped)."""
    import torch

    if not hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec"):
        return None
    path = _loaded_cudart()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None
    fn = lib.cudaGraphLaunch
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn
