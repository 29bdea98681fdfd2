"""GPU engines: a CUDA graph per batch bucket, and a persistent kernel with no launch per step.

Both run the fused Triton kernels of `hft_infer.kernels` on device-resident
state (weights, LSTM open-window or stream state, the MLP's device ring, the
decision policy's held positions) allocated once at start-up. The host side
of a step is the same: the hot loop fills `slots`/`positions` (pinned),
`_stage` copies each entry's new raw row from the feature store into a pinned
staging buffer (one numpy gather), the device does the rest, and the
decisions come back into pinned memory.

- `GraphEngine`: each bucket's step (H2D of slots, positions and rows; the
  fused kernel; D2H of the outputs) is captured once as a CUDA graph, largest
  bucket first, all in one memory pool; a step is one `replay()` and one
  stream sync. Capturing again after start-up raises.
- `PersistentEngine` (window LSTM): the kernel polls a request flag in
  pinned memory, so a step is: stage, release the flag, spin on the done flag.
  A watchdog bounds the wait: a kernel that does not answer within
  `runner.watchdog_ms` is a fatal error (systemd restarts the service).

Every event's row reaches the device exactly once and in order, so GPU
engines schedule sequentially (no conflation): the MLP's device ring and the
LSTM states see every row.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from hft_infer.runner.base import Engine, EngineFailure

__all__ = ["EngineFailure", "GraphEngine", "KernelStep", "PersistentEngine"]


def _pinned(shape, dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype).pin_memory()


class KernelStep:
    """One model's fused kernel step on device buffers: `launch(b)` for a bucket of b entries.

    Inputs (device): slots, positions (int64 [max_batch]), rows (float32 [max_batch, F]);
    output: out (float32 [max_batch, OUT_COLS]: score, action, 3 logits).
    """

    def __init__(self, model, *, mode: str, window_method: str, n_slots: int, ring_depth: int, max_batch: int,
                 precision: str, threshold: float, hysteresis: float, device: str) -> None:
        from hft_infer.kernels.common import OUT_COLS

        self.device = torch.device(device)
        spec = model.spec
        self.kind = spec.kind
        self.features = spec.features
        dev = self.device
        self.slots = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.rows = torch.zeros(max_batch, spec.features, dtype=torch.float32, device=dev)
        self.out = torch.zeros(max_batch, OUT_COLS, dtype=torch.float32, device=dev)
        self.held = torch.zeros(n_slots, dtype=torch.int32, device=dev)
        self.thresholds = torch.tensor([threshold, hysteresis], dtype=torch.float32, device=dev)
        mean = model.norm_mean.detach().float()
        inv_std = model.norm_inv_std.detach().float()
        if spec.kind == "mlp":
            from hft_infer.kernels.mlp import MlpParams, alloc_mlp_workspace, mlp_step, prepare_mlp_weights

            params = MlpParams(tuple(m.weight.detach().float() for m in [*model.layers, model.head]),
                               tuple(m.bias.detach().float() for m in [*model.layers, model.head]),
                               mean, inv_std, spec.window)
            self.w = prepare_mlp_weights(params, precision=precision, device=dev)
            self.ws = alloc_mlp_workspace(self.w, max_batch)
            self.ring = torch.zeros(n_slots, ring_depth, spec.features, dtype=torch.float32, device=dev)
            self._step = lambda b: mlp_step(self.w, self.ws, self.ring, self.slots[:b], self.positions[:b],
                                            self.thresholds, self.held, self.out[:b], rows=self.rows[:b])
            self.mode = "window"
            return
        from hft_infer.kernels.lstm import LstmParams, prepare_lstm_weights

        params = LstmParams.from_state_dict(model.lstm.state_dict(), model.head.weight.float(),
                                            model.head.bias.float(), mean, inv_std).to(torch.float32)
        self.w = prepare_lstm_weights(params, precision=precision, device=dev)
        self.mode = mode
        if mode == "stream":
            from hft_infer.kernels.lstm_stream import alloc_stream_state, alloc_stream_workspace, lstm_stream_step

            self.ws = alloc_stream_workspace(self.w, max_batch)
            self.h, self.c = alloc_stream_state(self.w, n_slots)
            self._step = lambda b: lstm_stream_step(self.w, self.ws, self.h, self.c, self.rows[:b], self.slots[:b],
                                                    self.thresholds, self.held, self.out[:b],
                                                    positions=self.positions[:b])
            return
        if window_method != "incremental":
            raise ValueError("the GPU kernels implement the incremental window method; "
                             "model.window_method = \"recompute\" runs on the CPU engine")
        from hft_infer.kernels.lstm_window import alloc_window_state, alloc_window_workspace, lstm_window_step

        self.window = spec.window
        self.ws = alloc_window_workspace(self.w, max_batch, spec.window)
        self.h, self.c = alloc_window_state(self.w, n_slots, spec.window)
        self._step = lambda b: lstm_window_step(self.w, self.ws, self.h, self.c, self.rows[:b], self.slots[:b],
                                                self.positions[:b], self.thresholds, self.held, self.out[:b])

    def launch(self, b: int) -> None:
        self._step(b)

    def reset(self) -> None:
        for name in ("h", "c", "ring"):
            t = getattr(self, name, None)
            if t is not None:
                t.zero_()
        self.held.zero_()

    def reset_slots(self, slots) -> None:
        """Zero these slots' device state, ordered after every step already on the stream."""
        idx = torch.as_tensor(slots, dtype=torch.int64).to(self.device)
        for name in ("h", "c", "ring"):
            t = getattr(self, name, None)
            if t is not None:
                t[idx] = 0
        self.held[idx] = 0


class _GpuEngine(Engine):
    """Shared host side: pinned host arrays and the row staging from the feature store."""

    def __init__(self, kstep: KernelStep, store, buckets: list[int], *, reason: str) -> None:
        self.kstep = kstep
        self.store = store
        super().__init__(buckets, store.sink_slot, stateful=True, reason=reason)
        self.rows_h = _pinned((self.max_batch, kstep.features), torch.float32)
        self._rows_np = self.rows_h.numpy()
        self._ring_rows = store.array.reshape(-1, store.width)  # [slots * depth, F] view of the host ring
        self._depth = store.depth

    def _host_array(self, n: int, dtype) -> np.ndarray:
        return _pinned((n,), {np.int64: torch.int64, np.float32: torch.float32}[dtype]).numpy()

    def _stage(self, b: int) -> None:
        """Copy each entry's row (slot, position) from the host ring into pinned staging."""
        flat = self._slots[0][:b] * self._depth + self._positions[0][:b] % self._depth
        np.take(self._ring_rows, flat, axis=0, out=self._rows_np[:b])


class GraphEngine(_GpuEngine):
    name = "graph"

    def __init__(self, kstep: KernelStep, store, buckets: list[int], *, reason: str,
                 check_addresses: bool = False) -> None:
        super().__init__(kstep, store, buckets, reason=reason)
        self.out_h = _pinned(kstep.out.shape, torch.float32)
        self._out_np = self.out_h.numpy()
        self._slots_t = torch.from_numpy(self._slots[0])
        self._pos_t = torch.from_numpy(self._positions[0])
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._captured = False
        self.check_addresses = check_addresses
        self._addresses = None
        self.stream = torch.cuda.Stream(device=kstep.device)
        # Replays go on the current stream (a graph may be replayed on any stream): no
        # stream context manager per step; an event after the replay tells when it is done.
        self._done_event = torch.cuda.Event()
        self._replay_stream = torch.cuda.current_stream(kstep.device)

    def _body(self, b: int) -> None:
        k = self.kstep
        k.slots[:b].copy_(self._slots_t[:b], non_blocking=True)
        k.positions[:b].copy_(self._pos_t[:b], non_blocking=True)
        k.rows[:b].copy_(self.rows_h[:b], non_blocking=True)
        k.launch(b)
        self.out_h[:b].copy_(k.out[:b], non_blocking=True)

    def _graph_inputs(self) -> tuple[int, ...]:
        k = self.kstep
        return tuple(t.data_ptr() for t in (self._slots_t, self._pos_t, self.rows_h, self.out_h, k.slots,
                                            k.positions, k.rows, k.out))

    def warm_up(self, rounds: int = 3) -> None:
        """Compile and run every bucket eagerly, then capture the graphs (largest first)."""
        with torch.cuda.stream(self.stream):
            for b in self.bucket_map.buckets:
                self._slots[0][:b] = self.sink_slot
                self._positions[0][:b] = 0
                for _ in range(rounds):
                    self._stage(b)
                    self._body(b)
        self.stream.synchronize()
        self.capture()
        self.reset()
        self.ready = True

    def capture(self) -> None:
        if self._captured:
            raise EngineFailure("CUDA graphs are captured once, at start-up; a second capture is a bug")
        pool = torch.cuda.graph_pool_handle()
        for b in sorted(self.bucket_map.buckets, reverse=True):  # largest first: smaller ones reuse its pool
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=self.stream):
                self._body(b)
            self.graphs[b] = g
        self.stream.synchronize()
        self._captured = True
        self._addresses = self._graph_inputs()

    def _launch(self, i: int, n: int) -> None:
        b = self.pad(i, n)
        self._stage(b)
        if self.check_addresses and self._graph_inputs() != self._addresses:
            raise EngineFailure("a CUDA graph input moved since capture")
        self.graphs[b].replay()
        self._done_event.record(self._replay_stream)

    def _done(self, i: int) -> bool:
        return self._done_event.query()

    def _outputs(self, i: int) -> None:
        n = self._n[i]
        out = self._out_np
        self._scores[i][:n] = out[:n, 0]
        self._actions[i][:n] = out[:n, 1]

    def reset_slots(self, slots) -> None:
        self.kstep.reset_slots(slots)

    def reset(self) -> None:
        with torch.cuda.stream(self.stream):
            self.kstep.reset()
        self.stream.synchronize()


class PersistentEngine(_GpuEngine):
    """Window LSTM served by a kernel that never exits (hft_infer.kernels.engine)."""

    name = "persistent"

    def __init__(self, kstep: KernelStep, store, buckets: list[int], *, reason: str, watchdog_ms: int) -> None:
        from hft_infer.kernels.engine import LstmWindowEngine

        if kstep.kind != "lstm" or kstep.mode != "window":
            raise EngineFailure("the persistent engine serves window-mode LSTMs")
        super().__init__(kstep, store, buckets, reason=reason)
        self.watchdog_s = watchdog_ms / 1000.0
        k = kstep
        self.eng = LstmWindowEngine(k.w, k.ws, k.h, k.c, k.thresholds, k.held, max_batch=self.max_batch)
        self._eng_rows = self.eng.rows.numpy()
        self._eng_slots = self.eng.slots.numpy()
        self._eng_pos = self.eng.positions.numpy()
        self._running = False

    def start(self) -> None:
        self.eng.reset_flags()
        self.eng.start()
        self._running = True

    def warm_up(self, rounds: int = 3) -> None:
        """Start the kernel, answer a few requests per bucket (compile, first-touch), then
        restart it on zeroed state: the state is only ever reset while no kernel runs (a
        running kernel could hold stale copies in its multiprocessors' L1)."""
        torch.cuda.synchronize()  # weights, state and workspace are on the device before the kernel spins
        self.start()
        for b in self.bucket_map.buckets:
            for _ in range(rounds):
                slots, positions = self.request()
                slots[:b] = self.sink_slot
                positions[:b] = 0
                self.step(b)
        self.close()
        self.reset()
        self.start()
        self.ready = True

    def _launch(self, i: int, n: int) -> None:
        b = self.pad(i, n)
        slots, positions = self._slots[i], self._positions[i]
        np.take(self._ring_rows, slots[:b] * self._depth + positions[:b] % self._depth, axis=0,
                out=self._eng_rows[:b])
        self._eng_slots[:b] = slots[:b]
        self._eng_pos[:b] = positions[:b]
        self.eng.submit(b)
        self._deadline = time.perf_counter() + self.watchdog_s

    def _done(self, i: int) -> bool:
        if self.eng.done():
            return True
        if time.perf_counter() > self._deadline:
            raise EngineFailure(f"persistent kernel did not answer within {self.watchdog_s * 1000:.0f} ms "
                                "(watchdog): stuck GPU engine")
        return False

    def _outputs(self, i: int) -> None:
        n = self._n[i]
        out = self.eng.out.numpy()
        self._scores[i][:n] = out[:n, 0]
        self._actions[i][:n] = out[:n, 1]

    def reset_slots(self, slots) -> None:
        """The running kernel may hold the state in its multiprocessors' L1: stop it, zero the
        slots, start it again (cold: a Reset on the feed)."""
        self.close()
        idx = torch.as_tensor(slots, dtype=torch.int64).to(self.kstep.device)
        for t in (self.kstep.h, self.kstep.c):
            t[idx] = 0
        self.kstep.held[idx] = 0
        torch.cuda.current_stream(self.kstep.device).synchronize()
        self.start()

    def reset(self) -> None:
        """Zero the model state; only while the kernel is stopped (see warm_up)."""
        if self._running:
            raise EngineFailure("reset of a running persistent engine")
        k = self.kstep
        k.h.zero_()
        k.c.zero_()
        k.held.zero_()
        torch.cuda.current_stream(k.device).synchronize()

    def close(self) -> None:
        if self._running:
            self._running = False
            self.eng.stop()
