"""Shared fixtures. ipc paths must stay under ~100 bytes, so socket dirs are
short mkdtemp dirs under /tmp rather than pytest's deep tmp_path."""

from __future__ import annotations

import os

# Triton reads TRITON_INTERPRET when hft_infer.kernels.* is first imported: without a
# GPU, switch the CPU interpreter on before any test module can import them.
if "TRITON_INTERPRET" not in os.environ:
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except Exception:  # noqa: BLE001 - no torch: no kernels to test either
        pass

import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import zmq

# Dev helpers shared by the tests and the tools (fuzz mutations, a synthetic snapshot
# feeder) live in tools/, outside the product package.
TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="hft-t-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly on machines without CUDA."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - torch missing or broken: no GPU either way
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
