"""The shipped default model: the default config serves it, and its held-out metrics
(written into the checkpoint by `hft-infer train`, tools/train_default.py) are reproduced on freshly
generated data; plus the dataset helpers the training and the metrics rely on."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from hft_infer.config import DecisionConfig, ModelConfig
from hft_infer.models import dataset as ds
from hft_infer.models.build import build_executor
from hft_infer.models.checkpoint import builtin_path, load_model, read_header
from hft_infer.models.decision import DecisionPolicy
from hft_infer.models.evaluation import PREDICTORS, evaluate, roc_auc, window_logits
from hft_infer.replay.events import KIND_QUOTE, KIND_TRADE, empty_events
from hft_infer.replay.synthetic import SyntheticConfig, generate


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the service and the training tool run
    yield
    torch.set_num_threads(before)


def test_default_config_serves_the_shipped_model():
    cfg = ModelConfig()
    model, version = load_model(cfg.checkpoint, preset=cfg.preset, seed=cfg.seed, mode=cfg.mode)
    assert cfg.checkpoint == "builtin:default" and builtin_path("default").is_file()
    assert version.startswith("mlp_small@") and model.spec.name == "mlp_small"
    # Trained constants, not the identity of a random init.
    assert not torch.equal(model.norm_inv_std, torch.ones_like(model.norm_inv_std))
    # End to end through the executor and the decision policy on a synthetic feed.
    ev = generate(3000, SyntheticConfig(instruments=4, seed=5))
    rows = torch.from_numpy(ds.raw_rows(ev, model.spec.levels))
    ring = torch.zeros(5, model.spec.window, model.spec.features)
    ex = build_executor(model, ring, max_batch=1, mode=cfg.mode, window_method=cfg.window_method)
    policy = DecisionPolicy(DecisionConfig().threshold, DecisionConfig().hysteresis, n_slots=5)
    pos = [0] * 5
    scores = np.empty(ev.size, np.float32)
    actions = np.empty(ev.size, dtype=np.int8)
    for i, s in enumerate(ev["instrument"].tolist()):
        ring[s, pos[s] % ring.shape[1]] = rows[i]
        slot = np.array([s], np.int64)
        ex.step(slot, np.array([pos[s]], np.int64), scores[i: i + 1])
        policy.apply_numpy(slot, scores[i: i + 1], actions[i: i + 1])
        pos[s] += 1
    assert set(actions.tolist()) == {-1, 0, 1}
    # The executor's scores are the model's: same as the offline window evaluation.
    index, _ = ds.window_index(ev, model.spec.window)
    with torch.inference_mode():
        logits = window_logits(model, rows.numpy(), index)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(torch.from_numpy(scores), (p[:, 2] - p[:, 0]).float(), atol=1e-5, rtol=0)


def test_heldout_metrics_are_reproduced_and_beat_naive_predictors():
    header = read_header(builtin_path("default"))
    info = header.extra
    recorded = info["heldout_metrics"]
    model, _ = load_model("builtin:default")
    data = msgspec.convert(info["data"]["heldout"], type=SyntheticConfig)
    events = generate(info["data"]["heldout_events"], data)
    fresh = evaluate(model, events, horizon=info["horizon_events"], dead_zone_ticks=info["dead_zone_ticks"],
                     tick=data.tick)
    for name in PREDICTORS:
        for key in ("accuracy", "auc"):
            # Same data and weights; only float summation order (threads, BLAS) may differ.
            assert fresh[name][key] == pytest.approx(recorded[name][key], abs=2e-3), (name, key)
    for name in PREDICTORS[1:]:
        assert fresh["model"]["accuracy"] > fresh[name]["accuracy"] + 0.02, name
        assert fresh["model"]["auc"] > fresh[name]["auc"] + 0.02, name


def _table(kinds, insts, books, trades=None):
    ev = empty_events(len(kinds), 2)
    ev["kind"] = kinds
    ev["instrument"] = insts
    for i, b in enumerate(books):
        if b is not None:
            ev["book"][i] = b
            ev["n_levels"][i] = 2
    for i, (px, sz, side) in (trades or {}).items():
        ev["price"][i], ev["size"][i], ev["side"][i] = px, sz, side
    return ev


def test_raw_rows_repeat_the_last_book_on_trades():
    b0 = [[10, 5, 11, 6], [9, 7, 12, 8]]
    b1 = [[20, 1, 21, 2], [19, 3, 22, 4]]
    b2 = [[10.5, 5, 11, 6], [9, 7, 12, 8]]
    Q, T = KIND_QUOTE, KIND_TRADE
    ev = _table([T, Q, Q, T, Q, T], [0, 0, 1, 0, 0, 1], [None, b0, b1, None, b2, None],
                {0: (10.0, 3, 1), 3: (11.0, 2, 1), 5: (20.0, 4, -1)})
    rows = ds.raw_rows(ev, 2)
    assert rows.shape == (6, 10)
    np.testing.assert_array_equal(rows[0], [0] * 8 + [10, 3])  # a trade before any quote: no book
    np.testing.assert_array_equal(rows[3, :8], np.ravel(b0))
    np.testing.assert_array_equal(rows[3, 8:], [11, 2])
    np.testing.assert_array_equal(rows[5, :8], np.ravel(b1))
    np.testing.assert_array_equal(rows[5, 8:], [20, -4])
    np.testing.assert_array_equal(rows[4], np.ravel(b2).tolist() + [0, 0])
    # Fewer model levels than the book: the first levels only.
    np.testing.assert_array_equal(ds.raw_rows(ev, 1)[1], [10, 5, 11, 6, 0, 0])


def test_labels_windows_and_naive_signals():
    Q = KIND_QUOTE
    mids = [10.0, 10.0, 10.5, 10.5, 9.5, 9.5]
    books = [[[m - 0.5, 1, m + 0.5, 1], [m - 1, 1, m + 1, 1]] for m in mids]
    ev = _table([Q] * 6, [0] * 6, books)
    ev["book"][1, 0, 1] = 3  # bid-heavy
    rows = ds.raw_rows(ev, 2)
    labels, valid = ds.future_move_labels(ev, rows, 2, 0.5, 0.1)
    assert valid.tolist() == [True, True, True, True, False, False]
    assert labels[:4].tolist() == [ds.UP, ds.UP, ds.DOWN, ds.DOWN]
    assert ds.last_move_sign(ev, rows).tolist() == [0, 0, 1, 1, -1, -1]
    assert ds.level0_imbalance(rows)[1] == pytest.approx(0.5)
    index, pad = ds.window_index(ev, 3)
    assert pad == 6
    assert index[0].tolist() == [6, 6, 0] and index[4].tolist() == [2, 3, 4]


def test_roc_auc():
    assert roc_auc(np.array([0.1, 0.2, 0.3, 0.4]), np.array([0, 0, 1, 1])) == 1.0
    assert roc_auc(np.array([0.4, 0.3, 0.2, 0.1]), np.array([0, 0, 1, 1])) == 0.0
    assert roc_auc(np.zeros(4), np.array([0, 1, 0, 1])) == 0.5
    assert roc_auc(np.array([0.0, 1.0, 1.0, 2.0]), np.array([0, 0, 1, 1])) == pytest.approx(0.875)
