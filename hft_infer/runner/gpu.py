"""GPU engines: one-node CUDA graphs per batch bucket, and persistent kernels with no launch at all.

Both take each request's rows from the feature store's pinned host ring (the
ingest wrote them there) and keep the model state (weights, LSTM open-window or stream
state, the decision policy's held positions) on the device, allocated once.

- `GraphEngine`: for each of its two staging buffers (double buffering: the
  loop writes batch k+1 while batch k runs) and each bucket, a CUDA graph of
  one host-to-device copy node (the buffer's slots, positions and the rows
  that `runner/staging.py` gathered from the host ring at submit) and the
  model's kernel (an LSTM's: one launch per phase, cut per batch size by
  `kernels/lstm.py` `phased_geometry`), which reads device memory only and
  writes the decisions into the buffer's pinned outputs. (Kernels reading pinned host memory are
  served ~one PCIe transaction at a time on the H200 host: staging.py says
  what that measured.) A step is one graph launch (`cudaGraphLaunch` through
  ctypes on the engine's stream, kernels/launch.py; torch's `replay()` where
  libcudart or the exec handle is missing) and an event; `poll` queries the
  event. Captured once at start-up, largest bucket first, in one pool;
  capturing again raises.
- `PersistentEngine`: a kernel that never exits serves a request ring
  (kernels/persistent.py): the loop fills a request slot's pinned payload in
  place (slots, positions; `submit` gathers the rows as the graph engine
  does), and the ring's copy graph moves payload then header to the device,
  where the kernel polls; it answers in order into pinned result slots and
  releases a done counter that `poll` reads. Up to `runner.max_inflight`
  requests in flight; a Reset is a request of its own kind, in order with the
  steps. A watchdog (`runner.watchdog_ms`) turns a request that is not
  answered in time into an EngineFailure (fatal: systemd restarts us).

Window models that read the whole window from the ring (the MLP) are
stateless on the device, so their triggers may be conflated as on the CPU;
LSTMs keep per-slot state and see every row in order.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from hft_infer.kernels.common import OUT_COLS
from hft_infer.kernels.launch import GraphLaunchError, graph_launcher
from hft_infer.runner.base import Engine, EngineFailure

__all__ = ["EngineFailure", "GraphEngine", "KernelStep", "PersistentEngine"]


def _pinned(shape, dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype).pin_memory()


class KernelStep:
    """One model's weights, device state and fused step. Its rows come from `ring_h` (the pinned
    host feature ring [n_slots + 1, depth, F]) as the engines stage them (`staged_rows` per
    entry); no kernel reads the ring in place."""

    def __init__(self, model, *, mode: str, window_method: str, ring_h: torch.Tensor, max_batch: int,
                 precision: str, threshold: float, hysteresis: float, device: str) -> None:
        self.device = dev = torch.device(device)
        spec = model.spec
        self.kind, self.features, self.window = spec.kind, spec.features, spec.window
        self.mode = mode if spec.kind == "lstm" else "window"
        self.ring_h = ring_h
        n_slots = ring_h.shape[0]
        self.held = torch.zeros(n_slots, dtype=torch.int32, device=dev)
        self.thresholds = torch.tensor([threshold, hysteresis], dtype=torch.float32, device=dev)
        mean = model.norm_mean.detach().float()
        inv_std = model.norm_inv_std.detach().float()
        self.h = self.c = None
        if spec.kind == "mlp":
            from hft_infer.kernels.mlp import MlpParams, alloc_mlp_workspace, prepare_mlp_weights

            params = MlpParams(tuple(m.weight.detach().float() for m in [*model.layers, model.head]),
                               tuple(m.bias.detach().float() for m in [*model.layers, model.head]),
                               mean, inv_std, spec.window)
            self.w = prepare_mlp_weights(params, precision=precision, device=dev)
            self.ws = alloc_mlp_workspace(self.w, max_batch)
            self.stateful = False
            return
        from hft_infer.kernels.lstm import LstmParams, prepare_lstm_weights

        if mode == "window" and window_method != "incremental":
            raise ValueError("the GPU kernels implement the incremental window method; "
                             "model.window_method = \"recompute\" runs on the CPU engine")
        params = LstmParams.from_state_dict(model.lstm.state_dict(), model.head.weight.float(),
                                            model.head.bias.float(), mean, inv_std).to(torch.float32)
        self._params, self.precision = params, precision
        self.w = prepare_lstm_weights(params, precision=precision, device=dev)  # the persistent kernel's packing
        self.stateful = True

    @property
    def staged_rows(self) -> int:
        """Rows per batch entry the graph engine stages: the MLP reads its whole window, the
        LSTMs only the new row (their state holds the past)."""
        return self.window if self.kind == "mlp" else 1

    def alloc_launched(self, max_batch: int) -> None:
        """Workspace and state for launched steps (the graph engine). An LSTM step is one launch
        per phase (L + 1 graph nodes, no grid barrier: nothing needs its programs resident at once,
        so shards sharing a GPU under MPS cannot starve each other's barriers, and a large batch
        may use more programs than there are SMs), cut per batch size by `phased_geometry`, with
        the weights packed once for each block_h that any batch size up to max_batch uses."""
        if self.kind == "mlp":
            return
        from hft_infer.kernels.lstm import (
            PHASED_MAX_PROGRAMS,
            alloc_lstm_workspace,
            phased_geometry,
            prepare_lstm_weights,
        )

        n_slots = self.ring_h.shape[0]
        self._states = 1 if self.mode == "stream" else self.window
        self._launched = {}
        for b in range(1, max_batch + 1):
            bh = phased_geometry(b * self._states, self.precision, self.w.hidden).block_h
            if bh not in self._launched:
                w = self.w if bh == self.w.block_h else prepare_lstm_weights(
                    self._params, precision=self.precision, device=self.device, block_h=bh)
                self._launched[bh] = (w, alloc_lstm_workspace(w, max_batch, self._states,
                                                              max_programs=PHASED_MAX_PROGRAMS))
        if self.mode == "stream":
            from hft_infer.kernels.lstm_stream import alloc_stream_state

            self.h, self.c = alloc_stream_state(self.w, n_slots)
        else:
            from hft_infer.kernels.lstm_window import alloc_window_state

            self.h, self.c = alloc_window_state(self.w, n_slots, self.window)

    def launch(self, slots: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> None:
        """One launched step (capturable) on device inputs staged by runner/staging.py: slots,
        positions [b], rows [b, staged_rows, F]; decisions into out [b, OUT_COLS] (pinned)."""
        b = slots.shape[0]
        if self.kind == "mlp":
            from hft_infer.kernels.mlp import mlp_step

            mlp_step(self.w, self.ws, rows, slots, positions, self.thresholds, self.held, out, dense=True)
        else:
            from hft_infer.kernels.lstm import phased_geometry
            from hft_infer.kernels.lstm_stream import lstm_stream_step
            from hft_infer.kernels.lstm_window import lstm_window_step

            geo = phased_geometry(b * self._states, self.precision, self.w.hidden)
            w, ws = self._launched[geo.block_h]
            cut = {"persistent": False, "num_warps": geo.num_warps, "block_m": geo.block_m}
            if self.mode == "stream":
                lstm_stream_step(w, ws, self.h, self.c, rows.view(b, -1), slots, self.thresholds, self.held, out,
                                 positions=positions, **cut)
            else:
                lstm_window_step(w, ws, self.h, self.c, rows.view(b, -1), slots, positions, self.thresholds,
                                 self.held, out, **cut)

    def persistent(self, ring, *, max_programs: int | None = None):
        """The persistent kernel of this model behind `ring` (kernels/persistent.py; the ring
        carries `staged_rows` rows per entry)."""
        if self.kind == "mlp":
            from hft_infer.kernels.mlp_persistent import MlpPersistent
            from hft_infer.kernels.persistent import ProgramBudgetError

            # the MLP's program count is fixed when its weights are packed (MlpWeights.ksplit)
            if max_programs is not None and self.w.programs_per_tile > max_programs:
                raise ProgramBudgetError(f"the MLP kernel holds {self.w.programs_per_tile} programs, max_programs "
                                         f"is {max_programs}")
            return MlpPersistent(self.w, ring, self.thresholds, self.held)
        from hft_infer.kernels.lstm_persistent import LstmPersistent, pack_wide

        window = self.mode == "window"
        # window mode: requests of a few windows or more take a wider tiling (kernels/lstm_persistent.py)
        return LstmPersistent(self.w, ring, self.ring_h.shape[0], self.thresholds, self.held,
                              window=self.window if window else None, max_programs=max_programs,
                              wide=pack_wide(self._params, self.w) if window else None)

    def reset(self) -> None:
        for t in (self.h, self.c):
            if t is not None:
                t.zero_()
        self.held.zero_()

    def reset_slots(self, slots) -> None:
        """Zero these slots' device state, ordered after every step already on the stream."""
        idx = torch.as_tensor(np.asarray(slots), dtype=torch.int64).to(self.device)
        for t in (self.h, self.c):
            if t is not None:
                t[idx] = 0
        self.held[idx] = 0


class _GpuEngine(Engine):
    done_at_submit = False

    def _host_array(self, n: int, dtype) -> np.ndarray:
        return _pinned((n,), {np.int64: torch.int64, np.float32: torch.float32}[dtype]).numpy()


class GraphEngine(_GpuEngine):
    name = "graph"

    def __init__(self, kstep: KernelStep, buckets: list[int], *, sink_slot: int, reason: str,
                 check_addresses: bool = False, max_inflight: int = 2) -> None:
        from hft_infer.runner.staging import StepStaging

        self.kstep = kstep
        self.max_inflight = max_inflight
        super().__init__(buckets, sink_slot, stateful=kstep.stateful, reason=reason)
        kstep.alloc_launched(self.max_batch)
        k = self.max_inflight
        self.staging = StepStaging(kstep.ring_h, max_batch=self.max_batch, rows_per_entry=kstep.staged_rows,
                                   n_buffers=k, device=kstep.device)
        self._slots, self._positions = self.staging.slots, self.staging.positions  # the loop writes these
        for a in self._slots:
            a[:] = sink_slot
        self._out = [_pinned((self.max_batch, OUT_COLS), torch.float32) for _ in range(k)]
        self._out_np = [o.numpy() for o in self._out]
        self._events = [torch.cuda.Event() for _ in range(k)]
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._launchers: dict[tuple[int, int], Callable[[], None]] = {}  # graph_launcher of each graph (capture)
        self._captured = False
        self.check_addresses = check_addresses
        self._addresses = None
        self.stream = torch.cuda.Stream(device=kstep.device)
        # Replays go on the current stream (a graph may be replayed on any stream): no stream
        # context manager per step; steps stay ordered on that one stream.
        self._replay_stream = torch.cuda.current_stream(kstep.device)

    def _body(self, i: int, b: int) -> None:
        self.kstep.launch(*self.staging.upload(i, b), self._out[i][:b])

    def _graph_inputs(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in self._out) + self.staging.addresses()

    def warm_up(self, rounds: int = 3) -> None:
        """Compile and run every bucket eagerly, then capture the graphs (largest first)."""
        with torch.cuda.stream(self.stream):
            for i in range(self.max_inflight):
                for b in self.bucket_map.buckets:
                    self._slots[i][:b] = self.sink_slot
                    self._positions[i][:b] = 0
                    self.staging.gather(i, b)
                    for _ in range(rounds):
                        self._body(i, b)
        self.stream.synchronize()
        self.capture()
        self.reset()
        self.ready = True

    def capture(self) -> None:
        if self._captured:
            raise EngineFailure("CUDA graphs are captured once, at start-up; a second capture is a bug")
        pool = torch.cuda.graph_pool_handle()
        for b in sorted(self.bucket_map.buckets, reverse=True):  # largest first: smaller ones reuse its pool
            for i in range(self.max_inflight):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, stream=self.stream):
                    self._body(i, b)
                self.graphs[(i, b)] = g
        self.stream.synchronize()
        self._captured = True
        self._addresses = self._graph_inputs()
        self._launchers = {key: graph_launcher(g, self._replay_stream) for key, g in self.graphs.items()}

    def _launch(self, i: int, n: int) -> None:
        b = self.pad(i, n)
        self.staging.gather(i, b)
        if self.check_addresses and self._graph_inputs() != self._addresses:
            raise EngineFailure("a CUDA graph input moved since capture")
        try:
            self._launchers[(i, b)]()  # the graph, replayed on _replay_stream (kernels/launch.py)
        except GraphLaunchError as e:
            raise EngineFailure(f"graph engine: {e}") from None
        self._events[i].record(self._replay_stream)

    def _done(self, i: int) -> bool:
        return self._events[i].query()

    def _outputs(self, i: int) -> None:
        n = self._n[i]
        out = self._out_np[i]
        self._scores[i][:n] = out[:n, 0]
        self._actions[i][:n] = out[:n, 1]

    def reset(self) -> None:
        self.kstep.reset()
        torch.cuda.current_stream(self.kstep.device).synchronize()

    def reset_slots(self, slots) -> None:
        self.kstep.reset_slots(slots)


class PersistentEngine(_GpuEngine):
    """Every model family served by a persistent kernel behind a request ring."""

    name = "persistent"
    transport = "dma"  # the request ring's (kernels/persistent.py); tools/diag_ring_order.py varies it

    def __init__(self, kstep: KernelStep, *, max_batch: int, sink_slot: int, reason: str, watchdog_ms: int,
                 max_inflight: int = 4, max_programs: int | None = None) -> None:
        from hft_infer.kernels.persistent import ProgramBudgetError, persistent_supported
        from hft_infer.runner.staging import RowGather

        ok, why = persistent_supported(kstep.device)
        if not ok:
            raise EngineFailure(f"persistent engine refused: {why}")
        self.kstep = kstep
        self.ring = self.request_ring(kstep, max_batch=max_batch, max_inflight=max_inflight,
                                      transport=self.transport)
        self.max_inflight = self.ring.n_requests  # buffers = ring slots; can_submit keeps one free
        # any batch size is served as is: no bucket padding
        super().__init__(list(range(1, self.ring.max_batch + 1)), sink_slot, stateful=kstep.stateful,
                         reason=reason)
        k = self.max_inflight
        views = [self.ring.request_views(i) for i in range(k)]
        self._slots = [v[0] for v in views]  # the loop writes the requests in place
        self._positions = [v[1] for v in views]
        self._rows = [self.ring.rows(i) for i in range(k)]
        self._gather = RowGather(kstep.ring_h, max_batch=max_batch, rows_per_entry=kstep.staged_rows)
        self.watchdog_ns = watchdog_ms * 1_000_000
        self._seq = [0] * k
        self._submitted_ns = [0] * k
        try:
            self.kernel = kstep.persistent(self.ring, max_programs=max_programs)
        except ProgramBudgetError as e:
            raise EngineFailure(f"persistent engine refused: {e} (runner.persistent_programs; by default the GPU's "
                                f"SMs / universe.shard_count, so that every shard's kernel is resident at once)") \
                from None

    @staticmethod
    def request_ring(kstep: KernelStep, *, max_batch: int, max_inflight: int, transport: str = "dma"):
        """The engine's request ring for `kstep` (also built without a GPU by
        tools/check_persistent_asm.py, to compile the kernel the engine would launch)."""
        from hft_infer.kernels.persistent import RequestRing

        # one ring slot more than requests in flight (the ring's rule: kernels/persistent.py)
        return RequestRing(max_batch, rows_per_entry=kstep.staged_rows, width=kstep.features,
                           n_requests=max(2, max_inflight) + 1, device=kstep.device, transport=transport)

    @property
    def can_submit(self) -> bool:
        return self.in_flight < self.ring.max_in_flight

    def start(self) -> None:
        self.kernel.start()

    def warm_up(self, rounds: int = 3) -> None:
        """Compile, start, answer a few requests of several sizes (first touch), then restart on
        zeroed state: the state is only reset while no kernel runs."""
        torch.cuda.synchronize()  # weights and state are on the device before the kernel spins
        self.kernel.precompile()
        self.kernel.start()
        for b in sorted({1, 2, self.ring.max_batch // 2 or 1, self.ring.max_batch}):
            for _ in range(rounds):
                slots, positions = self.request()
                slots[:b] = self.sink_slot
                positions[:b] = 0
                self.step(b)
        self.reset()
        self.ready = True

    def _launch(self, i: int, n: int) -> None:
        if self.ring.next_slot != i or not self.can_submit:  # cold: the ring and the loop disagree
            raise EngineFailure(f"request ring at slot {self.ring.next_slot} with {self.ring.in_flight} in "
                                f"flight, engine at {i}")
        self._gather.gather(self._slots[i][:n], self._positions[i][:n], self._rows[i][:n])
        try:
            self._seq[i] = self.ring.submit(n)
        except GraphLaunchError as e:  # the request's copy graph did not launch
            raise EngineFailure(f"persistent engine: {e}") from None
        self._submitted_ns[i] = time.perf_counter_ns()

    def _done(self, i: int) -> bool:
        if self.ring.done(self._seq[i]):
            return True
        if time.perf_counter_ns() - self._submitted_ns[i] > self.watchdog_ns:
            raise EngineFailure(f"persistent kernel did not answer request {self._seq[i]} within "
                                f"{self.watchdog_ns / 1e6:.0f} ms (watchdog): stuck GPU engine")
        return False

    def _outputs(self, i: int) -> None:
        n = self._n[i]
        out = self.ring.outputs(i)
        self._scores[i][:n] = out[:n, 0]
        self._actions[i][:n] = out[:n, 1]

    def reset(self) -> None:
        """Zero the model state (cold: nothing in flight). The state is only written while no
        kernel runs, so a running kernel is stopped, the state zeroed and the kernel started
        again on an empty ring."""
        if self.in_flight:
            raise EngineFailure("reset of the persistent engine with steps in flight")
        running = self.kernel.running
        if running:
            self.kernel.stop()
        self.kernel.reset_state()
        if running:
            self._head = 0  # start() clears the ring: the next request is ring slot 0
            self.kernel.start()

    def reset_slots(self, slots) -> None:
        """A reset request, served in order with the steps (the loop has collected them all)."""
        from hft_infer.kernels.persistent import KIND_RESET

        slots = list(slots)
        if self.in_flight:
            raise EngineFailure("reset_slots of the persistent engine with steps in flight")
        for start in range(0, len(slots), self.ring.max_batch):
            chunk = slots[start:start + self.ring.max_batch]
            k = self.ring.next_slot
            self._slots[k][: len(chunk)] = chunk
            seq = self.ring.submit(len(chunk), KIND_RESET)
            self.ring.wait(seq, self.watchdog_ns / 1e9)
            self._head = (self._head + 1) % self.max_inflight  # the reset used ring slot k

    def close(self) -> None:
        if self.kernel.running:
            self.kernel.stop()
