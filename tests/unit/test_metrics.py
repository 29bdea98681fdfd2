"""Bulk HDR folding is bit-identical to record_value, and the sparse wire form adds up."""

from __future__ import annotations

import numpy as np

from hft_infer.metrics import (
    SampleBuffer,
    StageHistograms,
    add_sparse,
    counts_index,
    from_wire,
    new_histogram,
    record_array,
    summarize,
    to_wire,
)


def _values(seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([
        rng.integers(0, 5000, 2000),  # sub-bucket range, exact
        rng.lognormal(9, 2.5, 5000).astype(np.int64),  # heavy tail
        np.array([1, 2047, 2048, 2049, 2**31, 2**35 + 12345, 59_999_999_999]),
    ])


def test_bulk_fold_equals_record_value():
    vals = _values()
    bulk, ref = new_histogram(), new_histogram()
    record_array(bulk, vals)
    for v in vals:
        ref.record_value(int(v))
    assert np.array_equal(np.ctypeslib.as_array(bulk.counts), np.ctypeslib.as_array(ref.counts))
    assert (bulk.total_count, bulk.min_value, bulk.max_value) == (ref.total_count, ref.min_value, ref.max_value)
    assert summarize(bulk) == summarize(ref)


def test_counts_index_matches_reference_per_value():
    h = new_histogram()
    vals = _values(3)
    assert [h._counts_index_for(int(v)) for v in vals] == counts_index(h, vals).tolist()


def test_out_of_range_values_are_clamped_not_lost():
    h = new_histogram(highest_ns=1_000_000)
    record_array(h, np.array([-5, 10, 5_000_000]))
    assert h.total_count == 3 and h.get_max_value() >= 1_000_000 * 0.999


def test_sparse_wire_form_reconstructs_histogram():
    h = new_histogram()
    sparse = record_array(h, _values(5))
    rebuilt = new_histogram()
    add_sparse(rebuilt, from_wire(to_wire(sparse)))
    assert np.array_equal(np.ctypeslib.as_array(rebuilt.counts), np.ctypeslib.as_array(h.counts))
    assert summarize(rebuilt) == summarize(h)


def test_sample_buffer_keeps_every_sample_and_takes_chunks():
    b = SampleBuffer(4)
    for v in range(6):
        b.add(v)
    assert b.full and b.n == 6  # capacity is a pressure mark: nothing is dropped
    assert b.take_last(4).tolist() == [2, 3, 4, 5] and b.n == 2
    b.add_many(np.array([7, 8]))
    assert b.take().tolist() == [0, 1, 7, 8] and b.n == 0 and not b.full


def test_folding_in_chunks_touches_only_the_hit_range_and_matches_record_value():
    from hdrh.histogram import HdrHistogram

    st = StageHistograms(("a",), capacity=8192)
    rng = np.random.default_rng(5)
    values = rng.lognormal(11, 1.5, 20_000).astype(np.int64)
    st.buffers["a"].add_many(values)
    assert st.pressure()
    folded = 0
    while st.pending():
        folded += st.fold_some(4096)  # bounded work per call
    assert folded == values.size
    ref = HdrHistogram(1, 60_000_000_000, 3)
    for v in values.tolist():
        ref.record_value(v)
    ours = st.cumulative["a"]
    assert ours.get_total_count() == ref.get_total_count()
    for p in (50, 90, 99, 99.9):
        assert ours.get_value_at_percentile(p) == ref.get_value_at_percentile(p)
    interval = st.take_interval()["a"]
    assert interval.total == values.size and interval.count.sum() == values.size


def test_stage_histograms_fold_accumulates_and_intervals_reset():
    st = StageHistograms(("a", "b"), capacity=1024)
    st.buffers["a"].add_many(np.arange(1, 101))
    st.fold()  # idle fold: goes into the interval too
    st.buffers["a"].add_many(np.arange(1, 11))
    interval = st.take_interval()
    assert set(interval) == {"a"} and interval["a"].total == 110
    assert (interval["a"].min_ns, interval["a"].max_ns) == (1, 100)
    assert int(interval["a"].count.sum()) == 110
    st.buffers["a"].add_many(np.arange(1, 51))
    second = st.take_interval()
    assert second["a"].total == 50 and int(second["a"].count.sum()) == 50
    assert st.take_interval() == {}
    s = st.summary()
    assert s["a"]["count"] == 160 and s["b"]["count"] == 0
    assert s["a"]["max_us"] == 0.1


def test_the_idle_fold_takes_one_stage_and_only_once_it_holds_enough_samples():
    from hdrh.histogram import HdrHistogram

    st = StageHistograms(("a", "b", "c"), capacity=65536)
    st.buffers["a"].add_many(np.arange(1, 100))
    st.buffers["b"].add_many(np.arange(1, 300) * 1000)
    assert st.fold_one(min_samples=300) == 0  # no stage holds 300 yet: nothing folded
    assert st.pending() == 99 + 299 and st.cumulative["b"].get_total_count() == 0
    st.buffers["b"].add(7)
    assert st.fold_one(min_samples=300) == 300  # b is the fullest, and only b is folded
    assert st.buffers["b"].n == 0 and st.buffers["a"].n == 99
    assert st.cumulative["a"].get_total_count() == 0
    ref = HdrHistogram(1, 60_000_000_000, 3)
    for v in [*(np.arange(1, 300) * 1000).tolist(), 7]:
        ref.record_value(v)
    ours = st.cumulative["b"]
    assert ours.get_total_count() == 300 and (ours.min_value, ours.max_value) == (ref.min_value, ref.max_value)
    for p in (1, 50, 99, 100):
        assert ours.get_value_at_percentile(p) == ref.get_value_at_percentile(p)
    # out-of-range samples (a clock step, a stall past the histogram) are clamped, never lost
    st.buffers["c"].add_many(np.array([-5, 3, 10**12]))
    assert st.fold_one(min_samples=1) == 99  # a first: the fullest
    assert st.fold_one(min_samples=1) == 3
    c = st.cumulative["c"]
    assert c.get_total_count() == 3 and c.min_value == 0 and c.max_value == c.highest_trackable_value
    assert st.fold_one(min_samples=1) == 0 and st.pending() == 0
    assert st.take_interval()["b"].total == 300


def test_deferred_differences_are_the_samples_they_stand_for():
    """SampleBuffer.add_differences: each block's samples (minuend - subtrahend, none where an
    `unless_zero` subtrahend is 0) worked out at the next read, in one pass over blocks of one kind
    or block by block over mixed ones; counted in `n` before (at most), exactly after."""
    rng = np.random.default_rng(3)
    blocks = []
    for k in range(7):
        sub = rng.integers(1, 10**9, 5 + k)
        if k % 3 == 0:
            sub[::2] = 0  # events without a send time
        blocks.append((int(rng.integers(10**9, 2 * 10**9)) if k % 2 else sub + rng.integers(0, 10**6, sub.size),
                       sub, k % 3 == 0))

    def expected(chosen):
        out = []
        for a, b, uz in chosen:
            d = (a - b).tolist()
            out += [x for x, s in zip(d, b.tolist()) if s or not uz]
        return sorted(out)

    same_kind = [(a, b, False) for a, b, _ in blocks if type(a) is int]
    for chosen in (blocks, same_kind, blocks[:1]):
        buf = SampleBuffer(1 << 20)
        buf.add(5)
        for a, b, uz in chosen:
            buf.add_differences(a, b, unless_zero=uz)
        assert buf.n == 1 + sum(b.size for _, b, _ in chosen)
        got = sorted(buf.take().tolist())
        assert got == sorted([5] + expected(chosen))
        assert buf.n == 0


def test_a_stage_whose_deferred_samples_all_drop_out_folds_nothing():
    """Wire samples of events none of which carried a send time: `n` counted them until the read
    found none; the folds take nothing from that stage and go on with the others."""
    h = StageHistograms(stages=("wire", "queue"), capacity=64)
    h.buffers["wire"].add_differences(np.full(4, 10**6, np.int64), np.zeros(4, np.int64), unless_zero=True)
    h.buffers["queue"].add_differences(2000, np.array([1000, 1500], np.int64))
    assert h.fold_one(min_samples=1) == 0  # the fullest by `n` was wire: nothing in it
    assert h.fold_some() == 2
    h.fold()
    assert h.cumulative["wire"].total_count == 0 and h.cumulative["queue"].total_count == 2
