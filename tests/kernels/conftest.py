"""Kernel tests run on the CPU under Triton's interpreter, and on CUDA compiled.

TRITON_INTERPRET is read when a kernel is decorated, i.e. when
hft_infer.kernels.* is first imported, so it is set here, before any test
module of this folder imports them. Without CUDA (CI) it is switched on; with
CUDA it is left as found, so the "cuda" cases run compiled kernels and the
"cpu" cases skip. An explicit TRITON_INTERPRET in the environment wins.
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from _kernels_path import ensure_kernels_importable  # noqa: E402 - after TRITON_INTERPRET

ensure_kernels_importable()
