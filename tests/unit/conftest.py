"""Fixtures of the unit tests."""

from __future__ import annotations

import pytest
import torch
from threadpoolctl import threadpool_limits


@pytest.fixture(scope="module")
def one_thread():
    """One torch and one BLAS thread, as the service runs (runner.torch_threads = 1): on a busy
    2-core machine two threads wait on each other at every small op (~15x slower here).
    Modules take it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1, user_api="blas"):
        yield
    torch.set_num_threads(before)
