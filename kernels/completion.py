"""A step's completion flag, written by the last node of a CUDA graph (the graph engine's).

The graph engine used to record a CUDA event after each replay and poll it with
`Event.query()`; on the host that is two more calls through torch per step (the record at
submit, a query per loop iteration while the step runs). Instead each captured graph ends in
`graph_done`: one program that bumps the buffer's device counter and stores the new value into
the buffer's pinned host flag with a release store at system scope. The host knows how many
replays it launched on the buffer, so "done" is a compare of a pinned int64 it reads through a
memoryview (no torch, no driver call).

Ordering: the model's kernel writes the step's decisions into pinned host memory; `graph_done`
runs after it in stream order (a kernel boundary: every store of the model kernel is performed
before `graph_done` starts), and its release at system scope makes those stores visible to the
host no later than the flag (the PTX memory model's release is cumulative). It is the same
data-then-flag protocol as the persistent kernels' `_release_done` (kernels/persistent.py),
which the tests and the self-check hold to the CPU engine. Refused where that protocol is
(`persistent_supported`: x86 hosts, whose loads are not reordered with older loads, so the
host reads the flag, then the decisions, in that order).
"""

from __future__ import annotations

import triton
import triton.language as tl

FLAG_STRIDE = 16
"""int64 words between two buffers' flags and counters: each on its own 128-byte line."""


@triton.jit
def _graph_done_kernel(counter_ptr, flag_ptr):
    v = tl.load(counter_ptr) + 1
    tl.store(counter_ptr, v)
    tl.atomic_xchg(flag_ptr, v, sem="release", scope="sys")


def graph_done(counter, flag) -> None:
    """Bump `counter` (device int64 [1] view) and release its value into `flag` (pinned host
    int64 [1] view). Capturable; launch it after the step's last kernel on the same stream."""
    _graph_done_kernel[(1,)](counter, flag, num_warps=1)
