"""The DecisionBatch frame packed by one cached struct (Egress.batch_bytes) is byte for byte what
msgspec writes for the same DecisionBatch, at every batch size and value range."""

from __future__ import annotations

import msgpack
import msgspec
from hypothesis import given, settings, strategies as st

from hft_infer.egress import Egress
from hft_infer.transport.schema import DecisionBatch

U32, U64 = (1 << 32) - 1, (1 << 64) - 1
answer = st.tuples(
    st.integers(0, U32), st.integers(0, U64), st.integers(0, 2), st.integers(0, 255), st.integers(-1, 1),
    st.floats(width=32, allow_nan=False), st.integers(0, U32), st.integers(0, (1 << 63) - 1),
    st.integers(0, (1 << 63) - 1))


def _egress(version: str = "mlp_small@21ffdf1a") -> Egress:
    return Egress(None, [1, 2, 3], mode="batch", topic_frame=True, model_version=version)


def _fill(eg: Egress, answers) -> None:
    eg.answers.clear()
    for a in answers:
        eg.answers.add(*a)


@settings(max_examples=150, deadline=None)
@given(answers=st.lists(answer, min_size=1, max_size=80),
       ts=st.integers(U32 + 1, U64), version=st.sampled_from(["v", "mlp_small@21ffdf1a", "x" * 40, "é" * 20]))
def test_the_packed_frame_is_msgspecs_encoding(answers, ts, version):
    eg = _egress(version)
    _fill(eg, answers)
    expected = msgspec.msgpack.encode(eg.batch_frame(ts))
    assert eg.batch_bytes(ts) == expected
    assert eg.batch_bytes(ts) == expected  # the cached template, a second time
    assert len(eg.answers) == len(answers)  # packing does not clear


def test_sizes_that_change_the_bin_headers_and_the_count_form():
    eg = _egress()
    ts = 1_780_000_000_123_456_789
    # n = 63/64: the 4-byte columns pass 255 bytes (bin 8 -> bin 16); 127/128/255/256: n's msgpack
    # form (fixint, uint 8, uint 16); 8192: the 8-byte columns pass 65,535 bytes (bin 16 -> bin 32)
    for n in (1, 31, 32, 63, 64, 127, 128, 255, 256, 8191, 8192):
        _fill(eg, [(i % 3, 10**12 + i, i % 3, i % 5, i % 3 - 1, i / 7, i, ts - i, ts - 2 * i) for i in range(n)])
        frame = eg.batch_bytes(ts)
        assert frame == msgspec.msgpack.encode(eg.batch_frame(ts)), n
        # and a plain msgpack client reads it as the README says: [tag, ts, version, n, nine bins]
        doc = msgpack.unpackb(frame)
        assert doc[1:4] == [ts, eg.model_version, n] and len(doc[4]) == 4 * n and len(doc[5]) == 8 * n


def test_a_size_seen_before_packs_the_new_answers_and_timestamp():
    """batch_bytes caches each size's parts with the answer columns in them (cleared and refilled in
    place between flushes): a later flush of the same size must carry its own values."""
    eg = _egress()
    frames = set()
    for k in range(3):
        ts = 1_780_000_000_000_000_000 + k
        _fill(eg, [(k, 10 * k + i, 1, k, 1, k / 4, k, ts - i, ts - k) for i in range(5)])
        frame = eg.batch_bytes(ts)
        assert frame == msgspec.msgpack.encode(eg.batch_frame(ts)), k
        frames.add(frame)
    assert len(frames) == 3


def test_cold_cases_take_msgspecs_path_with_the_same_result():
    eg = _egress()
    base = (1, 2, 0, 0, 1, 0.5, 0, 3, 4)
    _fill(eg, [base])
    for ts in (0, 12345, U32):  # a timestamp below uint 64's form (not an epoch in ns: tests, clock steps)
        assert eg.batch_bytes(ts) == msgspec.msgpack.encode(eg.batch_frame(ts))
    _fill(eg, [base[:6] + (U32 + 5,) + base[7:]])  # four billion conflations: saturated, as batch_frame does
    frame = eg.batch_bytes(1 << 60)
    assert frame == msgspec.msgpack.encode(eg.batch_frame(1 << 60))
    assert msgspec.msgpack.decode(frame, type=DecisionBatch).n_conflated == U32.to_bytes(4, "little")
