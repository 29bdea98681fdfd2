"""The CPU engine's LSTM steps in numpy: stream mode and the incremental window method.

Same math as `torch.nn.LSTM` (models/lstm.py), laid out so that each layer is
one matrix product and eight elementwise calls on preallocated, contiguous
buffers (one numpy call costs ~1 µs on the 2-core dev VM, a torch op 3-7 µs).

Gates. `LstmModel.cell_weights` gives the gate rows in (i, f, o, g) order;
the i, f, o rows are scaled by 0.5 here (exact in binary), so that one tanh
over all four gates gives tanh(z/2) for the sigmoid gates and tanh(z) for g,
and sigmoid(z) = 0.5 * tanh(z/2) + 0.5 takes two more calls. (numpy has no
sigmoid ufunc; 1 / (1 + exp(-z)) would take three calls.)

State layout: feature-major. A recurrent state is a column of D values, the
rows of which are laid out so that every layer's matrix-product input is
one contiguous block of rows holding a constant 1 for its bias:

    stream:       x (F) | h_0 | 1 | h_1 | 1 | ... | h_{L-1} | 1 | c_0 | ... | c_{L-1}
    incremental:  h_0 | 1 | h_1 | 1 | ... | h_{L-1} | 1 | c_0 | ... | c_{L-1}

Layer 0 reads [x | h_0 | 1] (stream; the incremental method projects x once
per row and reads h_0), layer l >= 1 reads [h_{l-1} | 1 | h_l]; the new h_l
overwrites h_l, which is both the new state and the next layer's input;
the head reads [h_{L-1} | 1]. The gates come out as [4H, M] (M states in
the step), so i, f, o, g, c and h are all contiguous [H, M] blocks: numpy
runs its plain loops on them. (Strided [M, H] column views would go through
numpy's buffered iterator: 3-4x slower at M = 64 and a 32 KB buffer
allocated per operand per call, measured.) The 1 rows are set at reset and
never written by a step; `reset_slots` zeroes h and c of exactly those
slots (it writes the template: zeros and the 1 rows).

Each slot's state is stored as one contiguous [D, K] block (K = 1 for
stream, W open windows for the incremental method), so a batch of one
steps in place on its slot's block (stream: copied in and out, two small
copies against fresh views; its products are matrix x vector, np.dot's BLAS
gemv, ~1.3-1.5 µs less each than matmul's [4H, in] x [in, 1]). A larger batch gathers the blocks with one
`take`, transposes them into the [D, n*K] scratch with one copy, and back
(duplicates are only the padding sink, whose state is then arbitrary).
The views each layer reads and writes are made once per batch size
(`_plan`), and with them each batched product's backend: numpy's matmul or torch's
mm, whichever is faster for the shape here (products.py). What still allocates per step: `reference.features` and
`reference.scores` (their small temporaries) and the scatter's index
machinery (~3 KB).
"""

from __future__ import annotations

import numpy as np

from hft_infer.kernels.reference import features, scores
from hft_infer.models.executor import Executor
from hft_infer.models.lstm import LstmModel
from hft_infer.models.products import PlannedProducts, bind_product


def _gate_weights(model: LstmModel, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 (W_ih [4H, in], W_hh [4H, H], bias [4H, 1]) of one layer, gates (i, f, o, g),
    the i, f, o rows halved (one tanh gives all four gates, see the module docstring)."""
    w_ih, w_hh, bias = (t.double().numpy() for t in model.cell_weights(layer))
    hid = w_hh.shape[1]
    scale = np.ones((4 * hid, 1))
    scale[: 3 * hid] = 0.5
    return w_ih * scale, w_hh * scale, bias[:, None] * scale


def gate_views(gates: np.ndarray, tmp: np.ndarray) -> tuple[np.ndarray, ...]:
    """(gates, sigmoid block, i, f, o, g, tmp): row blocks of a [4H, M] gate buffer in
    (i, f, o, g) order, and a separate [H, M] scratch (see lstm_cell)."""
    hid = gates.shape[0] // 4
    return gates, gates[: 3 * hid], gates[:hid], gates[hid: 2 * hid], gates[2 * hid: 3 * hid], gates[3 * hid:], tmp


def lstm_cell(views: tuple[np.ndarray, ...], c: np.ndarray, h: np.ndarray) -> None:
    """In place, eight numpy calls: `views` (gate_views) of the pre-activations (i, f, o
    halved; g), c [H, M] -> c', h [H, M] <- h'. torch.nn.LSTM's math: c' = f * c + i * g,
    h' = o * tanh(c'). The gate buffer is clobbered. The products go through `tmp` so that
    no call writes one block of a buffer while reading another of the same buffer."""
    gates, sig, i, f, o, g, tmp = views
    np.tanh(gates, out=gates)
    np.multiply(sig, 0.5, out=sig)
    np.add(sig, 0.5, out=sig)
    np.multiply(c, f, out=c)
    np.multiply(i, g, out=tmp)
    np.add(c, tmp, out=c)
    np.tanh(c, out=tmp)
    np.multiply(tmp, o, out=h)


class _Plan:
    """Views of the scratch buffers for one batch size."""

    __slots__ = ("cols", "gathered", "gathered_t", "cols_3d", "layers", "gates", "head_in", "logits",
                 "x", "flat", "base", "raw", "xproj", "emit", "emit_cols", "col_base", "wide_tmp", "gates_vec",
                 "layer_products", "head", "x_product", "products")


class _NumpyLstm(PlannedProducts, Executor):
    """Shared: weights, the state layout, the newest-row transform, the gather and scatter."""

    stateful = True
    ring_rows = 1
    backend = "numpy"
    x_width = 0  # rows of the new row's features at the top of a state column
    per_slot = 1  # state columns per slot (K)

    def __init__(self, model: LstmModel, ring, max_batch: int, *, products: str = "auto",
                 precision: str = "fp32") -> None:
        self.products = products  # products.py: numpy's or torch's product per batch size
        self.precision = precision  # products.py: "bf16" lets the layers' products run in bf16
        super().__init__(model, ring, max_batch)
        spec, dt = model.spec, self.np_dtype
        hid, nl, f, x, k = spec.hidden[0], spec.layers, self.width, self.x_width, self.per_slot
        self.hidden, self.layers = hid, nl
        self._mean = model.norm_mean.detach().numpy().astype(dt)
        self._inv_std = model.norm_inv_std.detach().numpy().astype(dt)
        # Row offsets of h_l (its 1 follows it) and c_l in a state column.
        self._h = [x + layer * (hid + 1) for layer in range(nl)]
        self._c = [x + nl * (hid + 1) + layer * hid for layer in range(nl)]
        self.depth = x + nl * (hid + 1) + nl * hid  # D
        self._template = np.zeros((self.depth, 1), dtype=dt)
        self._template[[h + hid for h in self._h]] = 1.0
        self.state = np.empty((self.n_slots, self.depth, k), dtype=dt)
        self._gathered = np.empty((max_batch, self.depth, k), dtype=dt)
        # Flat: each batch size takes a contiguous [rows, n * K] prefix (a column slice of a
        # [rows, max_batch * K] buffer would be strided, see the module docstring).
        self._cols = np.zeros(self.depth * max_batch * k, dtype=dt)  # finite: "auto" times products on it
        self._gates = np.empty(4 * hid * max_batch * k, dtype=dt)
        # [4H, n * K] for the incremental method's broadcast of layer 0's input projection; the
        # cell uses an [H, n * K] prefix.
        self._tmp = np.empty(4 * hid * max_batch * k, dtype=dt)
        self._ring_flat = self.ring_np.reshape(self.n_slots * self.ring_len, f)
        self._head = np.concatenate([model.head.weight.detach().double().numpy(),
                                     model.head.bias.detach().double().numpy()[:, None]], axis=1).astype(dt)
        self._flat = np.empty(max_batch, np.int64)
        self._base = np.empty(max_batch, np.int64)
        self._raw = np.empty((max_batch, f), np.float32)
        self._weights: list[np.ndarray] = []  # per layer: [4H, input rows] (see _layer_input)
        for layer in range(nl):
            w_ih, w_hh, bias = _gate_weights(model, layer)
            if layer == 0:
                self._weights.append(self._first_layer(w_ih, w_hh, bias).astype(dt))
            else:  # [h_below | 1 | h]
                self._weights.append(np.concatenate([w_ih, bias, w_hh], axis=1).astype(dt))
        self._plans: dict[int, _Plan] = {}
        self.reset()

    def _first_layer(self, w_ih: np.ndarray, w_hh: np.ndarray, bias: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _layer_input(self, layer: int) -> slice:
        """Rows [x | h_0 | 1] (layer 0 of stream) or [h_below | 1 | h] that a layer reads."""
        if layer == 0:
            return slice(0, self._h[0] + self.hidden + 1)
        return slice(self._h[layer - 1], self._h[layer] + self.hidden)

    def _layer_views(self, cols: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per layer (input, c, h) row blocks of state columns [D, M]."""
        hid = self.hidden
        return [(cols[self._layer_input(k)], cols[c: c + hid], cols[h: h + hid])
                for k, (h, c) in enumerate(zip(self._h, self._c))]

    def _head_in(self, cols: np.ndarray) -> np.ndarray:
        return cols[self._h[-1]: self._h[-1] + self.hidden + 1]  # [h_{L-1} | 1]

    def _plan(self, n: int) -> _Plan:
        """Views for a batch of n, made once per n; the small buffers are its own."""
        plan = _Plan()
        m, k, d, hid = n * self.per_slot, self.per_slot, self.depth, self.hidden
        plan.cols = self._cols[: d * m].reshape(d, m)
        plan.cols_3d = plan.cols.reshape(d, n, k)
        plan.gathered = self._gathered[:n]
        plan.gathered_t = plan.gathered.transpose(1, 0, 2)  # [D, n, K] view of the gathered blocks
        plan.layers = self._layer_views(plan.cols)
        plan.gates = gate_views(self._gates[: 4 * hid * m].reshape(4 * hid, m), self._tmp[: hid * m].reshape(hid, m))
        plan.wide_tmp = self._tmp[: 4 * hid * m].reshape(4 * hid, n, k)
        plan.logits = np.empty((self.model.spec.outputs, n), dtype=self.np_dtype)
        plan.flat, plan.base, plan.raw = self._flat[:n], self._base[:n], self._raw[:n]
        plan.products = []
        self._plans[n] = plan
        return plan

    def _bind_products(self, plan: _Plan) -> None:
        """Each layer's product into the gates and the head's into the logits, bound once."""
        gates = plan.gates[0]
        plan.layer_products = [bind_product(wt, inp, gates, self.products, bf16_weights=self.bf16_weights("a"))
                               for wt, (inp, _, _) in zip(self._weights, plan.layers)]
        plan.head = bind_product(self._head, plan.head_in, plan.logits, self.products)
        plan.products += plan.layer_products + [plan.head]

    def reset(self) -> None:
        self.state[:] = self._template

    def reset_slots(self, slots) -> None:
        self.state[np.asarray(slots, dtype=np.int64)] = self._template

    def _gather(self, slots: np.ndarray, plan: _Plan) -> None:
        self.state.take(slots, axis=0, out=plan.gathered, mode="clip")
        np.copyto(plan.cols_3d, plan.gathered_t)

    def _scatter(self, slots: np.ndarray, plan: _Plan) -> None:
        np.copyto(plan.gathered_t, plan.cols_3d)
        self.state[slots] = plan.gathered

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

    def _score(self, head_in: np.ndarray, logits: np.ndarray, out: np.ndarray) -> None:
        out[:] = scores(np.matmul(self._head, head_in, out=logits).T)

    def _score_bound(self, plan: _Plan, out: np.ndarray) -> None:
        plan.head.run()
        out[:] = scores(plan.logits.T)


class LstmStreamNumpyExecutor(_NumpyLstm):
    """LSTM stream: one recurrent step per event from the slot's (h, c) of every layer."""

    def __init__(self, model: LstmModel, ring, max_batch: int, *, products: str = "auto",
                 precision: str = "fp32") -> None:
        self.x_width = model.spec.features
        super().__init__(model, ring, max_batch, products=products, precision=precision)
        self._one = self._plan_one()

    def _first_layer(self, w_ih, w_hh, bias):  # [x | h_0 | 1]
        return np.concatenate([w_ih, w_hh, bias], axis=1)

    def _plan(self, n: int) -> _Plan:
        plan = super()._plan(n)
        plan.x = plan.cols[: self.width]
        plan.head_in = self._head_in(plan.cols)
        if n > 1:  # batch 1's products are np.dot's gemv (_plan_one)
            self._bind_products(plan)
        return plan

    def _plan_one(self) -> _Plan:
        """Batch 1's plan, with 1-D views of its [D, 1] column: the layers' and the head's
        products go to np.dot as matrix x vector (BLAS gemv: ~1.3-1.5 µs less each than matmul's
        [4H, in] x [in, 1] on the dev VM)."""
        plan = self._plan(1)
        del self._plans[1]  # batch 1's own (step() never looks it up): its views below are 1-D
        plan.layers = [(inp[:, 0], c, h) for inp, c, h in plan.layers]
        plan.gates_vec = plan.gates[0][:, 0]  # the gate buffer as a vector (gemv's output)
        plan.head_in = plan.head_in[:, 0]
        plan.logits = plan.logits[:, 0]
        return plan

    def step(self, slots: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        n = self._check_batch(slots)
        if n == 1:
            self._step_one(slots, positions, out)
            return
        plan = self._plans.get(n) or self._plan(n)
        self._gather(slots, plan)
        plan.x[...] = self._new_features(slots, positions, n, plan).T
        for product, (_, c, h) in zip(plan.layer_products, plan.layers):
            product.run()
            lstm_cell(plan.gates, c, h)
        self._score_bound(plan, out)
        self._scatter(slots, plan)

    def _step_one(self, slots: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        """Batch of one: the slot's [D, 1] block is the scratch's memory layout (plain copies in
        and out), the products matrix x vector."""
        plan = self._one
        state = self.state[int(slots[0])]
        np.copyto(plan.cols, state)
        plan.x[:, 0] = self._new_features(slots, positions, 1, plan)[0]
        gates = plan.gates_vec
        for wt, (inp, c, h) in zip(self._weights, plan.layers):
            np.dot(wt, inp, out=gates)
            lstm_cell(plan.gates, c, h)
        out[0] = scores(np.dot(self._head, plan.head_in, out=plan.logits))
        np.copyto(state, plan.cols)


class LstmIncrementalNumpyExecutor(_NumpyLstm):
    """LSTM window mode by the open-window method (incremental.py explains it): per slot and
    layer W states in a circular buffer indexed by start position mod W; at row t all W advance
    by the row, the state at index (t + 1) mod W has seen exactly W rows (fewer at the slot's
    start: the window over rows 0..t) and is emitted, then restarted from zero. Layer 0's input
    projection of the row (with the bias) is computed once and broadcast over the W states."""

    def __init__(self, model: LstmModel, ring, max_batch: int, *, products: str = "auto",
                 precision: str = "fp32") -> None:
        self.x_width = 0
        self.per_slot = model.spec.window
        super().__init__(model, ring, max_batch, products=products, precision=precision)
        self._emit = np.empty(max_batch, np.int64)
        self._col_base = np.arange(max_batch, dtype=np.int64) * self.window

    def _first_layer(self, w_ih, w_hh, bias):
        self._w_x = np.concatenate([w_ih, bias], axis=1).astype(self.np_dtype)  # [x | 1], once per row
        return w_hh  # [h_0], once per open window

    def _layer_input(self, layer: int) -> slice:
        if layer == 0:
            return slice(self._h[0], self._h[0] + self.hidden)
        return super()._layer_input(layer)

    def _plan(self, n: int) -> _Plan:
        plan = super()._plan(n)
        dt = self.np_dtype
        plan.x = np.ones((self.width + 1, n), dtype=dt)  # row F stays 1: layer 0's bias input
        plan.xproj = np.empty((4 * self.hidden, n), dtype=dt)
        plan.emit, plan.col_base = self._emit[:n], self._col_base[:n]
        plan.emit_cols = np.zeros((self.depth, n), dtype=dt)
        plan.head_in = self._head_in(plan.emit_cols)
        if n > 1:  # batch 1 steps in place on its slot's block: views made per step
            self._bind_products(plan)
            plan.x_product = bind_product(self._w_x, plan.x, plan.xproj, self.products,
                                          bf16_weights=self.bf16_weights("a"))
            plan.products.append(plan.x_product)
        return plan

    def step(self, slots: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
        n = self._check_batch(slots)
        w, hid = self.window, self.hidden
        plan = self._plans.get(n) or self._plan(n)
        if n == 1:  # in place on the slot's [D, W] block (copying 2 x D x W values costs more)
            cols = self.state[int(slots[0])]
            layers = self._layer_views(cols)
        else:
            self._gather(slots, plan)
            cols, layers = plan.cols, plan.layers
        plan.x[: self.width] = self._new_features(slots, positions, n, plan).T
        gates = plan.gates[0]
        if n == 1:
            np.matmul(self._w_x, plan.x, out=plan.xproj)
        else:
            plan.x_product.run()
        for layer, (wt, (inp, c, h)) in enumerate(zip(self._weights, layers)):
            if n == 1:
                np.matmul(wt, inp, out=gates)
            else:
                plan.layer_products[layer].run()
            if layer == 0:
                # Broadcast by a copy, then a plain add: a ufunc with a stride-0 operand goes
                # through numpy's buffered iterator (a 32 KB buffer per call; same time).
                np.copyto(plan.wide_tmp, plan.xproj[:, :, None])
                g3 = gates.reshape(4 * hid, n, w)
                np.add(g3, plan.wide_tmp, out=g3)
            lstm_cell(plan.gates, c, h)
        # Emit the window that has now seen W rows (index (t + 1) mod W), then restart it.
        if n == 1:
            e = (int(positions[0]) + 1) % w
            self._score(self._head_in(cols[:, e: e + 1]), plan.logits, out)
            cols[:, e: e + 1] = self._template
            return
        e = np.add(positions, 1, out=plan.emit)
        np.remainder(e, w, out=e)
        e += plan.col_base
        cols.take(e, axis=1, out=plan.emit_cols, mode="clip")
        self._score_bound(plan, out)
        cols[:, e] = self._template
        self._scatter(slots, plan)
