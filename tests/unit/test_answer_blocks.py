"""Answers held as blocks (numpy columns kept until the flush) and as arrays (one answer at a time,
lists), in any interleaving: the frame Egress.batch_bytes joins is byte for byte msgspec's encoding
of the answers in the order they were added, and `columns()` reads them back in that order. A
block's arrays are the caller's (kept, not copied), except the engine's outputs, which the next
step overwrites: those are copied as they go in."""

from __future__ import annotations

import gc
import struct
import weakref

import msgspec
import numpy as np
from hypothesis import given, settings, strategies as st

from hft_infer.egress import _COLUMN_CODES, Egress
from hft_infer.transport.schema import DecisionBatch, Outcome, Reason

U32, U64 = (1 << 32) - 1, (1 << 64) - 1
TS = 1_780_000_000_123_456_789
VERSION = "mlp_small@21ffdf1a"

row = st.tuples(st.integers(0, U32), st.integers(0, U64), st.integers(0, U32), st.integers(0, (1 << 63) - 1),
                st.integers(0, (1 << 63) - 1), st.floats(width=32, allow_nan=False), st.integers(-1, 1))
# (how the rows go in, the rows): one at a time, a step's decisions as numpy columns (the stepper's
# types: seq and ts as int64), sheds as numpy columns (the ingest's), sheds as lists
op = st.tuples(st.sampled_from(["add", "decided_np", "shed_np", "shed_list"]), st.lists(row, min_size=1, max_size=9))


def _as_i64(values) -> np.ndarray:
    """uint64 values as the request table holds them: int64 of the same bits."""
    return np.array(values, dtype=np.uint64).view(np.int64)


def _apply(eg: Egress, kind: str, rows: list[tuple]) -> list[tuple]:
    """Add `rows` the `kind` way; returns the answers they must read back as."""
    a = eg.answers
    inst, seq, nconf, send, recv, score, action = (list(c) for c in zip(*rows))
    reason = int(Reason.LATE)
    if kind == "add":
        for i, q, c, sd, r, sc, ac in rows:
            a.add(i, q, int(Outcome.DECIDED), 0, ac, sc, c, sd, r)
        return [(i, q, int(Outcome.DECIDED), 0, ac, sc, c, sd, r) for i, q, c, sd, r, sc, ac in rows]
    if kind == "decided_np":
        scores, actions = np.array(score, np.float32), np.array(action, np.int64)
        a.add_decided(np.array(inst, np.uint32), _as_i64(seq), np.array(nconf, np.uint32), _as_i64(send),
                      _as_i64(recv), scores, actions)
        scores[:] = 9.0  # the engine's buffers, reused by the next step
        actions[:] = 0
        return [(i, q, int(Outcome.DECIDED), 0, ac, sc, c, sd, r) for i, q, c, sd, r, sc, ac in rows]
    if kind == "shed_np":
        a.add_shed(np.array(inst, np.int64), np.array(seq, np.uint64), reason, None, _as_i64(send), _as_i64(recv))
        return [(i, q, int(Outcome.SHED), reason, 0, 0.0, 0, sd, r) for i, q, c, sd, r, sc, ac in rows]
    a.add_shed(inst, seq, reason, nconf, send, recv)
    return [(i, q, int(Outcome.SHED), reason, 0, 0.0, c, sd, r) for i, q, c, sd, r, sc, ac in rows]


def _expected_frame(rows: list[tuple]) -> bytes:
    n = len(rows)
    cols = list(zip(*rows))
    return msgspec.msgpack.encode(DecisionBatch(TS, VERSION, n, *(struct.pack(f"<{n}{code}", *col)
                                                                  for code, col in zip(_COLUMN_CODES, cols))))


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op, min_size=1, max_size=6))
def test_blocks_and_arrays_pack_and_read_back_in_the_order_added(ops):
    eg = Egress(None, [1, 2, 3], mode="batch", topic_frame=True, model_version=VERSION)
    expected = []
    for kind, rows in ops:
        expected += _apply(eg, kind, rows)
    expected = [r[:5] + (struct.unpack("<f", struct.pack("<f", r[5]))[0],) + r[6:] for r in expected]  # f32
    assert len(eg.answers) == len(expected)
    assert eg.batch_bytes(TS) == _expected_frame(expected)  # blocks joined as they are
    assert list(zip(*eg.answers.columns())) == expected  # gathered into the arrays
    assert eg.batch_bytes(TS) == _expected_frame(expected)  # ... and packed from them alike
    eg.answers.clear()
    assert len(eg.answers) == 0 and all(len(c) == 0 for c in eg.answers.columns())


def test_a_frame_of_one_block_and_the_next_of_another_carry_their_own_values():
    """batch_bytes keeps each size's framing with the last frame's columns in it: the next frame
    of that size must carry its own block, and arrays after a block theirs."""
    eg = Egress(None, [1], mode="batch", topic_frame=True, model_version=VERSION)
    frames = []
    for k in range(3):
        rows = [(k, 10 * k + i, 0, TS - i, TS - k, k / 4, 1) for i in range(5)]
        if k == 2:  # the same size from the arrays
            expected = _apply(eg, "add", rows)
        else:
            expected = _apply(eg, "decided_np", rows)
        frames.append(eg.batch_bytes(TS))
        assert frames[-1] == _expected_frame(expected), k
        eg.answers.clear()
    assert len(set(frames)) == 3


def test_a_block_that_is_not_the_wires_type_or_not_contiguous_is_converted():
    eg = Egress(None, [1], mode="batch", topic_frame=True, model_version=VERSION)
    inst = np.arange(12, dtype=np.int64)[::2]  # strided, and int64 for a uint32 column
    seq = np.arange(6, dtype=np.int32)
    eg.answers.add_shed(inst, seq, int(Reason.STALE), np.array([1, 2, 3, 4, 5, U32 + 7], np.int64),
                        np.arange(6, dtype=np.int64), np.arange(6, dtype=np.int64) + 1)
    rows = [(2 * i, i, int(Outcome.SHED), int(Reason.STALE), 0, 0.0, min(i + 1, U32) if i < 5 else U32, i, i + 1)
            for i in range(6)]
    assert eg.batch_bytes(TS) == _expected_frame(rows)


def test_a_flushed_blocks_arrays_are_not_kept():
    """batch_bytes caches each size's framing, not the last frame's columns: once the answers are
    cleared, nothing of ours holds a block's arrays (4096 cached sizes would otherwise keep up to
    that many frames' worth of them)."""
    eg = Egress(None, [1], mode="batch", topic_frame=True, model_version=VERSION)
    recv = _as_i64([TS - i for i in range(5)])
    eg.answers.add_shed(np.arange(5, dtype=np.uint32), _as_i64(range(5)), int(Reason.LATE), None, recv, recv)
    alive = weakref.ref(recv)
    eg.batch_bytes(TS)
    eg.answers.clear()
    del recv
    gc.collect()
    assert alive() is None
