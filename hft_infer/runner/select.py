"""Build the model, feature store and engine for a config, and say why this engine.

`engine = "auto"` takes the graph engine where CUDA works, else eager. A
custom `model.module` runs on the torch step (models/custom.py on the CPU,
runner/torch_step.py in CUDA graphs on a GPU); the fused kernels serve the
built-in families. The persistent engine runs only when configured: it is right since 08b885d, slower
than the graph engine for the MLP and at batch 64, faster for the LSTMs' requests of one or two windows
since waves 42-44 (BENCHMARKS.md: one end-to-end run at 10k events/s, not yet enough for a default).
Every GPU engine is checked against the CPU
engine before it serves (runner.self_check, runner/self_check.py), and `auto` refuses one that is right but
more than SPEED_MARGIN times slower than the CPU engine on that stream (measured on the H200 host: the graph
engine's lstm_a step took ~14.6 ms at 916d9c4). What was chosen and why is returned as
`Runtime.engine.reason` and printed in serve's start-up line.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

from hft_infer.config import Config, ConfigError
from hft_infer.features import FeatureStore


@dataclass
class Runtime:
    model: object
    model_version: str
    store: FeatureStore
    engine: object
    sequential: bool  # scheduler discipline: every event in order (else conflation)
    conflate: bool
    inflight_rows: int  # events the loop may ingest while a step is in flight, for an engine that reads the ring then


# The fewest rows a slot's ring holds: the per-frame ingest handles a burst in chunks of at most
# the ring's depth (ingest.py: no slot's ring may wrap within one), and a chunk's cost is partly
# fixed. Single-event frames over 64 instruments, bursts of 256 (dev VM, 2026-12-05, chunks
# forced): a conflating model's ingest costs 2.45 / 2.21 / 1.99 / 1.85 / 1.82 µs an event in
# chunks of 32 / 64 / 128 / 256 / 544 rows, a sequential one's 2.40 / 2.38 / 2.30 / 2.31 / 2.31.
RING_DEPTH_MIN = 256


def rows_read(model, cfg: Config) -> int:
    """Rows of a slot's ring one step reads for one request: its own row for an LSTM that keeps
    its state (stream, or the incremental window: the state holds the past; the executors'
    `ring_rows` and the GPU engines' `staged_rows` are 1), else the model's window."""
    return 1 if is_stateful(model, cfg) else model.spec.window


def ring_depth(cfg: Config, rows_per_step: int, sequential: bool) -> tuple[int, int]:
    """(feature ring depth, in-flight ingest allowance). A slot's ring must hold every row a
    request still to be stepped may read: the rows a step reads behind the newest request
    (rows_read: 1 or the window) and the rows queued behind it (sequential: up to
    max_pending_per_instrument). An engine that reads the ring while the loop ingests
    (WorkerEngine.reads_ring_in_flight: runner.cpu_worker, whose step runs on a worker thread)
    also needs room for what the loop ingests meanwhile, which the loop caps at the allowance
    (two bursts, stepper.py); the GPU engines and the inline CPU engine copy a step's rows out at
    submit (runner/staging.py), so for them the allowance takes no rows. The ring is built before
    the engine is chosen, so with runner.cpu_worker it keeps the allowance even where a GPU engine
    serves (service.py wraps only the CPU engine): room to spare, never too little. At least
    RING_DEPTH_MIN rows.
    Why it matters: the ring is n_slots x depth x 168 bytes (10 levels), pinned on a GPU host; with
    the allowance in every ring the default config held 544 rows a slot, 914 MB for 10,000
    instruments, where 256 hold 430 MB."""
    allowance = 2 * cfg.ingest.max_drain
    queued = cfg.scheduler.max_pending_per_instrument if sequential else 0
    in_flight = allowance if cfg.runner.cpu_worker else 0
    return max(rows_per_step + queued + in_flight, RING_DEPTH_MIN), allowance


def is_custom(model) -> bool:
    """A user's module (model.module, models/custom.py): served by the torch step, not the fused kernels."""
    return model.spec.kind == "custom"


def is_stateful(model, cfg: Config) -> bool:
    """Models whose per-instrument state needs every row, in order."""
    return model.spec.kind == "lstm" and (cfg.model.mode == "stream" or cfg.model.window_method == "incremental")


def conflates(model, cfg: Config) -> bool:
    """Whether the service conflates this model's triggers (else it schedules every event in
    order: the sequential discipline, scheduler.py); `scheduler.conflate = "on"` on a stateful
    model is refused by build_runtime."""
    mode = cfg.scheduler.conflate
    return (not is_stateful(model, cfg)) if mode == "auto" else (mode == "on")


def resolve_device(cfg: Config) -> str:
    import torch

    dev = cfg.runner.device
    if dev == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"runner.device = {dev!r} but CUDA is not available here")
    return "cuda:0" if dev == "cuda" else dev


def build_runtime(cfg: Config, n_slots: int) -> Runtime:
    from hft_infer.models.custom import load_configured

    try:
        model, version = load_configured(cfg.model)
    except ValueError as e:  # CheckpointError, CustomModelError: one line naming the file or module
        raise ConfigError(f"model: {e}") from None
    stateful = is_stateful(model, cfg)
    mode = cfg.scheduler.conflate
    if mode == "on" and stateful:
        raise ConfigError("scheduler.conflate = \"on\" needs a model that reads its window from the ring "
                          "(mlp, or lstm with model.window_method = \"recompute\"); this model keeps "
                          "per-instrument state and must see every row")
    conflate = conflates(model, cfg)
    sequential = not conflate
    depth, allowance = ring_depth(cfg, rows_read(model, cfg), sequential)
    device = resolve_device(cfg)
    engine_name = cfg.runner.engine
    if device == "cpu":
        if engine_name in ("graph", "persistent"):
            raise ConfigError(f"runner.engine = {engine_name!r} needs a CUDA device; this machine runs on cpu "
                              "(use engine = \"auto\" or \"eager\")")
        reason = "cpu device: eager numpy path"
        if is_custom(model):
            reason = ("cpu device: eager torch path for the custom module (the numpy and fused paths serve "
                      "only the built-in mlp/lstm families)")
        if engine_name == "eager":
            reason = "configured eager"
        return _eager(cfg, model, version, n_slots, depth, sequential, conflate, reason, allowance)
    return _gpu(cfg, model, version, n_slots, depth, device, allowance, sequential, conflate)


def _gpu(cfg: Config, model, version: str, n_slots: int, depth: int, device: str, allowance: int,
         sequential: bool, conflate: bool) -> Runtime:
    """Engine `auto`: graph where it works, else eager on the CPU. Each candidate is built,
    warmed up and self-checked here, so a failure falls through to the next. The GPU
    engines take rows from the pinned host feature ring (the graph engine gathers them into
    its staging at submit): the MLP, which reads its whole window at each step, is stateless
    on the device and may conflate as on the CPU."""
    from hft_infer.runner.base import EngineFailure
    from hft_infer.runner.gpu import GraphEngine, KernelStep, PersistentEngine
    from hft_infer.runner.self_check import too_slow

    store = FeatureStore(n_slots, model.spec.levels, depth, pin_memory=True)
    wanted = cfg.runner.engine
    custom = is_custom(model)
    if custom and wanted == "persistent":
        raise ConfigError("runner.engine = \"persistent\" runs the fused kernels of the built-in mlp/lstm "
                          "families; a custom model.module runs on \"graph\" (or \"auto\") or \"eager\"")
    # auto leaves the persistent engine out: slower than graph for the MLP and at batch 64, ahead for the
    # LSTMs' small requests only since wave 44 (BENCHMARKS.md); `engine = "persistent"` runs it, self-checked
    order = ["graph", "eager"] if wanted == "auto" else [wanted]
    refused: list[str] = []
    r = cfg.runner
    for name in order:
        if name == "eager":
            reason = "; ".join(refused) or "configured eager"
            return _eager(cfg, model, version, n_slots, depth, sequential, conflate,
                          f"eager on the CPU ({reason})", allowance, store=store)
        kstep = engine = None
        try:
            if custom:
                from hft_infer.runner.torch_step import TorchStep

                kstep = TorchStep(model, ring_h=store.tensor, max_batch=r.max_bucket, precision=r.precision,
                                  threshold=cfg.decision.threshold, hysteresis=cfg.decision.hysteresis,
                                  device=device)
            else:
                kstep = KernelStep(model, mode=cfg.model.mode, window_method=cfg.model.window_method,
                                   ring_h=store.tensor, max_batch=r.max_bucket, precision=r.precision,
                                   threshold=cfg.decision.threshold, hysteresis=cfg.decision.hysteresis,
                                   device=device)
            works = (f"{name} works here: the custom module in one CUDA graph per bucket (the fused kernels "
                     f"serve only the built-in families)" if custom else f"{name} works here")
            why = "; ".join(refused + [works]) if wanted == "auto" else f"configured {name}"
            if name == "persistent":
                import torch

                sms = torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
                engine = PersistentEngine(kstep, max_batch=r.max_bucket, sink_slot=store.sink_slot, reason=why,
                                          watchdog_ms=r.watchdog_ms, max_inflight=max(2, r.max_inflight),
                                          max_programs=persistent_program_budget(cfg, sms))
            else:
                engine = GraphEngine(kstep, list(r.buckets), sink_slot=store.sink_slot, reason=why,
                                     check_addresses=r.check_graph_addresses, max_inflight=r.max_inflight)
            engine.precision = r.precision
            engine.warm_up()
            if r.self_check:
                engine_s, cpu_s = _self_check(cfg, model, version, n_slots, depth, sequential, conflate,
                                              allowance, engine, store)
                slow = too_slow(name, engine_s, cpu_s)
                if slow and wanted == "auto":
                    raise EngineFailure(slow)
                engine.reason += (f"; self-check stream {engine_s * 1e3:.2f} ms here, {cpu_s * 1e3:.2f} ms on "
                                  f"the CPU engine" + (f" (WARNING: {slow})" if slow else ""))
            engine.reason += shared_gpu_warning(cfg)
            return Runtime(model, version, store, engine, sequential, conflate, allowance)
        except Exception as e:  # noqa: BLE001 - any failure of a candidate engine means: try the next
            if engine is not None:
                engine.close()  # a persistent kernel left spinning would hold its SMs
            if wanted != "auto":
                raise ConfigError(f"runner.engine = {name!r} failed on {device}: {type(e).__name__}: {e}") from None
            refused.append(f"{name} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    raise AssertionError("unreachable: eager is the last candidate")


def shared_gpu_warning(cfg: Config, environ=os.environ) -> str:
    """A note for the engine's reason when this is one of several shards on a GPU and no MPS daemon
    is in sight: the shards' CUDA contexts would then time-slice the GPU (BENCHMARKS.md, wave 7:
    lstm_a 48 % of 4x at 4 shards without MPS, 99 % with). Seen: $CUDA_MPS_PIPE_DIRECTORY, or the
    driver's default control pipe /tmp/nvidia-mps/control (a system-wide daemon)."""
    if cfg.universe.shard_count <= 1:
        return ""
    if environ.get("CUDA_MPS_PIPE_DIRECTORY") or os.path.exists("/tmp/nvidia-mps/control"):
        return "; CUDA MPS daemon found (shards' kernels run side by side)"
    return (f"; WARNING: shard of {cfg.universe.shard_count} with no CUDA MPS daemon in sight: shards on one GPU "
            f"time-slice it (README, Scale out: run them under MPS)")


def persistent_program_budget(cfg: Config, sms: int) -> int:
    """Most programs one persistent kernel may hold on a GPU of `sms` SMs: runner.persistent_programs,
    or (0) an equal share of the SMs per shard. A persistent kernel spins for the service's life and
    meets at grid barriers, so all its programs must be resident at once; N shards on one GPU (under
    MPS: their kernels run side by side) fit together only if each takes at most SMs / N."""
    if cfg.runner.persistent_programs:
        return cfg.runner.persistent_programs
    return max(1, sms // cfg.universe.shard_count)


def _self_check(cfg: Config, model, version: str, n_slots: int, depth: int, sequential: bool, conflate: bool,
                allowance: int, engine, store: FeatureStore) -> tuple[float, float]:
    """runner.self_check: the warmed-up engine against the CPU engine on a fixed stream
    (runner/self_check.py); raises EngineFailure when they disagree, else times the stream
    through both and leaves the engine's state and the rows zeroed. (engine s, CPU s)."""
    from hft_infer.runner.self_check import compare, time_stream

    with _fp32_reference(cfg, model, version, n_slots, depth, sequential, conflate, allowance) as ref:
        compare(engine, store, ref.engine, ref.store, n_slots=n_slots, precision=cfg.runner.precision)
        timing = time_stream(engine, store, ref.engine, ref.store, n_slots=n_slots)
    engine.reset()
    return timing


@contextmanager
def _fp32_reference(cfg: Config, model, version: str, n_slots: int, depth: int, sequential: bool,
                    conflate: bool, allowance: int):
    """The start-up checks' reference (`_self_check`, `_check_cpu_bf16`): the CPU engine in fp32 on a
    store of its own, closed on the way out."""
    ref = _eager(cfg, model, version, n_slots, depth, sequential, conflate, "self-check reference", allowance,
                 precision="fp32")
    try:
        yield ref
    finally:
        ref.engine.close()


def cpu_precision(cfg: Config) -> str:
    """The CPU engine's product precision for runner.precision: bf16 as configured; tf32 (a GPU
    tensor-core format) and fp32 run fp32."""
    return "bf16" if cfg.runner.precision == "bf16" else "fp32"


def _eager(cfg: Config, model, version: str, n_slots: int, depth: int, sequential: bool, conflate: bool,
           reason: str, allowance: int, store: FeatureStore | None = None, *,
           precision: str | None = None) -> Runtime:
    """The CPU engine. `precision`: its products' ("fp32" or "bf16"; default cpu_precision(cfg)).
    A bf16 engine is checked against an fp32 one at start-up (runner.self_check)."""
    from hft_infer.models.build import applies_precision, build_executor
    from hft_infer.models.decision import DecisionPolicy
    from hft_infer.runner.eager import EagerEngine

    precision = cpu_precision(cfg) if precision is None else precision
    store = store or FeatureStore(n_slots, model.spec.levels, depth)
    max_bucket = cfg.runner.max_bucket
    if is_custom(model):
        from hft_infer.models.custom import CustomExecutor

        executor = CustomExecutor(model, store.tensor, max_bucket)
    else:
        executor = build_executor(model, store.tensor, max_batch=max_bucket, mode=cfg.model.mode,
                                  window_method=cfg.model.window_method, products=cfg.runner.cpu_products,
                                  precision=precision)
    policy = DecisionPolicy(cfg.decision.threshold, cfg.decision.hysteresis, n_slots + 1, max_bucket)
    reason = f"{reason}; {type(executor).__name__}"  # which executor runs the step (models/build.py)
    bf16 = precision == "bf16" and applies_precision(executor)
    if precision == "bf16" and not bf16:
        reason += f"; runner.precision bf16 does not apply to {type(executor).__name__} (fp32 products)"
    elif cfg.runner.precision == "tf32":
        reason += "; runner.precision tf32 is a GPU tensor-core format: the CPU engine's products run fp32"
    engine = EagerEngine(executor, policy, list(cfg.runner.buckets), store.sink_slot, reason=reason,
                         threads=cfg.runner.torch_threads)
    engine.precision = "bf16" if bf16 else "fp32"
    if bf16:
        engine.reason += _bf16_hardware_note()
    runtime = Runtime(model, version, store, engine, sequential, conflate, allowance)
    if bf16 and cfg.runner.self_check:
        _check_cpu_bf16(cfg, runtime, n_slots, depth)
    return runtime


def _check_cpu_bf16(cfg: Config, runtime: Runtime, n_slots: int, depth: int) -> None:
    """runner.self_check for the CPU engine's bf16 products: the self-check stream through it and
    through the same engine in fp32 (runner/self_check.py); their scores must agree within the bf16
    tolerance for this model's weights, else the config is refused with the figures. Leaves the
    engine's state and rows zeroed; its reason says the largest difference."""
    from hft_infer.runner.base import EngineFailure
    from hft_infer.runner.self_check import TOLERANCE, compare

    engine = runtime.engine
    with _fp32_reference(cfg, runtime.model, runtime.model_version, n_slots, depth, runtime.sequential,
                         runtime.conflate, runtime.inflight_rows) as ref:
        try:
            worst = compare(engine, runtime.store, ref.engine, ref.store, n_slots=n_slots, precision="bf16")
        except EngineFailure as e:
            raise ConfigError(f"runner.precision = \"bf16\" on the CPU engine: {e}; run this model in fp32 "
                              "(runner.precision = \"fp32\") or set runner.self_check = false to serve it anyway"
                              ) from None
    engine.reset()
    engine.reason += (f"; bf16 self-check against fp32: largest score difference {worst:.2g} "
                      f"(tolerance {TOLERANCE['bf16']:g})")


def _bf16_hardware_note(cpuinfo: str | None = None) -> str:
    """What the engine's reason says about the CPU's bf16 support (products.bf16_hardware)."""
    from hft_infer.models.products import bf16_hardware

    flags = bf16_hardware(cpuinfo)
    if flags is None:
        return "; bf16 hardware unknown (no CPU flags in /proc/cpuinfo)"
    if flags:
        return f"; bf16 hardware: {', '.join(flags)}"
    return ("; WARNING: this CPU has neither AMX nor AVX512-BF16: its bf16 products are converted in "
            "software (cpu_products = auto keeps fp32 wherever that is slower; a forced backend does not)")
