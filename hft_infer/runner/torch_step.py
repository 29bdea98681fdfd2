"""The graph engine's step for a custom torch module (model.module, models/custom.py).

`TorchStep` has the interface `runner.gpu.GraphEngine` drives (`launch`,
`alloc_launched`, `staged_rows`, `reset`, `reset_slots`, `stateful`, `device`, `ring_h`), so a
custom module is served exactly as the built-in families are: one CUDA graph per
(staging buffer, batch bucket), captured at start-up, largest bucket first, in
one pool, double-buffered, self-checked against the CPU engine. A step is:

1. the engine's staging (runner/staging.py): each trigger's window [b, W, F],
   gathered from the host feature ring at submit (rows before an instrument's
   first are zero), its slots and positions, in one host-to-device copy node;
2. the row transform (`model.input`: the built-in feature row or the raw row),
   the user's module, the score and the decision policy with per-slot held
   positions on the device (`kernels.common.decide_reference`, plain torch ops);
3. the [b, OUT_COLS] result copied into the engine's pinned output.

Everything but the module's own intermediates is allocated once; those are
allocated during capture from the graph's private pool, so a replay allocates
nothing. The module must be capturable (no host syncs, no data-dependent
shapes, no CPU tensors in its forward): a module that is not fails capture,
and `engine = "auto"` then falls back to eager with the reason.
`runner.precision`: fp32, or tf32 (TF32 matmul and cuDNN convolutions for the
whole process); bf16 is the fused kernels' and is refused here.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from hft_infer.kernels.common import OUT_COLS


class TorchStep:
    stateful = False  # the window is read from the ring at every step: triggers may be conflated

    def __init__(self, model, *, ring_h: torch.Tensor, max_batch: int, precision: str, threshold: float,
                 hysteresis: float, device: str) -> None:
        if precision not in ("fp32", "tf32"):
            raise ValueError(f"runner.precision = {precision!r} applies to the fused kernels; a custom module "
                             "runs in its own dtype (fp32, or tf32 products)")
        self.device = dev = torch.device(device)
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        spec = model.spec
        self.model = copy.deepcopy(model).to(dev)  # the CPU engine of the self-check keeps the original
        self.kind, self.features, self.window = spec.kind, spec.features, spec.window
        self.mode = "window"
        self.ring_h = ring_h
        n_slots = ring_h.shape[0]
        self.held = torch.zeros(n_slots, dtype=torch.int32, device=dev)
        self.thresholds = torch.tensor([threshold, hysteresis], dtype=torch.float32, device=dev)
        self.staged_rows = spec.window  # the graph engine stages each trigger's whole window
        self.out_d = torch.zeros(max_batch, OUT_COLS, dtype=torch.float32, device=dev)

    def alloc_launched(self, max_batch: int) -> None:
        """Nothing beyond __init__'s buffers (the graph engine's hook for workspaces)."""

    def launch(self, slots: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> None:
        """One step (capturable) on the staged device slots, positions [b] and windows [b, W, F]
        into pinned out [b, OUT_COLS]."""
        from hft_infer.kernels.common import decide_reference

        b = slots.shape[0]
        with torch.no_grad():
            logits = self.model.logits(self.model.features(rows)).float()
            decide_reference(logits, self.thresholds, self.held, slots, self.out_d[:b])
        out.copy_(self.out_d[:b], non_blocking=True)

    def reset(self) -> None:
        self.held.zero_()

    def reset_slots(self, slots) -> None:
        """Zero these slots' held positions, ordered after every step already on the stream."""
        self.held[torch.as_tensor(np.asarray(slots), dtype=torch.int64).to(self.device)] = 0
