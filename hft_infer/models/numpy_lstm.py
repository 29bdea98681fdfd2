"""The CPU engine's LSTM steps in numpy: stream mode and the incremental window method.

Same math as `torch.nn.LSTM` (models/lstm.py), laid out so that each layer is
one matrix product and nine in-place elementwise calls on preallocated
buffers (one numpy call costs ~1 µs on the 2-core dev VM, a torch op 3-7 µs).

Gates. `LstmModel.cell_weights` gives the gate rows in (i, f, o, g) order;
the i, f, o rows are scaled by 0.5 here (exact in binary), so that one tanh
over all four gates gives tanh(z/2) for the sigmoid gates and tanh(z) for g,
and sigmoid(z) = 0.5 * tanh(z/2) + 0.5 takes two more calls. (numpy has no
sigmoid ufunc; 1 / (1 + exp(-z)) would take three calls and a second pass.)

State rows. Each recurrent state is one row laid out so that every layer's
matrix-product input is a contiguous slice with a constant 1 for its bias:

    stream:       [ x (F) | h_0 | 1 | h_1 | 1 | ... | h_{L-1} | 1 | c_0 | ... | c_{L-1} ]
    incremental:  [ h_0 | 1 | h_1 | 1 | ... | h_{L-1} | 1 | c_0 | ... | c_{L-1} ]

Layer 0 reads [x | h_0 | 1] (stream) and layer l >= 1 reads [h_{l-1} | 1 | h_l];
the new h_l overwrites h_l in place, which is both the new state and the
next layer's input; the head reads [h_{L-1} | 1]. The 1 columns are set at
reset and never written by a step; `reset_slots` zeroes h and c of exactly
those slots (it writes the template row: zeros and the 1 columns).

A step gathers the slots' state rows into scratch with one `take`, steps, and
scatters them back with one assignment (duplicates are only the padding
sink, whose state is then arbitrary). The views of the scratch each layer
reads and writes are made once per batch size (`_plan`: slicing costs
~0.2-0.4 µs a view, a dozen per layer otherwise). The incremental method at
batch 1 works in place on the slot's W state rows instead (a gather and a
scatter of W rows would cost more than its few fresh views). What still
allocates per step: `reference.features` and `reference.scores` (their
small temporaries).
"""

from __future__ import annotations

import numpy as np

from hft_infer.kernels.reference import features, scores
from hft_infer.models.executor import Executor
from hft_infer.models.lstm import LstmModel


def _gate_weights(model: LstmModel, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 (W_ih^T [in, 4H], W_hh^T [H, 4H], bias [4H]) of one layer, gates (i, f, o, g),
    the i, f, o columns halved (one tanh gives all four gates, see the module docstring)."""
    w_ih, w_hh, bias = (t.double().numpy() for t in model.cell_weights(layer))
    hid = w_hh.shape[1]
    scale = np.ones(4 * hid)
    scale[: 3 * hid] = 0.5
    return w_ih.T * scale, w_hh.T * scale, bias * scale


def gate_views(gates: np.ndarray) -> tuple[np.ndarray, ...]:
    """(gates, sigmoid block, i, f, o, g) views of a [M, 4H] gate buffer in (i, f, o, g) order."""
    hid = gates.shape[1] // 4
    return (gates, gates[:, : 3 * hid], gates[:, :hid], gates[:, hid: 2 * hid], gates[:, 2 * hid: 3 * hid],
            gates[:, 3 * hid:])


def lstm_cell(views: tuple[np.ndarray, ...], c: np.ndarray, h: np.ndarray) -> None:
    """In place, nine numpy calls: `views` (gate_views) of the pre-activations (i, f, o halved;
    g), c [M, H] -> c', h [M, H] <- h'. torch.nn.LSTM's math: c' = f * c + i * g,
    h' = o * tanh(c'). The gate buffer is clobbered."""
    gates, sig, i, f, o, g = views
    np.tanh(gates, out=gates)
    np.multiply(sig, 0.5, out=sig)
    np.add(sig, 0.5, out=sig)
    np.multiply(c, f, out=c)
    np.multiply(i, g, out=i)
    np.add(c, i, out=c)
    np.tanh(c, out=h)
    np.multiply(h, o, out=h)


class _Plan:
    """Views of the scratch buffers for one batch size."""

    __slots__ = ("rows", "block", "layers", "gates", "head_in", "logits", "x", "flat", "base", "raw", "xproj",
                 "emit", "emit_rows", "row_base")


class _NumpyLstm(Executor):
    """Shared: weights, the row layout, the newest-row transform and the head."""

    stateful = True
    ring_rows = 1
    backend = "numpy"
    x_width = 0  # columns of the new row's features at the start of a state row
    rows_per_slot = 1  # state rows per slot

    def __init__(self, model: LstmModel, ring, max_batch: int) -> None:
        super().__init__(model, ring, max_batch)
        spec, dt = model.spec, self.np_dtype
        hid, nl, f, x = spec.hidden[0], spec.layers, self.width, self.x_width
        self.hidden, self.layers = hid, nl
        self._mean = model.norm_mean.detach().numpy().astype(dt)
        self._inv_std = model.norm_inv_std.detach().numpy().astype(dt)
        # Column offsets of h_l (its 1 follows it) and c_l in a state row.
        self._h = [x + layer * (hid + 1) for layer in range(nl)]
        self._c = [x + nl * (hid + 1) + layer * hid for layer in range(nl)]
        self.row_width = x + nl * (hid + 1) + nl * hid
        self._template = np.zeros(self.row_width, dtype=dt)
        self._template[[h + hid for h in self._h]] = 1.0
        k = self.rows_per_slot
        self.state = np.empty((self.n_slots, k, self.row_width), dtype=dt)
        self._rows = np.empty((max_batch, k, self.row_width), dtype=dt)
        self._ring_flat = self.ring_np.reshape(self.n_slots * self.ring_len, f)
        self._head = np.concatenate([model.head.weight.detach().double().numpy().T,
                                     model.head.bias.detach().double().numpy()[None, :]]).astype(dt)
        self._logits = np.empty((max_batch, spec.outputs), dtype=dt)
        self._flat = np.empty(max_batch, np.int64)
        self._base = np.empty(max_batch, np.int64)
        self._raw = np.empty((max_batch, f), np.float32)
        self._gates = np.empty((max_batch * k, 4 * hid), dtype=dt)
        self._weights: list[np.ndarray] = []  # per layer: [input columns, 4H] (see _layer_input)
        for layer in range(nl):
            w_ih, w_hh, bias = _gate_weights(model, layer)
            if layer == 0:
                self._weights.append(self._first_layer(w_ih, w_hh, bias).astype(dt))
            else:  # [h_below | 1 | h]
                self._weights.append(np.concatenate([w_ih, bias[None, :], w_hh]).astype(dt))
        self._plans: dict[int, _Plan] = {}
        self.reset()

    def _first_layer(self, w_ih: np.ndarray, w_hh: np.ndarray, bias: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _layer_input(self, layer: int) -> slice:
        """Columns [x | h_0 | 1] (layer 0 of stream) or [h_below | 1 | h] that a layer reads."""
        if layer == 0:
            return slice(0, self._h[0] + self.hidden + 1)
        return slice(self._h[layer - 1], self._h[layer] + self.hidden)

    def _layer_views(self, rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per layer (input, c, h) views of state rows [M, row_width]."""
        hid = self.hidden
        return [(rows[:, self._layer_input(k)], rows[:, c: c + hid], rows[:, h: h + hid])
                for k, (h, c) in enumerate(zip(self._h, self._c))]

    def _head_in(self, rows: np.ndarray) -> np.ndarray:
        return rows[:, self._h[-1]: self._h[-1] + self.hidden + 1]  # [h_{L-1} | 1]

    def _plan(self, n: int) -> _Plan:
        plan = _Plan()
        plan.block = self._rows[:n]
        plan.rows = plan.block.reshape(n * self.rows_per_slot, self.row_width)
        plan.layers = self._layer_views(plan.rows)
        plan.gates = gate_views(self._gates[: n * self.rows_per_slot])
        plan.logits = self._logits[:n]
        plan.flat, plan.base, plan.raw = self._flat[:n], self._base[:n], self._raw[:n]
        self._plans[n] = plan
        return plan

    def reset(self) -> None:
        self.state[:] = self._template

    def reset_slots(self, slots) -> None:
        self.state[np.asarray(slots, dtype=np.int64)] = self._template

    def _new_features(self, slots: np.ndarray, positions: np.ndarray, n: int, plan: _Plan) -> np.ndarray:
        """reference.features of each trigger's own row ring[slot, position % R] -> [n, F]."""
        if n == 1:
            p = int(positions[0]) % self.ring_len
            raw = self.ring_np[int(slots[0]), p: p + 1]
        else:
            flat = np.remainder(positions, self.ring_len, out=plan.flat)
            flat += np.multiply(slots, self.ring_len, out=plan.base)
            raw = self._ring_flat.take(flat, axis=0, out=plan.raw, mode="clip")
        return features(raw.astype(self.np_dtype, copy=False), self._mean, self._inv_std)


class LstmStreamNumpyExecutor(_NumpyLstm):
    """LSTM stream: one recurrent step per event from the slot's (h, c) of every layer."""

    def __init__(self, model: LstmModel, ring, max_batch: int) -> None:
        self.x_width = model.spec.features
        super().__init__(model, ring, max_batch)

    def _first_layer(self, w_ih, w_hh, bias):  # [x | h_0 | 1]
        return np.concatenate([w_ih, w_hh, bias[None, :]])

    def _plan(self, n: int) -> _Plan:
        plan = super()._plan(n)
        plan.x = plan.rows[:, : self.width]
        plan.head_in = self._head_in(plan.rows)
        return plan

    def step(self, slots: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        n = self._check_batch(slots)
        plan = self._plans.get(n) or self._plan(n)
        self.state.take(slots, axis=0, out=plan.block, mode="clip")
        plan.x[...] = self._new_features(slots, positions, n, plan)
        for wt, (inp, c, h) in zip(self._weights, plan.layers):
            np.matmul(inp, wt, out=plan.gates[0])
            lstm_cell(plan.gates, c, h)
        out[:] = scores(np.matmul(plan.head_in, self._head, out=plan.logits))
        self.state[slots] = plan.block


class LstmIncrementalNumpyExecutor(_NumpyLstm):
    """LSTM window mode by the open-window method (incremental.py explains it): per slot and
    layer W states in a circular buffer indexed by start position mod W; at row t all W advance
    by the row, the state at index (t + 1) mod W has seen exactly W rows (fewer at the slot's
    start: the window over rows 0..t) and is emitted, then restarted from zero. Layer 0's input
    projection of the row (with the bias) is computed once and broadcast over the W states."""

    def __init__(self, model: LstmModel, ring, max_batch: int) -> None:
        self.x_width = 0
        self.rows_per_slot = model.spec.window
        super().__init__(model, ring, max_batch)
        dt, f = self.np_dtype, self.width
        self._x = np.ones((max_batch, f + 1), dtype=dt)  # column f stays 1: layer 0's bias input
        self._xproj = np.empty((max_batch, 4 * self.hidden), dtype=dt)
        self._emit = np.empty(max_batch, np.int64)
        self._emit_rows = np.empty((max_batch, self.row_width), dtype=dt)
        self._row_base = np.arange(max_batch, dtype=np.int64) * self.window

    def _first_layer(self, w_ih, w_hh, bias):
        self._w_x = np.concatenate([w_ih, bias[None, :]]).astype(self.np_dtype)  # [x | 1], once per row
        return w_hh  # [h_0], once per open window

    def _layer_input(self, layer: int) -> slice:
        if layer == 0:
            return slice(self._h[0], self._h[0] + self.hidden)
        return super()._layer_input(layer)

    def _plan(self, n: int) -> _Plan:
        plan = super()._plan(n)
        plan.x = self._x[:n]
        plan.xproj = self._xproj[:n]
        plan.emit, plan.emit_rows, plan.row_base = self._emit[:n], self._emit_rows[:n], self._row_base[:n]
        plan.head_in = self._head_in(plan.emit_rows)
        return plan

    def step(self, slots: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        n = self._check_batch(slots)
        w, hid = self.window, self.hidden
        plan = self._plans.get(n) or self._plan(n)
        if n == 1:  # in place on the slot's W rows
            rows = self.state[int(slots[0])]
            layers = self._layer_views(rows)
        else:
            self.state.take(slots, axis=0, out=plan.block, mode="clip")
            rows, layers = plan.rows, plan.layers
        plan.x[:, : self.width] = self._new_features(slots, positions, n, plan)
        np.matmul(plan.x, self._w_x, out=plan.xproj)
        gates = plan.gates[0]
        for layer, (wt, (inp, c, h)) in enumerate(zip(self._weights, layers)):
            np.matmul(inp, wt, out=gates)
            if layer == 0:
                g3 = gates.reshape(n, w, 4 * hid)
                np.add(g3, plan.xproj[:, None, :], out=g3)
            lstm_cell(plan.gates, c, h)
        # Emit the window that has now seen W rows (index (t + 1) mod W), then restart it.
        if n == 1:
            e = (int(positions[0]) + 1) % w
            out[:] = scores(np.matmul(self._head_in(rows[e: e + 1]), self._head, out=plan.logits))
            rows[e] = self._template
            return
        e = np.add(positions, 1, out=plan.emit)
        np.remainder(e, w, out=e)
        e += plan.row_base
        rows.take(e, axis=0, out=plan.emit_rows, mode="clip")
        out[:] = scores(np.matmul(plan.head_in, self._head, out=plan.logits))
        rows[e] = self._template
        self.state[slots] = plan.block
