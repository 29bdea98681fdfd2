"""`reference.preprocess` evaluates large numpy batches column-split (each formula on its own
columns, log1p through torch's vectorised loop: `_preprocess_split`), a row or two on Python floats
(`_preprocess_scalar`) and the sizes between whole-row (`_preprocess_rows`): the forms must agree
to the last bit or two (split: prices bit for bit, sizes 1 ulp; scalar: prices 2 ulp, sizes 1 ulp)
on every kind of value a feed row can hold (zeros, negatives, a non-positive mid, NaN, inf,
subnormals), or the CPU engine's decisions would depend on its batch size by more than rounding.
The scores and the decision rule have a scalar form for a few rows too: tested here against the
array forms."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from hft_infer.kernels import reference

SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 100.0, 99.5]


def _within_ulp(got: np.ndarray, want: np.ndarray, maxulp: int) -> None:
    """Same NaNs; the rest within maxulp (0: bit for bit, -0.0 == 0.0; signs checked apart)."""
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    if maxulp:
        np.testing.assert_array_max_ulp(got[ok], want[ok], maxulp=maxulp)
    else:
        np.testing.assert_array_equal(got[ok], want[ok])


def assert_same_transform(got: np.ndarray, want: np.ndarray, price_ulp: int = 0) -> None:
    """Prices (even columns) within price_ulp (default bit for bit); sizes (odd columns) within
    1 ulp; same NaNs and signs."""
    assert got.dtype == want.dtype and got.shape == want.shape
    _within_ulp(got[..., 0::2], want[..., 0::2], price_ulp)
    _within_ulp(got[..., 1::2], want[..., 1::2], 1)
    finite = ~np.isnan(want)  # a NaN's sign bit is the arithmetic's business, not the formula's
    assert np.array_equal(np.signbit(got)[finite], np.signbit(want)[finite])  # -0.0 == 0.0 above


def _whole_row(raw: np.ndarray) -> np.ndarray:
    """The whole-row form, as `preprocess` takes it between SCALAR_MAX and SPLIT_MIN elements."""
    return reference._preprocess_rows(raw, np)


ROWS = arrays(np.float32, st.tuples(st.integers(1, 3), st.sampled_from([6, 10, 42])),
              elements=st.one_of(st.sampled_from(SPECIAL), st.floats(-1e6, 1e6, width=32, allow_nan=False)))


@settings(max_examples=200, deadline=None)
@given(raw=ROWS)
def test_the_scalar_evaluation_equals_the_whole_row_one(raw):
    with np.errstate(all="ignore"):  # overflow to inf: both forms warn, each in its own words
        assert_same_transform(reference._preprocess_scalar(raw), _whole_row(raw), price_ulp=2)
        wide = raw.astype(np.float64)  # double: the same IEEE operations, bit for bit
        assert_same_transform(reference._preprocess_scalar(wide), _whole_row(wide), price_ulp=0)


def test_preprocess_takes_the_scalar_form_up_to_scalar_max_elements():
    rng = np.random.default_rng(3)
    row = rng.uniform(-50, 200, size=(1, 42)).astype(np.float32)
    row[0, 0] = 150.0
    assert row.size <= reference.SCALAR_MAX < 3 * row.size
    got = reference.preprocess(row)
    np.testing.assert_array_equal(got, reference._preprocess_scalar(row))
    assert_same_transform(got, _whole_row(row), price_ulp=2)
    assert reference.preprocess(row[0]).shape == (42,)  # one 1-D row
    three = np.repeat(row, 3, axis=0)
    np.testing.assert_array_equal(reference.preprocess(three), _whole_row(three))  # above SCALAR_MAX
    assert reference.preprocess(np.empty((0, 42), np.float32)).shape == (0, 42)


LOGITS = arrays(np.float32, st.tuples(st.integers(1, reference.SCALAR_ROWS), st.just(3)),
                elements=st.one_of(st.sampled_from([0.0, -np.inf, 88.0, -88.0]),
                                   st.floats(-60, 60, width=32)))


@settings(max_examples=200, deadline=None)
@given(logits=LOGITS)
def test_the_scalar_scores_equal_the_array_form(logits):
    with np.errstate(invalid="ignore"):  # every logit -inf: NaN in both forms
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        want = (e[..., reference.UP] - e[..., reference.DOWN]) / e.sum(axis=-1)
        got = reference.scores(logits)  # this few rows: the scalar form
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-7, equal_nan=True)
    assert reference.scores(logits[0]).shape == ()


@settings(max_examples=200, deadline=None)
@given(score=arrays(np.float32, st.integers(1, reference.SCALAR_ROWS),
                    elements=st.one_of(st.sampled_from([0.25, -0.25, 0.125, -0.125, 0.0, np.nan]),
                                       st.floats(-1, 1, width=32))),
       data=st.data(), threshold=st.sampled_from([0.0, 0.25, 0.3]), hysteresis=st.sampled_from([0.0, 0.125, 0.5]))
def test_the_scalar_decision_equals_the_array_form(score, data, threshold, hysteresis):
    held = data.draw(arrays(np.int8, score.shape, elements=st.sampled_from([-1, 0, 1])))
    got = reference.decide(score, held, threshold, hysteresis)  # a few rows: the scalar form
    # the array form, on the same rows padded past SCALAR_ROWS
    pad = reference.SCALAR_ROWS + 1
    want = reference.decide(np.concatenate([score, np.zeros(pad, np.float32)]),
                            np.concatenate([held, np.zeros(pad, np.int8)]), threshold, hysteresis)[: score.size]
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(levels=st.integers(1, 12), rows=st.integers(1, 80), data=st.data())
def test_the_split_evaluation_equals_the_whole_row_one(levels, rows, data):
    width = 4 * levels + 2
    raw = data.draw(arrays(np.float32, (rows, width),
                           elements=st.one_of(st.sampled_from(SPECIAL),
                                              st.floats(-1e6, 1e6, width=32, allow_nan=False))))
    assert width < reference.SPLIT_MIN  # one row alone takes the whole-row form
    want = _whole_row(raw)
    assert_same_transform(reference._preprocess_split(raw), want)


def test_preprocess_takes_the_split_form_from_split_min_elements_with_the_same_result():
    # enough rows that torch's vector loop runs (its lanes are where the last bit may differ)
    rng = np.random.default_rng(7)
    width = 42
    rows = 4 * reference.SPLIT_MIN // width + 1
    raw = rng.uniform(-50, 200, size=(rows, width)).astype(np.float32)
    raw[::3, 0] = 0.0  # mid not positive
    raw[1, 5] = np.nan
    assert_same_transform(reference.preprocess(raw), _whole_row(raw))
    # 3-D (slots x window x F), as the executors' gathers shape it, and float64 (reference checks)
    raw3 = raw[: rows - rows % 2].reshape(2, -1, width)
    assert_same_transform(reference.preprocess(raw3), _whole_row(raw3))
    assert_same_transform(reference.preprocess(raw.astype(np.float64)), _whole_row(raw.astype(np.float64)))


@settings(max_examples=100, deadline=None)
@given(raw=ROWS)
def test_the_in_place_price_formula_equals_the_expression(raw):
    """numpy's `_prices` runs the formula in place; the expression (torch's path, and what it
    replaced) must give the same bits, NaN, inf, -0.0 and a non-positive mid included."""
    mid = 0.5 * (raw[..., 0:1] + raw[..., 2:3])
    mid_ok = mid > 0
    safe = np.where(mid_ok, mid, np.ones_like(mid))
    for px in (raw, raw[..., 0::2]):
        want = np.where((px > 0) & mid_ok, (px - safe) / safe * reference.BPS, np.zeros_like(px))
        got = reference._prices(px, raw, np)
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_features_normalised_in_place_equal_normalise_of_preprocess():
    rng = np.random.default_rng(3)
    raw = rng.uniform(-50, 200, size=(2, 40, 42)).astype(np.float32)
    raw[0, 3, 7] = np.nan
    mean = rng.standard_normal(42).astype(np.float32)
    inv_std = rng.uniform(0.5, 2, 42).astype(np.float32)
    for r in (raw, raw[0], raw[0, :1]):
        want = reference.normalise(reference.preprocess(r), mean, inv_std)
        got = reference.features(r, mean, inv_std)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # other dtypes or shapes take `normalise` as it is (float64 mean: float64 features)
    assert reference.features(raw[0], mean.astype(np.float64), inv_std).dtype == np.float64
