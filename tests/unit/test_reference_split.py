"""`reference.preprocess` evaluates large numpy batches column-split (each formula on its own
columns, log1p through torch's vectorised loop: `_preprocess_split`) and small ones whole-row: the
prices must agree bit for bit and the sizes within 1 ulp, on every kind of value a feed row can
hold (zeros, negatives, a non-positive mid, NaN, inf, subnormals), or the CPU engine's decisions
would depend on its batch size by more than rounding."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from hft_infer.kernels import reference

SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 100.0, 99.5]


def assert_same_transform(got: np.ndarray, want: np.ndarray) -> None:
    """Prices (even columns) bit for bit; sizes (odd columns) within 1 ulp, same NaNs and signs."""
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got[..., 0::2], want[..., 0::2])  # NaN == NaN here
    g, w = got[..., 1::2], want[..., 1::2]
    assert np.array_equal(np.isnan(g), np.isnan(w))
    ok = ~np.isnan(w)
    np.testing.assert_array_max_ulp(g[ok], w[ok], maxulp=1)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # every column: -0.0 == 0.0 above


def _whole_row(raw: np.ndarray) -> np.ndarray:
    """The whole-row form, as `preprocess` takes it below SPLIT_MIN elements."""
    small = raw.reshape(-1, raw.shape[-1])
    return np.concatenate([reference.preprocess(small[i:i + 1]) for i in range(len(small))]).reshape(raw.shape)


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
