"""The synthetic market generator: determinism, table invariants, and learnable structure."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from hft_infer.models import dataset as ds
from hft_infer.models.evaluation import roc_auc
from hft_infer.replay.events import KIND_QUOTE, KIND_TRADE, event_dtype
from hft_infer.replay.synthetic import SyntheticConfig, ar1, generate


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return generate(60_000, SyntheticConfig(instruments=16, seed=3))


def test_same_seed_same_bytes_other_seed_differs():
    cfg = SyntheticConfig(instruments=8, seed=11, burstiness=0.5)
    a, b = generate(5000, cfg), generate(5000, cfg)
    assert a.tobytes() == b.tobytes()
    c = generate(5000, msgspec.structs.replace(cfg, seed=12))
    assert a.tobytes() != c.tobytes()


def test_dtype_and_timestamps(table):
    assert table.dtype == event_dtype(10)
    ts = table["ts_exchange_ns"]
    assert ts[0] == 0
    assert np.all(np.diff(ts) >= 0)
    assert set(np.unique(table["instrument"])) == set(range(16))


def test_seq_counts_up_per_instrument(table):
    for i in range(16):
        seq = table["seq"][table["instrument"] == i]
        np.testing.assert_array_equal(seq, np.arange(seq.size))


def test_quotes_are_full_sane_books(table):
    q = table[table["kind"] == KIND_QUOTE]
    assert np.all(q["n_levels"] == 10)
    book = q["book"]
    assert np.all(np.isfinite(book))
    bid_px, bid_sz, ask_px, ask_sz = book[..., 0], book[..., 1], book[..., 2], book[..., 3]
    assert np.all(bid_px > 0) and np.all(bid_sz > 0) and np.all(ask_sz > 0)
    assert np.all(bid_px[:, 0] < ask_px[:, 0])
    assert np.all(np.diff(bid_px, axis=1) < 0) and np.all(np.diff(ask_px, axis=1) > 0)
    assert np.all(q["priority"] == -1) and np.all(q["side"] == 0)


def test_trades_print_at_the_touch(table):
    rows = ds.raw_rows(table, 10)
    is_trade = table["kind"] == KIND_TRADE
    t = table[is_trade]
    assert 0.07 < is_trade.mean() < 0.13  # trade_fraction 0.1
    assert np.all(t["price"] > 0) and np.all(t["size"] > 0)
    assert set(np.unique(t["side"])) == {-1, 1}
    assert np.all(t["priority"] == -1) and np.all(t["n_levels"] == 0)
    touch = np.where(t["side"] > 0, rows[is_trade, 2], rows[is_trade, 0])  # ask for buys, bid for sells
    np.testing.assert_allclose(t["price"], touch, rtol=1e-6)


def test_first_event_of_each_instrument_is_a_quote(table):
    for i in range(16):
        assert table["kind"][table["instrument"] == i][0] == KIND_QUOTE


def test_mean_rate_poisson_and_bursty():
    for burst in (0.0, 1.0):
        ev = generate(100_000, SyntheticConfig(instruments=8, seed=5, burstiness=burst, rate_hz=50_000.0))
        mean_gap_ns = ev["ts_exchange_ns"][-1] / (ev.size - 1)
        assert mean_gap_ns == pytest.approx(1e9 / 50_000.0, rel=0.05)


def test_bursts_cluster_arrivals_and_concentrate_instruments():
    calm = generate(50_000, SyntheticConfig(instruments=32, seed=9))
    bursty = generate(50_000, SyntheticConfig(instruments=32, seed=9, burstiness=1.0))

    def gap_cv(ev):
        g = np.diff(ev["ts_exchange_ns"]).astype(float)
        return g.std() / g.mean()

    def max_share_per_block(ev):
        inst = ev["instrument"][: (ev.size // 64) * 64].reshape(-1, 64)
        return np.mean([np.bincount(b).max() / 64 for b in inst])

    def gap_autocorrelation(ev):
        g = np.log(np.diff(ev["ts_exchange_ns"]).astype(float) + 1.0)
        return np.corrcoef(g[:-1], g[1:])[0, 1]

    assert gap_cv(calm) == pytest.approx(1.0, abs=0.1)  # exponential gaps
    # Burst blocks (p 0.2) run 10x faster: the gap mixture's CV is 1.18 in theory.
    assert gap_cv(bursty) > 1.1
    # ... and short gaps come in runs (clustered), unlike Poisson arrivals.
    assert abs(gap_autocorrelation(calm)) < 0.03
    assert gap_autocorrelation(bursty) > 0.1
    assert max_share_per_block(bursty) > max_share_per_block(calm) + 0.05


def test_spread_regimes_all_occur(table):
    q = table[table["kind"] == KIND_QUOTE]
    spread_ticks = np.round((q["book"][:, 0, 2] - q["book"][:, 0, 0]) / 0.01).astype(int)
    assert set(np.unique(spread_ticks)) == {1, 2, 4}


def _directional(table, horizon=10):
    rows = ds.raw_rows(table, 10)
    labels, valid = ds.future_move_labels(table, rows, horizon, 0.5, 0.01)
    keep = valid & (labels != ds.FLAT)
    return rows, labels, keep


def test_level0_imbalance_leads_the_mid(table):
    rows, labels, keep = _directional(table)
    auc = roc_auc(ds.level0_imbalance(rows)[keep], labels[keep] == ds.UP)
    assert auc > 0.65


def test_trade_flow_leads_the_mid(table):
    _, labels, keep = _directional(table)
    trades = keep & (table["kind"] == KIND_TRADE)
    auc = roc_auc(table["side"][trades].astype(float), labels[trades] == ds.UP)
    assert auc > 0.55


def test_without_signal_nothing_is_predictable():
    """Control for the two tests above: with the pressure disconnected, the AUC is ~0.5."""
    flat = generate(60_000, SyntheticConfig(instruments=16, seed=3, signal_strength=0.0))
    rows, labels, keep = _directional(flat)
    assert abs(roc_auc(ds.level0_imbalance(rows)[keep], labels[keep] == ds.UP) - 0.5) < 0.02


def test_zero_and_tiny_tables():
    assert generate(0, SyntheticConfig()).shape == (0,)
    ev = generate(3, SyntheticConfig(instruments=64))
    assert ev.shape == (3,) and np.all(ev["kind"] == KIND_QUOTE)


def test_config_errors_are_one_line():
    with pytest.raises(ValueError, match="base_prices has 2 entries for 3 instruments"):
        SyntheticConfig(instruments=3, base_prices=(10.0, 20.0))
    with pytest.raises(ValueError, match=r"move_prob \* sqrt\(widest / narrowest spread\) must be <= 1"):
        SyntheticConfig(move_prob=0.6)
    with pytest.raises(ValueError, match="n_events"):
        generate(-1, SyntheticConfig())
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"instruments": 0}, type=SyntheticConfig)


def test_base_prices_are_honoured():
    ev = generate(2000, SyntheticConfig(instruments=2, base_prices=(10.0, 300.0), seed=4))
    first = [ev["book"][ev["instrument"] == i][0, 0, 0] for i in range(2)]
    assert first == pytest.approx([10.0, 300.0], rel=1e-6)


def test_ar1_matches_the_recursion():
    rng = np.random.default_rng(0)
    e = rng.standard_normal(1000)
    phi = 0.9
    x = np.empty_like(e)
    x[0] = e[0]
    for j in range(1, e.size):
        x[j] = phi * x[j - 1] + np.sqrt(1 - phi * phi) * e[j]
    np.testing.assert_allclose(ar1(e, phi), x, atol=1e-12)
