"""Drive a service with a prepared feed and measure it: shared by `bench` and `replay`.

    feed (encoded frames) + intended send offsets  -> a file for the pacer process
      -> place the harness (launcher.plan_harness): pacer and collector cores, spin or not
      -> pacer process: binds the feed, waits for the service's subscriptions
      -> collector process(es): subscribe to the decisions, wait for a Status
      -> [start `hft-infer serve` or the null service as a child | use a running service]
      -> `go`: the pacer sends open loop from an agreed CLOCK_MONOTONIC start time while
         the collectors receive and timestamp; this process only folds the child
         service's per-interval stage histograms and shows progress
      -> drain: wait until the decisions are quiet; a child gets SIGTERM and sends its
         final Status; a running service is left running, its counters come from the
         next Status
      -> read the pacer's send times and the collectors' frames back from their files,
         account for every event, write the run directory, return the result.

The run directory holds `summary.json` (the bench schema), the
`tick_to_decision` and pacer-lateness `.hgrm` distributions, a
`tick_to_decision` `.hlog` interval log, the pacer's and collectors' logs
and, for a child service, its own `service/` directory and log.

CLI level: may use `replay` (the service core may not).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

from hft_infer.accounting import reasons_by_name, reasons_line
from hft_infer.affinity import parse_cpulist
from hft_infer.app.launcher import READY_TIMEOUT_S, ServiceProcess, plan_harness, private_runtime_dir, tail
from hft_infer.channels import check_transports, decisions_address, feed_address
from hft_infer.clock import EpochClock, perf_ns
from hft_infer.config import Config, expand_endpoint, to_toml_dict
from hft_infer.errors import UserError
from hft_infer.loop_stalls import LOOP_COUNTERS, loop_line
from hft_infer.metrics import (
    SERVICE_STAGES,
    TICK_TO_DECISION,
    add_sparse,
    format_table,
    from_wire,
    new_histogram,
    record_array,
    summarize,
)
from hft_infer.metrics.hlog import write_hgrm
from hft_infer.replay.child import Child, ChildError, ChildTimeout, wait_replies
from hft_infer.replay.collector import analyse, decode_frames, shed_by_instrument, shed_by_instrument_line
from hft_infer.replay.collector_proc import load_frames
from hft_infer.replay.events import beyond_step_rate, busiest_instrument
from hft_infer.replay.pacer import max_batch_events, save_feed
from hft_infer.transport.codec import BATCH_TOPIC, SERVICE_TOPIC, feed_topics, message_tag, topic_for
from hft_infer.transport.schema import TAG_STATUS
from hft_infer.transport.sockets import bind
from hft_infer.transport.stats import decode_snapshot

QUIET_S = 0.3  # the feed is over once no decision has come for this long (settled: see run_schedule)
SETTLE_TIMEOUT_S = 10.0
SUBSCRIPTION_SETTLE_MS = 300  # a running service: other subscribers may connect at the same moment
START_LEAD_NS = 100_000_000  # `go` names a start this far ahead: every process is past its pipe read by then


class StatsReceiver:
    """Binds the control endpoint and folds the child service's interval snapshots."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        bind(self.sock, endpoint)
        self.snapshots = []
        self.measure_after_ns = None  # epoch ns: intervals that started before this are warm-up
        self.measure_until_ns = None  # epoch ns: the feed's last intended send (counter_rate)
        self.hists = {}

    def poll(self) -> None:
        while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            snap = decode_snapshot(self.sock.recv(zmq.NOBLOCK))
            self.snapshots.append(snap)
            if self.measure_after_ns is not None and snap.ts_ns - snap.interval_ns < self.measure_after_ns:
                continue
            for stage, wire in snap.stages.items():
                h = self.hists.get(stage)
                if h is None:
                    h = self.hists[stage] = new_histogram(snap.histogram_highest_ns, snap.histogram_digits)
                add_sparse(h, from_wire(wire))

    def summary(self) -> dict:
        return {s: summarize(self.hists[s]) if s in self.hists else summarize(new_histogram())
                for s in SERVICE_STAGES}

    def write_timeline(self, path: Path) -> None:
        """Every snapshot received, one JSON line each, in order: `t_s` (its interval's end,
        seconds after the first snapshot's), `interval_ms`, `final`, and its cumulative
        `counters` and `by_reason`, its `gauges` -- the service's state over the run, for what
        the run's totals cannot say (when a shard fell behind, what its admission did then);
        `--set metrics.stats_interval_ms=100` gives a finer one. Nothing without a snapshot."""
        if not self.snapshots:
            return
        t0 = self.snapshots[0].ts_ns
        with open(path, "w") as f:
            for snap in self.snapshots:
                f.write(json.dumps({"t_s": round((snap.ts_ns - t0) / 1e9, 6),
                                    "interval_ms": round(snap.interval_ns / 1e6, 3), "final": snap.final,
                                    "counters": snap.counters, "by_reason": snap.rejected_by_reason,
                                    "gauges": snap.gauges}) + "\n")

    def measure(self, load: Load, start_ns: int) -> None:
        """Measure `load` sent on a schedule that starts at `start_ns` (perf ns): from its first
        event after the warm-up to its last intended send."""
        epoch = EpochClock().epoch
        if load.measure_from:
            self.measure_after_ns = epoch(start_ns + int(load.offsets_ns[load.measure_from]))
        if len(load.offsets_ns):
            self.measure_until_ns = epoch(start_ns + int(load.offsets_ns[-1]))

    def counter_deltas(self, names) -> tuple[dict[str, int], int]:
        """How much each cumulative counter of `names` grew over the snapshot intervals that lie
        wholly inside the measured feed [measure_after_ns, measure_until_ns] (neither warm-up nor
        the drain after the feed), and those intervals' span in ns (0: none does, a run shorter
        than two of metrics.stats_interval_ms)."""
        lo, hi = self.measure_after_ns or 0, self.measure_until_ns
        prev, totals, span_ns = None, dict.fromkeys(names, 0), 0
        for s in self.snapshots:
            if prev is not None and s.ts_ns - s.interval_ns >= lo and (hi is None or s.ts_ns <= hi):
                for name in names:
                    totals[name] += s.counters.get(name, 0) - prev.counters.get(name, 0)
                span_ns += s.interval_ns
            prev = s
        return totals, span_ns

    def counter_rate(self, name: str) -> float | None:
        """A cumulative counter's rate (per s) over the measured intervals (counter_deltas); None
        when there are none."""
        totals, span_ns = self.counter_deltas((name,))
        return totals[name] / (span_ns / 1e9) if span_ns > 0 else None

    def loop_health(self) -> dict | None:
        """The loop's stalls by phase and the hot thread's preemptions over the measured intervals
        (hft_infer/loop_stalls.py, hot_thread_stats.py), with the span they cover; None when no
        interval lies inside the feed."""
        totals, span_ns = self.counter_deltas(LOOP_COUNTERS)
        return dict(totals, span_s=span_ns / 1e9) if span_ns > 0 else None


@dataclass
class Load:
    """What to send: the event table (for matching), its frames and intended send offsets (ns)."""

    events: np.ndarray
    feed: object  # replay.pacer.EncodedFeed
    offsets_ns: np.ndarray
    measure_from: int = 0  # events before this index are warm-up (accounted, not in latency)
    description: str = ""
    event_record: np.ndarray | None = None  # event i was sent as feed frame event_record[i] (None: i)
    feed_file: str | None = field(default=None, repr=False)  # written once, reused (floor, then service)


@dataclass
class Target:
    cfg: Config
    config_path: str | None
    overrides: list[str]
    start_service: bool  # True: run the service as a child on a private runtime dir
    null: bool = False  # the child is the null service (the harness floor)
    null_egress: str = "batch"
    null_delay_us: float = 0.0


@dataclass
class HarnessOptions:
    pacer: str = "auto"  # auto | spin | sleep
    collectors: int = 1
    reset_first: bool = False  # a Reset of every instrument before the first event (replay)
    feed_batch: int = 1  # most events the pacer sends as one EventBatch frame when they are due together


def machine_info() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "platform": platform.platform(), "commit": source_commit(),
            # CUDA MPS in use (tools/with_mps.sh): shard figures differ by far with and without it
            "cuda_mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY")}


def source_commit() -> str:
    """The commit of the code that ran: $HFT_COMMIT (tools/gpu_session.sh sets it: a device copy
    of the tree may carry an older .git) or the checkout's HEAD; "unknown" for an installed copy."""
    commit = os.environ.get("HFT_COMMIT")
    if commit:
        return commit
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                           cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def effective_feed_batch(cfg: Config, feed, asked: int) -> int:
    """--feed-batch as the pacer will use it: 1 for a feed without columns (captured frames), and
    at most what fits one frame the service reads (IngestConfig.batch_frame_limit)."""
    if asked <= 1 or feed is None or feed.columns is None:
        return 1
    return min(asked, max_batch_events(feed.columns.levels, cfg.ingest.batch_frame_limit()))


def _collector_topics(cfg: Config, k: int, n: int) -> list[str] | None:
    """Collector k of n: every collector takes the Status topic (its readiness signal),
    the first also the DecisionBatch topic, and the instruments are split by position."""
    if n == 1:
        return None
    ids = cfg.universe.owned_ids()
    mine = [topic_for(i) for pos, i in enumerate(ids) if pos % n == k]
    return [t.hex() for t in [SERVICE_TOPIC] + ([BATCH_TOPIC] if k == 0 else []) + mine]


def drive(load: Load, target: Target, run_dir: Path, *, quiet: bool = False, label: str = "bench",
          extra: dict | None = None, harness: HarnessOptions | None = None):
    """Returns (result dict, StatsReceiver | None, CollectorResult)."""
    cfg = target.cfg
    harness = harness or HarnessOptions()
    check_transports(cfg)
    feed_shm, decisions_shm = cfg.ingest.transport == "iceoryx2", cfg.egress.transport == "iceoryx2"
    if harness.collectors > 1 and decisions_shm:
        raise UserError("--collectors > 1 splits the decisions by topic: iceoryx2 has no topics (egress.transport)")
    if not feed_shm and (cfg.ingest.socket_type != "sub" or cfg.ingest.bind):
        raise UserError(f"{label} publishes on a PUB that the service connects to: needs ingest.socket_type = "
                        "\"sub\" and ingest.bind = false")
    if harness.collectors > 1 and not cfg.egress.topic_frame:
        raise UserError("--collectors > 1 splits the decisions by topic: needs egress.topic_frame = true")
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = plan_harness(cfg, harness.pacer, harness.collectors)
    work = private_runtime_dir(f"hft-{label}-")  # the feed and result files; a child service's sockets
    saved_env, saved_mask = os.environ.get("HFT_INFER_RUNTIME_DIR"), os.sched_getaffinity(0)
    if target.start_service:
        os.environ["HFT_INFER_RUNTIME_DIR"] = work  # the child inherits it; endpoints expand into it
    # the service subscribes to each owned instrument's topic, the service topic (Heartbeat, Reset) and
    # the batch topic (EventBatch): codec.feed_topics (iceoryx2: the one subscriber of the feed's service)
    n_topics = len(feed_topics(cfg.universe.owned_ids())) if cfg.ingest.topic_frame and not feed_shm else 1
    feed_batch = effective_feed_batch(cfg, load.feed, harness.feed_batch)
    feed_file = load.feed_file or os.path.join(work, "feed.npz")
    if load.feed_file is None:
        save_feed(feed_file, load.feed, load.offsets_ns)
    children: list[Child] = []
    service = stats = ctx = None

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    try:
        pinned = plan.pacer_core is not None
        if pinned:  # children (the service too) inherit this: keep them off the pacer's and collectors' cores
            os.sched_setaffinity(0, plan.helper_cores + plan.service_cores)
        ctx = zmq.Context()
        io = ",".join(map(str, plan.helper_cores)) if pinned else ""
        pacer = Child("pacer", "hft_infer.replay.pacer_proc",
                      ["--feed", feed_file, "--endpoint", feed_address(cfg), "--shm-buffer", str(cfg.ingest.shm_buffer),
                       "--out", os.path.join(work, "pacer.npz"), "--topics", str(n_topics),
                       "--settle-ms", str(0 if target.start_service else SUBSCRIPTION_SETTLE_MS),
                       "--io-cores", io, *(["--core", str(plan.pacer_core)] if pinned else []),
                       *(["--spin"] if plan.pacer_spin else []),
                       *([] if cfg.ingest.topic_frame else ["--no-topic-frame"]),
                       *(["--reset-first"] if harness.reset_first else []),
                       "--feed-batch", str(feed_batch)], run_dir / "pacer.log")
        children.append(pacer)
        wait_replies({pacer: "bound"}, 300.0)  # loading a big feed takes a while
        capacity = len(load.feed) // harness.collectors + 4096
        collectors = []
        for k, core in enumerate(plan.collector_cores):
            topics = _collector_topics(cfg, k, harness.collectors)
            collectors.append(Child(f"collector {k}" if harness.collectors > 1 else "collector",
                                    "hft_infer.replay.collector_proc",
                                    ["--endpoint", decisions_address(cfg), "--shm-buffer", str(cfg.egress.shm_buffer),
                                     "--out", os.path.join(work, f"collector{k}.npz"), "--capacity", str(capacity),
                                     "--io-cores", io, *(["--core", str(core)] if core is not None else []),
                                     *(["--spin"] if plan.collector_spin else []),
                                     *([] if cfg.egress.topic_frame else ["--no-topic-frame"]),
                                     *sum((["--subscribe", t] for t in topics or []), [])],
                                    run_dir / f"collector{k if harness.collectors > 1 else ''}.log"))
        children += collectors
        if target.start_service:
            if not target.null:
                stats = StatsReceiver(ctx, expand_endpoint(cfg.metrics.control_endpoint, cfg))
            null_args = ["--egress", target.null_egress, "--delay-us", str(target.null_delay_us)]
            service = ServiceProcess(config=target.config_path, overrides=target.overrides,
                                     run_dir=run_dir / "service", log_dir=run_dir, env=os.environ.copy(),
                                     null=target.null, extra_args=null_args if target.null else None)
            service.start()
        if pinned:
            os.sched_setaffinity(0, plan.helper_cores)

        def idle() -> None:
            if stats is not None:
                stats.poll()
            if service is not None and service.proc.poll() is not None:
                raise UserError(f"the service exited (code {service.proc.returncode}); the end of "
                                f"{service.log_path}:\n{tail(service.log_path)}")

        try:
            wait_replies({pacer: "subscribed", **{c: "ready" for c in collectors}},
                         READY_TIMEOUT_S if target.start_service else 30.0, on_idle=idle)
        except ChildTimeout as e:
            if target.start_service:
                raise
            raise UserError(f"no service answered on the config's endpoints within 30 s ({e}): is `hft-infer "
                            f"serve` running with this config?") from None
        seen = placed_hot_cores(service.log_path) if service is not None else None
        if seen is not None and set(seen) & ({plan.pacer_core} | set(plan.collector_cores)) - {None}:
            say(f"{label}: warning: the service placed itself on core(s) {seen}, which the harness expected "
                f"free (planned {plan.service_cores}): the measurement shares cores")
        say(f"{label}: service ready; sending {len(load.feed):,} events ({load.description}); {plan.describe()}")
        start = perf_ns() + START_LEAD_NS
        if stats is not None:
            stats.measure(load, start)
        settled = run_schedule(pacer, collectors, load, start, label=label, quiet=quiet, idle=idle,
                               settled=service is None)
        if service is not None:
            service.proc.terminate()
            got = wait_replies(send_all(collectors[:1], "final", 30.0), 40.0, on_idle=lambda: stats and stats.poll())
            if got[collectors[0]] != "final":
                say(f"{label}: warning: no final Status from the service within 30 s")
            service.wait_exit(30.0)
            for _ in range(20):  # the final snapshot may trail the final Status by a moment
                if stats is None:
                    break
                stats.poll()
                if stats.snapshots and stats.snapshots[-1].final:
                    break
                time.sleep(0.05)
        elif not settled:  # a Status newer than the feed (a settled one is)
            wait_replies(send_all(collectors[:1], "status", 5.0), 10.0)
        wait_replies(send_all(collectors, "stop"), 120.0)
        with np.load(os.path.join(work, "pacer.npz")) as z:
            intended_all, actual, sent_frames = z["intended"], z["actual"], int(z["sent"])
            elapsed_s = float(z["elapsed_s"])
        frames, recv_ns = [], []
        for k in range(len(collectors)):
            f, t = load_frames(os.path.join(work, f"collector{k}.npz"))
            if k:  # the Status frames of one collector are enough
                keep = [i for i, p in enumerate(f) if message_tag(p) != TAG_STATUS]
                f, t = [f[i] for i in keep], t[keep]
            frames += f
            recv_ns.append(t)
    except ChildError as e:
        raise UserError(str(e)) from None
    finally:
        for child in children:
            child.close()
        if service is not None:
            service.close()
        if ctx is not None:
            ctx.destroy(linger=0)
        restore_process(saved_env, saved_mask, work)

    answers = decode_frames(frames, np.concatenate(recv_ns) if recv_ns else np.zeros(0, np.int64))
    if load.event_record is None:
        intended, actual_ev, sent = intended_all, actual, sent_frames
    else:  # not every frame is an event (captures hold heartbeats too)
        intended, actual_ev = intended_all[load.event_record], actual[load.event_record]
        sent = int(np.count_nonzero(load.event_record < sent_frames))
    baseline = None
    if not target.start_service:  # a running service: subtract its counters from before our start
        before = [s for t, s in answers.statuses if t < start]
        baseline = before[-1] if before else None
    result = analyse(answers, load.events["instrument"], load.events["seq"], intended, sent,
                     measure_from=load.measure_from, baseline=baseline)
    result.intended_mono_ns, result.actual_mono_ns = intended, actual_ev
    lateness = lateness_histogram((actual - intended_all)[:sent_frames], load.measure_from)
    status = result.service_status
    n_measured = result.tick_to_decision["count"]
    steps_per_s = stats.counter_rate("batches") if stats is not None else None
    out = {
        "config": to_toml_dict(cfg),
        "service": "null" if target.null else ("child" if target.start_service else "running"),
        "rate_offered": (extra or {}).get("rate_offered"),
        "rate_achieved": (sent_frames - 1) / elapsed_s if sent_frames > 1 else 0.0,
        "engine": status.engine if status else None,
        "model_version": status.model_version if status else None,
        "precision": (status.precision or None) if status else None,
        "stages": stats.summary() if stats is not None else {},
        TICK_TO_DECISION: result.tick_to_decision,
        "send_to_service_recv": result.send_to_service_recv,
        "pacer_lateness": summarize(lateness),
        "accounting": result.accounting,
        "by_reason": run_reasons(status, baseline),
        "busiest_instrument": busiest_instrument(load.events["instrument"][:sent], elapsed_s),
        "steps_per_s": steps_per_s,
        "beyond_step_rate": beyond_step_rate(load.events["instrument"][:sent], elapsed_s, steps_per_s),
        "shed_by_instrument": shed_by_instrument(result.outcome, load.events["instrument"][:sent]),
        "loop": stats.loop_health() if stats is not None else None,
        "warmup_events": load.measure_from,
        "latency_scope": f"{TICK_TO_DECISION} over {n_measured:,} decided events after {load.measure_from:,} "
                         f"warm-up events",
        "harness": plan.as_dict() | {"collectors": harness.collectors, "service_cores_seen": seen,
                                     "feed_batch": feed_batch, "feed_batch_asked": harness.feed_batch},
        "answer_frames": {"decision": answers.decision_frames, "batch": answers.batch_frames,
                          "undecodable": answers.undecodable_frames},
        "service_exit_code": service.proc.returncode if service is not None else None,
        "duplicates": result.duplicates,
        "unmatched_decisions": result.unmatched,
        "run_dir": str(run_dir),
        "machine": machine_info(),
    } | ({"null_service": {"egress": target.null_egress, "delay_us": target.null_delay_us}} if target.null else {}) \
      | (extra or {})
    _write_histograms(run_dir, result, lateness)
    if stats is not None:
        stats.write_timeline(run_dir / "snapshots.jsonl")
    return out, stats, result


def placed_hot_cores(log_path: Path) -> list[int] | None:
    """The hot core(s) the child service reports in its placement block (None: no block)."""
    try:
        m = re.search(r"placement: mode=\S+ .*? hot=(\S+)", log_path.read_text(errors="replace"))
    except OSError:
        return None
    if m is None:
        return None
    return [] if m.group(1) == "-" else parse_cpulist(m.group(1))


def run_schedule(pacer: Child, collectors: list[Child], load: Load, start_ns: int, *, label: str, quiet: bool,
                 idle, settled: bool = False) -> bool:
    """Start the pacer at `start_ns`, show its progress, wait until it has sent the whole feed,
    then until every collector has seen the decisions go quiet (`idle` runs while waiting).

    `settled`: a service this run did not start (so no final Status will account for what it still
    holds): quiet also needs a Status after the feed that says nothing is pending -- a slow step
    (runner.cpu_worker) can hold events for longer than the quiet period without a frame.
    Returns whether every collector saw that Status (False without `settled`)."""
    progress = None if quiet or not sys.stderr.isatty() else Progress(len(load.feed), label)
    pacer.send("go", start_ns)
    schedule_s = (int(load.offsets_ns[-1]) - int(load.offsets_ns[0])) / 1e9 if len(load.feed) else 0.0
    # the schedule, a pacer that falls behind it, and --max (no schedule): at least 20k events/s
    done = wait_replies({pacer: "done"}, schedule_s * 3 + len(load.feed) / 20_000 + 120.0, on_idle=idle,
                        on_line=lambda c, ln: progress.update(*map(int, ln.split()[1:3]))
                        if progress is not None and ln.startswith("progress") else None)
    if progress:
        progress.done(int(done[pacer].split()[1]))
    words = ("quiet", QUIET_S, SETTLE_TIMEOUT_S) + (("settled",) if settled else ())
    got = wait_replies(send_all(collectors, *words), SETTLE_TIMEOUT_S + 10.0, on_idle=idle)
    if not settled:
        return False
    if any(v != "quiet" for v in got.values()):
        print(f"{label}: warning: the service still had events pending {SETTLE_TIMEOUT_S:.0f} s after the feed "
              "ended; the ones not answered by now count as lost", file=sys.stderr, flush=True)
        return False
    return True


def restore_process(saved_env: str | None, saved_mask, work: Path) -> None:
    """Undo what a drive did to this process: HFT_INFER_RUNTIME_DIR, the CPU affinity; remove
    its work directory."""
    if saved_env is None:
        os.environ.pop("HFT_INFER_RUNTIME_DIR", None)
    else:
        os.environ["HFT_INFER_RUNTIME_DIR"] = saved_env
    os.sched_setaffinity(0, saved_mask)
    shutil.rmtree(work, ignore_errors=True)


def send_all(children: list[Child], *words) -> dict[Child, str]:
    for child in children:
        child.send(*words)
    return {child: str(words[0]) if words[0] != "stop" else "done" for child in children}


def lateness_histogram(lateness_ns: np.ndarray, measure_from: int):
    """The pacer's lateness (actual - intended send, ns, per frame sent) past the warm-up."""
    hist = new_histogram()
    record_array(hist, lateness_ns[measure_from:])
    return hist


def _write_histograms(run_dir: Path, result, lateness) -> None:
    if result.tick_histogram.get_total_count():
        write_hgrm(result.tick_histogram, str(run_dir / f"{TICK_TO_DECISION}.hgrm"))
        result.write_hlog(str(run_dir / f"{TICK_TO_DECISION}.hlog"))
    if lateness.get_total_count():
        write_hgrm(lateness, str(run_dir / "pacer_lateness.hgrm"))


class Progress:
    """A one-line live progress display (rich, on stderr, gone when done), fed by the pacer's
    once-a-second progress replies."""

    def __init__(self, total: int, label: str) -> None:
        self.p = RichProgress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                              TimeRemainingColumn(), auto_refresh=False, transient=True)
        self.task = self.p.add_task("send", total=total, rate="")
        self.p.start()
        self._last = (perf_ns(), 0)

    def update(self, sent: int, total: int) -> None:
        now = perf_ns()
        t, n = self._last
        rate = (sent - n) / ((now - t) / 1e9) if now > t else 0.0
        self._last = (now, sent)
        self.p.update(self.task, completed=sent, rate=f"{rate:,.0f} ev/s")
        self.p.refresh()

    def done(self, sent: int) -> None:
        self.p.update(self.task, completed=sent)
        self.p.stop()


def result_table(out: dict, title: str) -> str:
    """The latency table and the lines that say what it covers (plain text, never cut)."""
    rows = dict(out["stages"])
    rows[TICK_TO_DECISION] = out[TICK_TO_DECISION]
    rows["send->service recv"] = out["send_to_service_recv"]
    rows["pacer lateness"] = out["pacer_lateness"]
    acc = out["accounting"]
    h = out["harness"]
    lines = [format_table(rows, title=title),
             f"{out['latency_scope']} (intended send time -> decision received); send->service recv and "
             f"pacer lateness over the same events",
             f"harness: pacer {h['pacer']}" + (f" on core {h['pacer_core']}" if h["pacer_core"] is not None else "")
             + f" (--pacer {h['pacer_choice']}), collector {h['collector']}"
             + (f" x{h['collectors']}" if h["collectors"] > 1 else "")
             + (f"; feed: up to {h['feed_batch']} due events per EventBatch frame"
                if h.get("feed_batch", 1) > 1 else "; feed: one event per frame") + f"; {h['reason']}",
             feed_line(out),
             *([loop_line(out.get("loop"))] if out.get("service") != "null" else []),
             f"accounting (all {acc['sent']:,} events sent, the {out['warmup_events']:,} warm-up events included; "
             f"latency figures exclude them): " + ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}"
                                                              for k, v in acc.items()),
             reasons_line(out.get("by_reason"))]
    shed_line = shed_by_instrument_line(out.get("shed_by_instrument"))
    return "\n".join(lines + ([shed_line] if shed_line else []))


def run_reasons(status, baseline) -> dict[str, int] | None:
    """The run's sheds and rejections by reason from the service's last Status (None: none came),
    less a running service's counts from before the run (`baseline`, a Status or None)."""
    if status is None:
        return None
    counts = list(status.rejected_by_reason)
    if baseline is not None:
        before = baseline.rejected_by_reason
        counts = [n - (before[i] if i < len(before) else 0) for i, n in enumerate(counts)]
    return reasons_by_name(counts)


def feed_line(out: dict) -> str:
    """The busiest instrument's rate beside the model's step rate: a stateful model steps one row
    per instrument per step, so it keeps up only while steps/s >= the busiest instrument's events/s."""
    b = out.get("busiest_instrument")
    text = "feed: no events" if not b else (f"feed: the busiest instrument ({b['id']}) carries {b['share']:.1%} "
                                            f"of the events, " + (f"{b['per_s']:,.0f}/s" if b["per_s"] else "-"))
    if "steps_per_s" not in out or out.get("service") == "null":  # the null service steps nothing
        return text
    steps = out["steps_per_s"]
    stepped = f"{steps:,.0f} steps/s" if steps is not None else "- steps/s (no stats interval inside the measured feed)"
    beyond = out.get("beyond_step_rate")
    sent = out["accounting"]["sent"]
    past = "" if beyond is None or not sent else \
        f"; {beyond:,} events ({beyond / sent:.1%}) came past that rate on their instrument"
    return (f"{text}; the service stepped {stepped} (a stateful model keeps up only while steps/s >= the "
            f"busiest instrument's events/s){past}")


def floor_table(floor: dict, main: dict) -> str:
    """tick_to_decision of the service beside the harness floor (null service), same feed and harness."""
    f, m = floor[TICK_TO_DECISION], main[TICK_TO_DECISION]

    def ratio(key: str):
        return f"{m[key] / f[key]:.2f}x" if m.get(key) and f.get(key) else "-"

    rows = {"floor (null service)": f, "service": m,
            "service / floor": {"count": "", **{k: ratio(k) for k in ("p50_us", "p90_us", "p99_us", "p999_us",
                                                                      "max_us")}}}
    return format_table(rows, title=f"{TICK_TO_DECISION} beside the harness floor (same feed, pacer and collector)")


def floor_ratios(floor: dict, main: dict) -> dict:
    f, m = floor[TICK_TO_DECISION], main[TICK_TO_DECISION]
    return {k: (m[k] / f[k] if m.get(k) and f.get(k) else None) for k in ("p50_us", "p99_us", "p999_us")}


def print_result(out: dict, title: str) -> None:
    if "floor" in out:
        print(result_table(out["floor"], "floor: the null service under the same load"))
        print()
    print(result_table(out, title))
    if "floor" in out:
        print()
        print(floor_table(out["floor"], out))
    print(f"results: {out['run_dir']}/summary.json")
