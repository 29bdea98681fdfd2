"""`build_executor`: the CPU executor for a model, mode and window method (executor.py has the contract).

| model / mode | numpy (default, what the eager engine runs) | torch (the previous path) |
| --- | --- | --- |
| mlp, window | `MlpNumpyExecutor` | `MlpCachedExecutor` |
| lstm, window, incremental | `LstmIncrementalNumpyExecutor` | `LstmIncrementalExecutor` |
| lstm, window, recompute | `LstmRecomputeExecutor` (nn.LSTM: oneDNN's fused kernel) | same |
| lstm, stream | `LstmStreamNumpyExecutor` | `LstmStreamExecutor` |

`MlpWindowExecutor` (torch, every window's rows transformed at every step)
is the MLP reference; tests build it directly.
"""

from __future__ import annotations

from hft_infer.models.base import WindowModel
from hft_infer.models.cached import MlpCachedExecutor
from hft_infer.models.executor import Executor
from hft_infer.models.incremental import LstmIncrementalExecutor
from hft_infer.models.numpy_lstm import LstmIncrementalNumpyExecutor, LstmStreamNumpyExecutor
from hft_infer.models.numpy_mlp import MlpNumpyExecutor
from hft_infer.models.products import PRECISIONS, PRODUCT_BACKENDS, PlannedProducts
from hft_infer.models.torch_executors import LstmRecomputeExecutor, LstmStreamExecutor

MODES = ("window", "stream")
WINDOW_METHODS = ("incremental", "recompute")
BACKENDS = ("numpy", "torch")

_EXECUTORS = {
    ("mlp", "window", "numpy"): MlpNumpyExecutor,
    ("mlp", "window", "torch"): MlpCachedExecutor,
    ("lstm", "incremental", "numpy"): LstmIncrementalNumpyExecutor,
    ("lstm", "incremental", "torch"): LstmIncrementalExecutor,
    ("lstm", "recompute", "numpy"): LstmRecomputeExecutor,
    ("lstm", "recompute", "torch"): LstmRecomputeExecutor,
    ("lstm", "stream", "numpy"): LstmStreamNumpyExecutor,
    ("lstm", "stream", "torch"): LstmStreamExecutor,
}


def build_executor(model: WindowModel, ring, *, max_batch: int, mode: str = "window",
                   window_method: str = "incremental", backend: str = "numpy", products: str = "auto",
                   precision: str = "fp32") -> Executor:
    """The CPU executor for a model and mode. MLPs are window models (mode 'window' only;
    `window_method` does not apply to them). `ring`: the feature store's float32
    [n_slots, R, F] ring, a torch tensor or a numpy array. `products` (numpy executors):
    "auto", "numpy" or "torch", the batched matrix products' backend; `precision` (numpy
    executors): "fp32", or "bf16" for the weight products of a batch (products.py). Other
    executors run fp32 whatever `precision` says: `applies_precision` tells them apart."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if window_method not in WINDOW_METHODS:
        raise ValueError(f"window_method must be one of {WINDOW_METHODS}, got {window_method!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    kind = model.spec.kind
    if kind == "mlp":
        if mode != "window":
            raise ValueError(f"model {model.spec.name} is an mlp: mode 'stream' needs an lstm model")
        key = ("mlp", "window", backend)
    else:
        key = ("lstm", "stream" if mode == "stream" else window_method, backend)
    if products not in PRODUCT_BACKENDS:
        raise ValueError(f"products must be one of {PRODUCT_BACKENDS}, got {products!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} on the CPU, got {precision!r}")
    cls = _EXECUTORS[key]
    if issubclass(cls, PlannedProducts):
        return cls(model, ring, max_batch, products=products, precision=precision)
    return cls(model, ring, max_batch)


def applies_precision(executor: Executor) -> bool:
    """Whether `executor` honours build_executor's `precision` (the numpy executors)."""
    return isinstance(executor, PlannedProducts)
