"""Typed, frozen configuration.

One msgspec Struct per component, `forbid_unknown_fields` so a misspelled key
fails at start, constrained types, units in field names. `load_config`
parses TOML with the standard library (for line numbers on syntax errors),
applies `--set section.key=value` overrides, then converts with msgspec, which
names the offending field's path. Every user error surfaces as `ConfigError`
with a one-line message; the CLI prints it and exits 2.

Endpoints may contain `{runtime_dir}` (see `runtime_dir()`) and `{name}`
(service.name), so that shard instances and parallel test runs get their own
ipc sockets.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import tomli_w
from msgspec import Meta

from hft_infer.config_errors import Overrides, config_error, msgspec_problem, struct_problem
from hft_infer.errors import ConfigError
from hft_infer.sharding import shard_of_positions

__all__ = ["Config", "ConfigError", "load_config", "expand_endpoint", "expand_shm_service", "runtime_dir"]

PosInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ServiceConfig(_Section):
    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] = "hft-infer"
    """Instance name: used in `{name}` endpoint templates, logs and the systemd unit."""
    run_dir: str = ""
    """Where `serve` writes its summary JSON and histograms; empty = ./runs/<name>-<time>."""
    drain_timeout_ms: PosInt = 2000
    """On SIGTERM: how long to keep stepping pending requests before giving up."""
    watchdog_s: NonNegInt = 10
    """systemd WatchdogSec of generated units: a hot loop that sends no WATCHDOG=1 for this long is killed and restarted (0 = off)."""
    start_timeout_s: PosInt = 300
    """systemd TimeoutStartSec of generated units: warm-up, graph capture and a cold Triton compile must reach READY=1 within this."""


def _check_shm_service(template: str) -> None:
    if "{" in template.replace("{name}", "") or "}" in template.replace("{name}", ""):
        raise ValueError(f"`shm_service` {template!r}: the only placeholder is {{name}}")


class IngestConfig(_Section):
    transport: Literal["zmq", "iceoryx2"] = "zmq"
    """zmq: the ZeroMQ socket at `endpoint`; iceoryx2: the shared-memory service `shm_service` on this host (the `shm` extra; no topic frames, so `topic_frame` and the socket keys do not apply)."""
    endpoint: str = "ipc://{runtime_dir}/{name}-md.sock"
    """Market-data endpoint (ipc://, tcp://127.0.0.1:PORT; others need security.allow_remote)."""
    shm_service: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.{}/-]{1,200}$")] = "hft-infer/{name}/md"
    """iceoryx2 publish-subscribe service of the feed (`{name}` = service.name, so shard instances get their own)."""
    shm_buffer: Annotated[int, Meta(ge=1, le=65536)] = 4096
    """iceoryx2: frames the service's subscriber buffers; a feed publisher meeting a full buffer waits (replay) or drops and counts the frame (FeedPublisher)."""
    socket_type: Literal["sub", "pull"] = "sub"
    """sub: topic-filtered subscriber to a PUB feed; pull: fan-in from PUSH publishers."""
    bind: bool = False
    """False: connect to the feed's PUB/PUSH (usual). True: bind and let publishers connect."""
    topic_frame: bool = True
    """Messages are preceded by a 4-byte big-endian instrument-id topic frame."""
    rcv_hwm: NonNegInt = 100_000
    """ZMQ_RCVHWM in messages (0 = unlimited)."""
    max_frame_bytes: Annotated[int, Meta(ge=64, le=1 << 20)] = 4096
    """Frames larger than this are rejected as OVERSIZED before decoding."""
    max_batch_frame_bytes: Annotated[int, Meta(ge=64, le=1 << 24)] = 65536
    """EventBatch frames (many events in one frame) may be up to this large (but not above max_msg_size_bytes over ZeroMQ, nor below max_frame_bytes); any other frame is bound by max_frame_bytes."""
    max_msg_size_bytes: Annotated[int, Meta(ge=-1)] = 65536
    """ZMQ_MAXMSGSIZE: libzmq disconnects a peer that sends a larger message (-1 = off)."""
    max_levels: Annotated[int, Meta(ge=1, le=256)] = 64
    """Largest n_levels accepted on the wire (the model uses its own first levels)."""
    poll_mode: Literal["busy", "hybrid", "event"] = "hybrid"
    """busy: spin on the socket; hybrid: spin for spin_budget_us then wait on the FD; event: FD only."""
    spin_budget_us: NonNegInt = 200
    """hybrid: how long to spin on an idle socket before blocking on its FD."""
    yield_interval_us: PosInt = 1000
    """busy/hybrid: longest stretch of spinning between yields to the event loop (timers, signals)."""
    max_drain: PosInt = 256
    """Most frames read in one ingest burst before the loop looks at the model step again."""
    coalesce_us: Annotated[int, Meta(ge=0, le=100_000)] = 0
    """While a full batch (scheduler.max_batch rows, or three quarters of the service's instruments where that is fewer) is already queued -- or, past capacity (no read has found the socket empty for this long, and the last step took at least half a full batch), half as many slots as the last step took -- read the feed at most once per this many µs since the last read that emptied it, in one burst of what arrived: a burst's cost is mostly fixed, and past capacity a loop that reads the feed every iteration spends most of its time there. Holds a read only when longer than a loop iteration past capacity (~1.2 ms for gpu.toml's lstm_a on the GPU hosts, where 2500 doubled a saturated shard's decided/s). Events wait up to this long in the socket, past capacity and at it (gpu.toml at its capacity: the service stage's median 1.3-2.8x, BENCHMARKS.md wave 25). 0: read whenever input is there. Ignored with runner.cpu_worker (its loop sleeps while a step is in flight)."""
    read_gap_us: Annotated[int, Meta(ge=0, le=100_000)] = 0
    """Past capacity only -- no read has found the socket empty for this long, and steps are still queued -- read the feed at most once per this many µs since the last read that emptied it, stepping what is queued meanwhile. Measured (BENCHMARKS.md wave 33, an H100 host): 11 chained lstm_a shards at 1.012M events/s decided 986.8-987.0k with 1000 against 974.2-976.5k without (shed 2.2-2.5 against 3.5-3.7 %), from more steps a second (62-73k against 48-60k, all shards), not longer bursts. Events wait up to this long in the socket past capacity; a loop with nothing queued reads at once, and a read that finds the socket empty ends it. 0: off. Ignored with runner.cpu_worker."""

    def __post_init__(self) -> None:
        _check_shm_service(self.shm_service)

    def batch_frame_limit(self) -> int:
        """The largest EventBatch frame the ingest reads: max_batch_frame_bytes, never below
        max_frame_bytes, and (over ZeroMQ) never above what libzmq delivers (max_msg_size_bytes)."""
        limit = max(self.max_batch_frame_bytes, self.max_frame_bytes)
        if self.transport == "zmq" and self.max_msg_size_bytes >= 0:
            limit = min(limit, self.max_msg_size_bytes)
        return limit


class EgressConfig(_Section):
    transport: Literal["zmq", "iceoryx2"] = "zmq"
    """zmq: the XPUB at `endpoint`; iceoryx2: the shared-memory service `shm_service` (no topic frames: `topic_frame` does not apply)."""
    endpoint: str = "ipc://{runtime_dir}/{name}-decisions.sock"
    """Where decisions (and Status) are published."""
    shm_service: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.{}/-]{1,200}$")] = "hft-infer/{name}/decisions"
    """iceoryx2 publish-subscribe service of the decisions (`{name}` = service.name)."""
    shm_buffer: Annotated[int, Meta(ge=1, le=65536)] = 4096
    """iceoryx2: frames each decision subscriber buffers; a frame meeting a full buffer is not sent to it and counted in egress_dropped (never waited on)."""
    mode: Literal["batch", "per_instrument"] = "batch"
    """batch: one DecisionBatch frame per loop iteration (columnar; cheapest per decision); per_instrument: one Decision frame per answer on the instrument's topic (for subscribers that filter)."""
    bind: bool = True
    """True: bind (clients connect to us); False: connect to a forwarder."""
    topic_frame: bool = True
    """Decisions are preceded by the instrument's topic frame (Status by 0xFFFFFFFF)."""
    snd_hwm: NonNegInt = 100_000
    """ZMQ_SNDHWM per subscriber; a send that meets a full pipe is dropped and counted."""
    publish_shed: bool = True
    """Answer shed requests with a Decision of status SHED (otherwise only counted)."""
    publish_rejected: bool = True
    """Answer rejected events whose instrument and seq are known with status REJECTED."""
    status_interval_ms: PosInt = 1000
    """How often a Status message with the counters goes out on the decision socket."""

    def __post_init__(self) -> None:
        _check_shm_service(self.shm_service)


class UniverseConfig(_Section):
    instruments: PosInt = 64
    """Instrument ids 0..instruments-1 (ignored when `ids` is given)."""
    ids: list[Annotated[int, Meta(ge=0, le=0xFFFFFFFD)]] = []
    """Explicit instrument ids; their order fixes the feature-store slots."""
    shard_index: NonNegInt = 0
    """This instance's shard (see shard_count); `serve --shard I/N` sets both."""
    shard_count: PosInt = 1
    """Serve only ids with position % shard_count == shard_index (topic-filtered), or the shard_weights plan."""
    shard_weights: list[Annotated[float, Meta(ge=0.0)]] = []
    """Each instrument's expected activity (e.g. events/s), in ids order: shards balance the load by it instead of position % shard_count (every shard needs the same list; hft_infer/sharding.py)."""

    def __post_init__(self) -> None:
        if len(set(self.ids)) != len(self.ids):
            raise ValueError("`ids` contains duplicates")
        if self.shard_index >= self.shard_count:
            raise ValueError("`shard_index` must be < `shard_count`")
        n = len(self.all_ids())
        if self.shard_count > n:
            raise ValueError(f"`shard_count` {self.shard_count} exceeds the universe's {n} instruments: "
                             "a shard would serve none")
        if self.shard_weights:
            if len(self.shard_weights) != n:
                raise ValueError(f"`shard_weights` has {len(self.shard_weights)} entries for {n} instruments "
                                 "(one per instrument, in ids order)")
            if not all(math.isfinite(w) for w in self.shard_weights):
                raise ValueError("`shard_weights` must be finite numbers")

    def all_ids(self) -> list[int]:
        return list(self.ids) if self.ids else list(range(self.instruments))

    def owned_ids(self) -> list[int]:
        ids = self.all_ids()
        shard = shard_of_positions(len(ids), self.shard_count, self.shard_weights)
        return [i for i, k in zip(ids, shard) if k == self.shard_index]


class ModelConfig(_Section):
    checkpoint: str = "builtin:default"
    """A .safetensors checkpoint, a torch state_dict (.pt, needs `preset`), 'builtin:NAME', or '' for `preset` with seeded random weights."""
    preset: str = ""
    """Model preset (mlp_small, lstm_a, lstm_b, lstm_c) when the checkpoint does not carry its config."""
    mode: Literal["window", "stream"] = "window"
    """LSTM only. window: each decision sees the last W rows; stream: one recurrent step per event."""
    window_method: Literal["incremental", "recompute"] = "incremental"
    """LSTM window mode: exact incremental open-window states (default) or recompute the window."""
    seed: int = 0
    """Seed for random weights when no checkpoint is given."""
    module: str = ""
    """Your own torch model instead of the built-in families: 'package.module:factory', 'path/to/file.py:factory', a TorchScript '.pt' or a torch.export '.pt2' file; an nn.Module mapping float32 windows [B, window, 4 * levels + 2] to [B, 3] logits (docs/notes/models.md). When set, `checkpoint`, `preset` and `seed` are not used."""
    module_args: dict[str, Any] = {}
    """`module` = '...:factory' only: keyword arguments of the factory."""
    window: Annotated[int, Meta(ge=1, le=4096)] = 32
    """`module` only: rows per decision (W)."""
    levels: Annotated[int, Meta(ge=1, le=64)] = 10
    """`module` only: book levels per row (rows are 4 * levels + 2 wide)."""
    input: Literal["features", "raw"] = "features"
    """`module` only: each row as the built-in feature row (bps from mid, log1p sizes) or as the raw row."""


class DecisionConfig(_Section):
    threshold: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.2
    """|score| above this gives action +-1 (score in [-1, 1])."""
    hysteresis: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0
    """Once long/short, stay until the score crosses threshold - hysteresis the other way."""


class SchedulerConfig(_Section):
    classes: Annotated[int, Meta(ge=1, le=16)] = 4
    """Number of priority classes; 0 is the most urgent."""
    default_class: NonNegInt = 2
    """Class of an event that no rule below assigns."""
    class_by_kind: dict[Literal["quote", "trade"], NonNegInt] = {}
    """Class per message kind (overrides default_class)."""
    class_by_instrument: dict[str, NonNegInt] = {}
    """Class per instrument id (TOML keys are strings: { "7" = 0 }); overrides class_by_kind."""
    honour_message_priority: bool = True
    """A message's own `priority` field (>= 0) overrides the configured class."""
    aging_us: Annotated[float, Meta(gt=0)] = 200.0
    """Waiting this long improves a request's effective priority by one class."""
    max_age_us: PosInt = 5000
    """Requests older than this (receive -> pick) are shed, answered with status SHED."""
    conflate: Literal["auto", "on", "off"] = "auto"
    """One pending request per instrument (window models that read the ring). auto: on where the model allows."""
    policy: Literal["greedy", "window", "adaptive"] = "greedy"
    """greedy: step whatever is pending now; window: wait up to max_wait_us for a full batch; adaptive: tune the wait against latency_objective_us."""
    max_batch: Annotated[int, Meta(ge=1, le=4096)] = 64
    """Most requests in one model step."""
    max_wait_us: NonNegInt = 50
    """window: longest wait for a fuller batch; adaptive: upper bound of the wait."""
    latency_objective_us: PosInt = 500
    """adaptive: target p99 of queue + step."""
    capacity: Annotated[int, Meta(ge=16)] = 65536
    """Request slots; an event arriving with none free is shed (QUEUE_FULL)."""
    max_pending_per_instrument: Annotated[int, Meta(ge=1)] = 64
    """Stateful models: pending events of one instrument beyond this are shed (QUEUE_FULL). Each pending event keeps its row in the instrument's feature ring, so the ring is this plus the rows a step reads a slot (1 for an LSTM that keeps its state, else the model's window; at least 256; 168 bytes a row at 10 levels, pinned on a GPU host)."""
    admission: Literal["deadline", "depth"] = "deadline"
    """Stateful models: deadline: an instrument queues no more events than the service steps within max_age_us at its measured pace (the rest shed QUEUE_FULL) and an event its queue would make stale is shed LATE, both unapplied, so overload cannot make every queued event stale; depth: up to max_pending_per_instrument however long they wait (every row applied, decisions go stale under overload)."""

    def __post_init__(self) -> None:
        if self.default_class >= self.classes:
            raise ValueError("`default_class` must be < `classes`")
        for table in (self.class_by_kind, self.class_by_instrument):
            for key, cls in table.items():
                if cls >= self.classes:
                    raise ValueError(f"class {cls} for {key!r} must be < `classes` ({self.classes})")
        for key in self.class_by_instrument:
            if not key.isdigit():
                raise ValueError(f"`class_by_instrument` key {key!r} is not an instrument id")


class RunnerConfig(_Section):
    engine: Literal["auto", "eager", "graph", "persistent"] = "auto"
    """auto: graph where CUDA works, else eager (the CPU path). persistent only when named: self-checked at start-up, but lstm_a diverges on it now and then (wave 46; traced in wave 47, the fix not yet landed: serve production on graph); slower than graph for the MLP and at batch 64, faster for the LSTMs' requests of one or two windows since waves 42-44 (BENCHMARKS.md; one end-to-end run, not yet a default)."""
    device: str = "auto"
    """auto (cuda:0 when available, else cpu), cpu, cuda, cuda:N."""
    buckets: list[PosInt] = msgspec.field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    """Batch-size buckets: a batch is padded to the next bucket (one CUDA graph each on a GPU)."""
    torch_threads: PosInt = 1
    """intra-op threads for the CPU engine (1: the hot loop owns its core)."""
    cpu_products: Literal["auto", "numpy", "torch"] = "auto"
    """CPU engine: the backend of a batch's matrix products. auto: numpy's (OpenBLAS) or torch's (MKL), whichever is faster for each product on this machine, timed once at start-up (they differ by up to ~3x either way); numpy or torch: that one always. Results differ only in fp32 summation order."""
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    """GPU kernels: fp32 (plain fp32 products), tf32 (tensor cores, fp32 accumulation), bf16 (bf16 weights, fp32 accumulation); state, biases and the head are fp32 always. CPU engine: fp32 (tf32 runs fp32), or bf16: a batch's weight products (the MLP's hidden layers, the LSTM's layers) may run as bf16 products with fp32 accumulation (oneDNN: AMX or AVX512-BF16 where the core has them), at the batch sizes where that is faster here (timed at start-up with cpu_products = auto), their inputs and outputs rounded to bf16; batch 1 and the head stay fp32. Scores move by up to ~3e-3; checked against fp32 at start-up (self_check)."""
    check_graph_addresses: bool = False
    """Debug: verify before every replay that graph inputs have not moved."""
    self_check: bool = True
    """GPU engines, and the CPU engine in bf16: before serving, step a fixed stream of random rows through the engine and the fp32 CPU engine and refuse the engine when their scores disagree beyond the precision's rounding (well under a second)."""
    watchdog_ms: PosInt = 1000
    """Persistent engine: a step not done within this is a stuck kernel (fatal)."""
    persistent_programs: NonNegInt = 0
    """Persistent engine: most programs (thread blocks) its kernel may hold; 0 = the GPU's SMs divided by universe.shard_count, so that the kernels of N shards sharing one GPU (under MPS) are all resident at once. A model whose kernel needs more is refused at start-up, with both counts."""
    max_inflight: Annotated[int, Meta(ge=1, le=16)] = 2
    """GPU engines: steps in flight at once (staging buffers: the loop writes step k+1 while step k runs; the persistent engine's request ring holds at least 2)."""
    chain_steps: bool = False
    """GPU engines: within one loop iteration, collect every finished step and submit steps while the engine takes one and slots are still queued, rather than one of each. A stateful model steps one row per instrument per step, so a backlogged instrument then advances by up to max_inflight rows an iteration, not one. Measured both ways (BENCHMARKS.md waves 31-32): 11 lstm_a shards over EventBatch frames decided 1-12 % more with it on four H100 hosts (on the quickest, 1,002,550-1,007,693 decided/s of 1.012M offered, shed under 1 %, against 965-996k), but one gpu.toml service over per-event frames decided 41 % less at 100k events/s (each chained step's host cost) and shed everything at 200k in one of two runs; hence off by default."""
    cpu_worker: bool = False
    """CPU engine: run each step on a worker thread so the loop keeps ingesting meanwhile; while a step runs the loop sleeps on the socket and the step's end rather than spin (a spinning loop holds the GIL the step needs). Pays when a step is long against the per-event work and a core is free for it (`serve` warns when the placement leaves it none). The step reads the feature ring while the loop writes it, so each slot's ring also holds 2 x ingest.max_drain rows for the events ingested meanwhile."""

    @property
    def max_bucket(self) -> int:
        return max(self.buckets)

    def __post_init__(self) -> None:
        if not self.buckets or sorted(set(self.buckets)) != list(self.buckets):
            raise ValueError("`buckets` must be a non-empty strictly increasing list")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"`device` {self.device!r} is not auto, cpu, cuda or cuda:N")


class MetricsConfig(_Section):
    stats_interval_ms: PosInt = 1000
    """Housekeeping period: fold raw samples into HDR histograms, ship them, refresh clocks."""
    sample_capacity: Annotated[int, Meta(ge=1024)] = 65536
    """Raw samples buffered per stage between folds: the idle loop folds one stage once it holds 1,024, a busy loop a chunk per iteration once one is half full, and every interval folds the rest."""
    highest_trackable_us: PosInt = 60_000_000
    """Largest latency the histograms resolve (larger values are clamped to it)."""
    significant_digits: Annotated[int, Meta(ge=1, le=5)] = 3
    """HDR precision (3: values within 0.1 %)."""
    control_endpoint: str = "ipc://{runtime_dir}/{name}-control.sock"
    """Where the hot loop ships interval histograms and counters (PUSH, NOBLOCK)."""
    stall_us: PosInt = 250
    """A loop iteration longer than this counts as a stall (counter `stalls`), its time split by phase into `stall_<phase>_us` (hft_infer/loop_stalls.py)."""


class ControlConfig(_Section):
    enabled: bool = True
    """`serve` starts the control process (dashboard, /metrics, HDR logs)."""
    host: str = "127.0.0.1"
    """Dashboard bind address; non-loopback needs security.allow_remote."""
    port: Annotated[int, Meta(ge=0, le=65535)] = 8321
    """Dashboard and /metrics port (0 = pick a free one and log it)."""
    hlog: bool = True
    """Write HDR interval logs (.hlog) into the run directory."""


class CpuConfig(_Section):
    cores: list[NonNegInt] | Literal["auto", "none"] = "none"
    """Cores for the hot thread: a list, auto (isolated cores on the GPU's NUMA node), or none."""
    strict: bool = False
    """Refused placement requests are fatal instead of warnings."""
    rt_priority: Annotated[int, Meta(ge=0, le=99)] = 0
    """SCHED_FIFO priority of the hot thread (0 = leave the default policy)."""
    mlockall: bool = False
    """Lock all current and future memory (needs CAP_IPC_LOCK or LimitMEMLOCK=infinity)."""
    gc_freeze: bool = True
    """gc.freeze() after warm-up and no automatic collection in the loop (collected in housekeeping)."""
    host_shards: list[NonNegInt] = []
    """The shards (universe.shard_index values) that run on this host, for `cores = "auto"`: this shard takes the slot of its place among them and keeps their hot cores free of its helper threads; empty = all of universe.shard_count (one host runs every shard)."""


class SecurityConfig(_Section):
    allow_remote: bool = False
    """Permit non-loopback tcp endpoints without CURVE keys (explicit opt-out)."""
    curve_server_secret: str = ""
    """Path to this service's CURVE secret key file; enables CURVE on non-loopback endpoints."""
    curve_authorized_dir: str = ""
    """Directory of client public keys admitted by the ZAP authenticator."""
    curve_feed_public: str = ""
    """Path to the feed publisher's public key (for a connecting ingest socket)."""
    curve_client_secret: str = ""
    """This service's key pair as a CURVE client of the feed (empty = curve_server_secret)."""
    curve_loopback: bool = False
    """Use CURVE on loopback tcp endpoints too (with keys set): 127.0.0.1 ports standing for other hosts, or untrusted local users."""


class Config(_Section):
    service: ServiceConfig = ServiceConfig()
    ingest: IngestConfig = IngestConfig()
    egress: EgressConfig = EgressConfig()
    universe: UniverseConfig = UniverseConfig()
    model: ModelConfig = ModelConfig()
    decision: DecisionConfig = DecisionConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    runner: RunnerConfig = RunnerConfig()
    metrics: MetricsConfig = MetricsConfig()
    control: ControlConfig = ControlConfig()
    cpu: CpuConfig = CpuConfig()
    security: SecurityConfig = SecurityConfig()

    def __post_init__(self) -> None:
        for name in ("coalesce_us", "read_gap_us"):
            held = getattr(self.ingest, name)
            if held and held >= self.scheduler.max_age_us:
                raise ValueError(
                    f"ingest.{name} {held} must be below scheduler.max_age_us "
                    f"{self.scheduler.max_age_us} (a held event would be stale when read)"
                )
        host, uni = self.cpu.host_shards, self.universe
        if host and (len(set(host)) != len(host) or max(host) >= uni.shard_count or uni.shard_index not in host):
            raise ValueError(
                f"cpu.host_shards {host} must be distinct shard indices below universe.shard_count "
                f"{uni.shard_count} that include this shard's, universe.shard_index {uni.shard_index} "
                f"(empty: every shard runs on this host)"
            )
        if self.runner.max_bucket < self.scheduler.max_batch:
            raise ValueError(
                f"runner.buckets top out at {self.runner.max_bucket} < scheduler.max_batch "
                f"{self.scheduler.max_batch}"
            )


def runtime_dir() -> str:
    """Directory for ipc sockets: $HFT_INFER_RUNTIME_DIR, systemd's $RUNTIME_DIRECTORY,
    $XDG_RUNTIME_DIR/hft-infer, else <tmp>/hft-infer-<uid>. Created 0700 if missing."""
    path = os.environ.get("HFT_INFER_RUNTIME_DIR") or os.environ.get("RUNTIME_DIRECTORY")
    if not path:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        path = os.path.join(xdg, "hft-infer") if xdg else os.path.join(
            tempfile.gettempdir(), f"hft-infer-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def expand_endpoint(template: str, cfg: Config) -> str:
    """Fill `{runtime_dir}` and `{name}` in an endpoint template."""
    if "{" not in template:
        return template
    return template.format(runtime_dir=runtime_dir(), name=cfg.service.name)


def expand_shm_service(template: str, cfg: Config) -> str:
    """Fill `{name}` in an iceoryx2 service name template."""
    return template.replace("{name}", cfg.service.name) if "{" in template else template


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare strings need no quotes on the command line
    return key.strip().split("."), value


def apply_overrides(raw: dict, overrides: list[str], record: Overrides | None = None) -> dict:
    for item in overrides:
        path, value = _parse_override(item)
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: {part} is not a section")
        node[path[-1]] = value
        if record is not None:
            record.add(path, item)
    return raw


BUILTIN_PREFIX = "builtin:"


def read_config_text(path: str | None) -> tuple[str, str]:
    """(source name, TOML text) of a config path, `builtin:NAME`, or None for the default."""
    if path is None or path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):] if path else "default"
        try:
            text = resources.files("hft_infer.configs").joinpath(f"{name}.toml").read_text()
        except FileNotFoundError:
            raise ConfigError(f"no built-in config {name!r}") from None
        return f"builtin:{name}", text
    try:
        return path, Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load, override and validate a config; raises ConfigError with a one-line message."""
    source, text = read_config_text(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: TOML syntax: {e}") from None
    applied = Overrides()
    raw = apply_overrides(raw, list(overrides), applied)
    problem = struct_problem(raw, Config)  # unknown keys, values outside a Literal: from Config's types
    if problem is not None:
        raise config_error(source, applied, problem)
    try:
        return msgspec.convert(raw, type=Config)
    except msgspec.ValidationError as e:  # ranges, types, __post_init__ checks
        raise config_error(source, applied, msgspec_problem(e, raw)) from None


def to_toml_dict(cfg: Config) -> dict:
    """Plain dict of the resolved config (for printing and run summaries)."""
    return msgspec.to_builtins(cfg)


def dump_toml(cfg: Config) -> str:
    """The resolved config as TOML (round-trips through load_config)."""
    return tomli_w.dumps(to_toml_dict(cfg))
