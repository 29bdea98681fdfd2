"""Decision policy: thresholds and hysteresis, vectorised, against a plain-Python reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hft_infer.models.decision import DecisionPolicy


def reference(threshold: float, hysteresis: float, held: int, score: np.float32) -> int:
    """The documented rule, one slot at a time, compared in the scores' dtype (float32), as
    torch compares a float32 tensor with a Python float: a fresh signal past a threshold wins,
    else a held position stays inside threshold - hysteresis. (Written apart from
    reference.decide_one on purpose: the oracle of every form, the scalar one included.)"""
    thr, stay = np.float32(threshold), np.float32(threshold - hysteresis)
    fresh = 1 if score > thr else -1 if score < -thr else 0
    kept = held if (held == 1 and score >= stay) or (held == -1 and score <= -stay) else 0
    return fresh or kept


def test_thresholds_without_hysteresis():
    p = DecisionPolicy(0.2, 0.0, n_slots=5)
    out = torch.empty(5, dtype=torch.int8)
    p.apply(torch.arange(5), torch.tensor([0.5, 0.21, 0.2, -0.2, -0.9]), out)
    assert out.tolist() == [1, 1, 0, 0, -1]
    p.apply(torch.arange(5), torch.tensor([0.1, 0.0, -0.1, 0.19, 0.3]), out)
    assert out.tolist() == [0, 0, 0, 0, 1]  # no memory: inside the band is flat


def test_hysteresis_holds_until_the_inner_band():
    p = DecisionPolicy(0.3, 0.2, n_slots=2)
    out = torch.empty(2, dtype=torch.int64)
    seq = [(0.4, -0.4), (0.2, -0.2), (0.11, -0.1), (0.09, -0.09), (0.2, -0.2)]
    got = []
    for a, b in seq:
        p.apply(torch.tensor([0, 1]), torch.tensor([a, b]), out)
        got.append(out.tolist())
    # long holds while score >= 0.1, short while score <= -0.1; after leaving, 0.2 is not enough to re-enter.
    assert got == [[1, -1], [1, -1], [1, -1], [0, 0], [0, 0]]
    assert p.held.tolist() == [0, 0]


def test_a_fresh_opposite_signal_flips():
    p = DecisionPolicy(0.1, 0.5, n_slots=1)  # hysteresis wider than the threshold
    out = torch.empty(1, dtype=torch.int8)
    for score, want in [(0.5, 1), (-0.3, -1), (0.3, 1), (0.0, 1), (-0.11, -1)]:
        p.apply(torch.tensor([0]), torch.tensor([score]), out)
        assert out.item() == want, score


@pytest.mark.parametrize(("threshold", "hysteresis"), [(0.2, 0.0), (0.2, 0.1), (0.05, 0.3), (0.0, 0.0), (1.0, 1.0)])
def test_random_batches_match_reference(threshold, hysteresis):
    rng = np.random.default_rng(int(threshold * 100 + hysteresis * 10))
    n_slots = 24
    p = DecisionPolicy(threshold, hysteresis, n_slots=n_slots, max_batch=4)  # batches grow past max_batch
    held = [0] * n_slots
    for _ in range(400):
        k = int(rng.integers(1, 21))  # 1: the policy's scalar path; up to SCALAR_ROWS: decide's; above: arrays
        slots = rng.choice(n_slots, size=k, replace=False)
        scores = np.round(rng.uniform(-1, 1, size=k), 2)  # coarse: lands exactly on thresholds sometimes
        out = torch.empty(k, dtype=torch.int8)
        p.apply(torch.from_numpy(slots), torch.from_numpy(scores).float(), out)
        want = []
        for s, sc in zip(slots, np.float32(scores)):
            held[s] = reference(threshold, hysteresis, held[s], sc)
            want.append(held[s])
        assert out.tolist() == want
    assert p.held.tolist() == held
    p.reset()
    assert p.held.abs().sum() == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="threshold must be in"):
        DecisionPolicy(1.5, 0.0, 1)
    with pytest.raises(ValueError, match="hysteresis must be in"):
        DecisionPolicy(0.5, -0.1, 1)
    with pytest.raises(ValueError, match="n_slots must be >= 1"):
        DecisionPolicy(0.5, 0.0, 0)


def test_numpy_apply_equals_torch_apply_and_shares_the_held_state():
    import numpy as np
    import torch

    from hft_infer.models.decision import DecisionPolicy

    rng = np.random.default_rng(5)
    a, b = DecisionPolicy(0.2, 0.05, 16, 8), DecisionPolicy(0.2, 0.05, 16, 8)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        slots = rng.permutation(16)[:n].astype(np.int64)
        scores = rng.uniform(-0.4, 0.4, n).astype(np.float32)
        scores[rng.random(n) < 0.1] = np.float32(0.2)  # exactly at the threshold
        out_t = torch.empty(n, dtype=torch.int64)
        out_n = np.empty(n, dtype=np.int64)
        a.apply(torch.from_numpy(slots), torch.from_numpy(scores), out_t)
        b.apply_numpy(slots, scores, out_n)
        assert out_t.tolist() == out_n.tolist()
        assert torch.equal(a.held, b.held)


def test_a_retuned_threshold_applies_to_the_next_step_at_every_batch_size():
    # the policy keeps the thresholds rounded to the scores' dtype: setting one must drop them
    for k in (1, 3, 20):  # the scalar path, decide's scalar form, the array form
        p = DecisionPolicy(0.5, 0.0, n_slots=k, max_batch=k)
        scores = np.full(k, 0.3, np.float32)
        out = np.empty(k, np.int8)
        p.apply_numpy(np.arange(k), scores, out)
        assert out.tolist() == [0] * k
        p.threshold = 0.25
        p.apply_numpy(np.arange(k), scores, out)
        assert out.tolist() == [1] * k
        p.hysteresis = 0.2  # held long while score >= 0.05
        p.apply_numpy(np.arange(k), np.full(k, 0.1, np.float32), out)
        assert out.tolist() == [1] * k, k
        p.hysteresis = 0.0
        p.apply_numpy(np.arange(k), np.full(k, 0.1, np.float32), out)
        assert out.tolist() == [0] * k, k
