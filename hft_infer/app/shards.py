"""`hft-infer bench --shards N`: N service processes behind one feed, measured per shard and together.

    one feed (the pacer's PUB, every instrument)
      -> shard I of N: `hft-infer serve --shard I/N` (or the null service with the same
         universe split), its own service.name (`<name>-sI`), so that every endpoint
         written with {name} is its own; its ingest endpoint is the one feed; placed by
         the config's [cpu] with slot = I (one core each under `cores = "auto"`)
      -> each shard subscribes to its instruments' topics only (position % N == I, or
         universe.shard_weights' plan: hft_infer/sharding.py)
      -> collector processes, each with one SUB per shard it serves (a Status names no
         shard, so frames are told apart by the socket they came on)
      -> per shard: the events of its instruments matched with its answers and its
         final Status (hft_infer.replay.collector.analyse on that subset), its stage
         histograms from its own control endpoint; together: the sums, and the
         histograms added.

Over iceoryx2 (no topics) each shard has its own feed and decision services, named from its
own service.name: the pacer publishes each shard's EventBatch frames on its shard's feed
service (replay/pacer_proc.py --shard-endpoints), the collectors hold one subscriber per shard.

Every event of the feed belongs to exactly one shard (its instrument's
position); an answer that comes from the wrong shard is counted as unmatched
there and as lost for the event, so `lost = 0` and `unmatched = 0` together
say that every event ended in exactly one shard as decided, shed, conflated
or rejected.

The drive follows hft_infer.app.drive step by step (the same pacer and
collector processes and protocol); only the number of services differs.
Tables and the exit status: hft_infer.app.shards_report.

CLI level: may use `replay` (the service core may not).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from hft_infer.affinity import plan_for_config
from hft_infer.app.drive import (
    START_LEAD_NS,
    HarnessOptions,
    Load,
    StatsReceiver,
    Target,
    effective_feed_batch,
    lateness_histogram,
    machine_info,
    placed_hot_cores,
    restore_process,
    run_reasons,
    run_schedule,
    send_all,
)
from hft_infer.app.launcher import (
    MIN_CORES_TO_PIN,
    READY_TIMEOUT_S,
    ServiceProcess,
    plan_harness,
    private_runtime_dir,
    tail,
)
from hft_infer.channels import check_transports, decisions_address, feed_address
from hft_infer.clock import perf_ns
from hft_infer.config import Config, expand_endpoint, load_config, to_toml_dict
from hft_infer.errors import UserError
from hft_infer.metrics import TICK_TO_DECISION, new_histogram, summarize
from hft_infer.metrics.hlog import write_hgrm
from hft_infer.replay.child import Child, ChildError, wait_replies
from hft_infer.replay.collector import analyse, decode_frames, merge_shed_by_instrument, shed_by_instrument
from hft_infer.replay.collector_proc import load_frames, load_sources
from hft_infer.replay.events import beyond_step_rate, busiest_instrument
from hft_infer.replay.pacer import save_feed
from hft_infer.sharding import load_spread

_TCP_PORT = re.compile(r"^(tcp://.+:)(\d+)$")


@dataclass
class Shard:
    index: int
    count: int
    name: str
    cfg: Config  # the shard's own config (universe split, endpoints)
    overrides: list[str]  # what the shard's command line adds to the user's --set (not the split)
    owned: list[int]  # instrument ids (universe.owned_ids of the shard)

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def _per_shard_endpoint(field: str, template: str, index: int) -> str | None:
    """None: the template already differs per shard ({name}); else port + index for tcp."""
    if "{name}" in template:
        return None
    m = _TCP_PORT.match(template)
    if m and int(m.group(2)) > 0:
        return f"{m.group(1)}{int(m.group(2)) + index}"
    raise UserError(f"--shards: {field} = {template!r} would be the same for every shard: write it with "
                    "{name} (each shard is named <service.name>-s<I>) or as tcp://HOST:PORT (shard I uses PORT+I)")


def check_shard_count(n: int, cfg: Config, feed_instruments: int) -> None:
    ids = cfg.universe.all_ids()
    if n < 1:
        raise UserError(f"--shards must be >= 1 (got {n})")
    for section, sc in (("ingest", cfg.ingest), ("egress", cfg.egress)):
        # iceoryx2 has no topics: each shard has its own services, named from its own service.name
        if sc.transport == "iceoryx2" and "{name}" not in sc.shm_service:
            raise UserError(f"--shards over iceoryx2: {section}.shm_service = {sc.shm_service!r} would be the same "
                            "service for every shard: write it with {name} (each shard is named "
                            "<service.name>-s<I>)")
    if cfg.universe.shard_count != 1:
        raise UserError(f"--shards splits the whole universe itself: the config already names shard "
                        f"{cfg.universe.shard_index}/{cfg.universe.shard_count} (universe.shard_count = 1 needed)")
    if n > len(ids):
        raise UserError(f"--shards {n} exceeds the universe's {len(ids)} instruments: a shard would have none")
    if n > feed_instruments:
        raise UserError(f"--shards {n} with --instruments {feed_instruments}: a shard would get no events "
                        f"(need --instruments >= {n})")
    if cfg.ingest.transport == "zmq" and (cfg.ingest.socket_type != "sub" or cfg.ingest.bind
                                          or not cfg.ingest.topic_frame):
        raise UserError("--shards offers one PUB feed that every shard topic-filters: needs ingest.socket_type = "
                        "\"sub\", ingest.bind = false and ingest.topic_frame = true")
    if cfg.egress.transport == "zmq" and not cfg.egress.bind:
        raise UserError("--shards connects a collector to each shard's decision socket: needs egress.bind = true")
    for field, template in _per_shard_fields(cfg):
        _per_shard_endpoint(field, template, 0)


def _per_shard_fields(cfg: Config) -> list[tuple[str, str]]:
    """The zmq endpoints that must differ per shard (an iceoryx2 egress has none: its service does)."""
    fields = [("metrics.control_endpoint", cfg.metrics.control_endpoint)]
    if cfg.egress.transport == "zmq":
        fields.insert(0, ("egress.endpoint", cfg.egress.endpoint))
    return fields


def shard_layout(target: Target, n: int) -> list[Shard]:
    """The N shards' configs; call with HFT_INFER_RUNTIME_DIR set (the feed endpoint is expanded once,
    with the base name, and given to every shard literally)."""
    base = target.cfg
    feed = expand_endpoint(base.ingest.endpoint, base)
    shards = []
    for i in range(n):
        name = f"{base.service.name}-s{i}"
        # every shard on this host, whatever cpu.host_shards a multi-host config names
        own = [f"service.name={json.dumps(name)}", f"ingest.endpoint={json.dumps(feed)}", "cpu.host_shards=[]"]
        for field, template in _per_shard_fields(base):
            ep = _per_shard_endpoint(field, template, i)
            if ep is not None:
                own.append(f"{field}={json.dumps(ep)}")
        split = [f"universe.shard_index={i}", f"universe.shard_count={n}"]
        cfg = load_config(target.config_path, list(target.overrides) + own + split)
        shards.append(Shard(i, n, name, cfg, own, cfg.universe.owned_ids()))
    return shards


def shard_cores(shards: list[Shard]) -> list[int]:
    """The hot cores the shards will place themselves on (slot = shard index)."""
    cores: list[int] = []
    for s in shards:
        if s.cfg.cpu.cores != "none":
            cores += plan_for_config(s.cfg, s.cfg.runner.device, use_torch=False).hot_cores
    return sorted(set(cores))


HELPER_CORES = 2  # kept for I/O threads and the rest when collectors are counted (collector_count)


def collector_count(n: int, requested: int | None, pool: int, service_cores: int) -> int:
    """`requested`, or the most collectors (a divisor of n, so each serves as many shards) that
    get a core of their own beside the shards', the pacer's and two helper cores (one if that is
    all there is). Two, because the libzmq I/O threads of every shard, the pacer and the
    collectors run there: at 1M events/s over 10-11 lstm_a shards they kept 1.1-1.6 cores busy,
    and 12 shards with two collectors, which left them one core, saturated it in every run and
    fell into spells of every event read past its deadline (302k-911k decided/s against 911k-962k
    over 11 shards with one collector, same host; BENCHMARKS.md wave 27)."""
    if requested is not None:
        if requested < 1:
            raise UserError(f"--shard-collectors must be >= 1 (got {requested})")
        return min(requested, n)
    if pool < MIN_CORES_TO_PIN:
        return 1
    fits = [d for d in range(1, n + 1) if n % d == 0 and pool - service_cores >= 1 + HELPER_CORES + d]
    return max(fits) if fits else 1


def drive_shards(load: Load, target: Target, n: int, run_dir: Path, *, quiet: bool = False,
                 label: str = "bench", extra: dict | None = None, harness: HarnessOptions | None = None,
                 collectors: int | None = None) -> dict:
    """Run the feed through N shards once; returns the result dict (per_shard, aggregate, ...)."""
    cfg = target.cfg
    harness = harness or HarnessOptions()
    check_transports(cfg)
    if not target.start_service:
        raise UserError("--shards starts its own shards; it cannot drive a running service (start the shards "
                        "with `hft-infer serve --shard I/N` and replay into them instead)")
    if load.event_record is not None:
        raise UserError("--shards: only feeds whose every frame is an event (bench's synthetic feed)")
    run_dir.mkdir(parents=True, exist_ok=True)
    work = private_runtime_dir(f"hft-{label}-")
    saved_env, saved_mask = os.environ.get("HFT_INFER_RUNTIME_DIR"), os.sched_getaffinity(0)
    os.environ["HFT_INFER_RUNTIME_DIR"] = work  # the children inherit it; endpoints expand into it
    children: list[Child] = []
    services: list[ServiceProcess] = []
    stats: list[StatsReceiver | None] = []
    ctx = None

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    try:
        shards = shard_layout(target, n)
        cores = shard_cores(shards)
        k_coll = collector_count(n, collectors, len(os.sched_getaffinity(0)), len(cores))
        plan = plan_harness(cfg, harness.pacer, k_coll, service_cores=cores)
        feed_file = load.feed_file or os.path.join(work, "feed.npz")
        if load.feed_file is None:
            save_feed(feed_file, load.feed, load.offsets_ns)
        pinned = plan.pacer_core is not None
        if pinned:
            os.sched_setaffinity(0, plan.helper_cores + plan.service_cores)
        ctx = zmq.Context()
        io = ",".join(map(str, plan.helper_cores)) if pinned else ""
        # distinct subscriptions reach the XPUB once: every instrument's topic, the service topic (all
        # shards'), and each shard's batch topic (codec.shard_batch_topic)
        n_topics = len(cfg.universe.all_ids()) + 1 + n
        feed_batch = effective_feed_batch(cfg, load.feed, harness.feed_batch)
        # over iceoryx2 every shard has its own feed service (no topics): the pacer publishes each
        # shard's EventBatch frames on its shard's (--shard-endpoints), and waits for N subscribers
        feed_at = ["--endpoint", feed_address(cfg)]
        if cfg.ingest.transport == "iceoryx2":
            if n > 1 and feed_batch < 2:
                raise UserError("--shards over iceoryx2 (ingest.transport) sends each shard its own EventBatch "
                                "frames: needs --feed-batch > 1")
            n_topics = n
            feed_at = ["--endpoint", feed_address(shards[0].cfg), "--shm-buffer", str(cfg.ingest.shm_buffer)]
            if n > 1:
                feed_at += ["--shard-endpoints", ",".join(feed_address(s.cfg) for s in shards)]
        batching = []
        if feed_batch > 1:  # one EventBatch per shard of the events due together (replay/pacer.py)
            shard_map = os.path.join(work, "shards.npz")  # each shard's own ids (universe.owned_ids)
            np.savez(shard_map, ids=np.asarray([i for s in shards for i in s.owned], dtype=np.int64),
                     shard=np.asarray([s.index for s in shards for _ in s.owned], dtype=np.int64), count=n)
            batching = ["--feed-batch", str(feed_batch), "--shard-map", shard_map]
        pacer = Child("pacer", "hft_infer.replay.pacer_proc",
                      ["--feed", feed_file, *feed_at,
                       "--out", os.path.join(work, "pacer.npz"), "--topics", str(n_topics), "--settle-ms", "0",
                       "--io-cores", io, *(["--core", str(plan.pacer_core)] if pinned else []),
                       *(["--spin"] if plan.pacer_spin else []), *batching], run_dir / "pacer.log")
        children.append(pacer)
        wait_replies({pacer: "bound"}, 300.0)
        groups = [[s for s in shards if s.index % k_coll == k] for k in range(k_coll)]
        coll = []
        for k, (group, core) in enumerate(zip(groups, plan.collector_cores)):
            eps = sum((["--endpoint", decisions_address(s.cfg)] for s in group), [])
            eps += ["--shm-buffer", str(cfg.egress.shm_buffer)]
            coll.append(Child(f"collector {k}", "hft_infer.replay.collector_proc",
                              [*eps, "--out", os.path.join(work, f"collector{k}.npz"),
                               "--capacity", str(len(load.feed) + 4096), "--io-cores", io,
                               *(["--core", str(core)] if core is not None else []),
                               *(["--spin"] if plan.collector_spin else []),
                               *([] if cfg.egress.topic_frame else ["--no-topic-frame"])],
                              run_dir / f"collector{k}.log"))
        children += coll
        null_args = ["--egress", target.null_egress, "--delay-us", str(target.null_delay_us)]
        for s in shards:
            stats.append(None if target.null else
                         StatsReceiver(ctx, expand_endpoint(s.cfg.metrics.control_endpoint, s.cfg)))
            where = run_dir / f"shard{s.index}"
            where.mkdir(parents=True, exist_ok=True)
            # serve splits the universe itself from --shard; the null service takes the same split as overrides
            svc = ServiceProcess(config=target.config_path,
                                 overrides=list(target.overrides) + s.overrides +
                                 ([f"universe.shard_index={s.index}", f"universe.shard_count={n}"]
                                  if target.null else []),
                                 run_dir=where / "service", log_dir=where, env=os.environ.copy(), null=target.null,
                                 extra_args=null_args if target.null else ["--shard", s.label])
            services.append(svc)
            svc.start()
        if pinned:
            os.sched_setaffinity(0, plan.helper_cores)

        def idle() -> None:
            for st in stats:
                if st is not None:
                    st.poll()
            for s, svc in zip(shards, services):
                if svc.proc.poll() is not None:
                    raise UserError(f"shard {s.label} exited (code {svc.proc.returncode}); the end of "
                                    f"{svc.log_path}:\n{tail(svc.log_path)}")

        wait_replies({pacer: "subscribed", **{c: "ready" for c in coll}}, READY_TIMEOUT_S, on_idle=idle)
        seen = [placed_hot_cores(svc.log_path) for svc in services]
        flat = [c for cs in seen if cs for c in cs]
        if len(flat) != len(set(flat)):
            say(f"{label}: warning: shards share hot cores {seen}: the measurement shares cores")
        if set(flat) & ({plan.pacer_core} | set(plan.collector_cores)) - {None}:
            say(f"{label}: warning: a shard placed itself on a core the harness expected free "
                f"(shards {seen}, planned {plan.service_cores})")
        say(f"{label}: {n} shard(s) ready; sending {len(load.feed):,} events ({load.description}); "
            f"{plan.describe()}")
        start = perf_ns() + START_LEAD_NS
        for st in stats:
            if st is not None:
                st.measure(load, start)
        run_schedule(pacer, coll, load, start, label=label, quiet=quiet, idle=idle)
        for svc in services:
            svc.proc.terminate()
        got = wait_replies(send_all(coll, "final", 30.0), 40.0, on_idle=lambda: [st.poll() for st in stats if st])
        if any(v != "final" for v in got.values()):
            say(f"{label}: warning: not every shard sent its final Status within 30 s")
        for svc in services:
            svc.wait_exit(30.0)
        for _ in range(20):  # the final snapshots may trail the final Status by a moment
            live = [st for st in stats if st is not None]
            for st in live:
                st.poll()
            if all(st.snapshots and st.snapshots[-1].final for st in live):
                break
            time.sleep(0.05)
        wait_replies(send_all(coll, "stop"), 120.0)
        with np.load(os.path.join(work, "pacer.npz")) as z:
            intended, actual, sent = z["intended"], z["actual"], int(z["sent"])
            elapsed_s = float(z["elapsed_s"])
        per_shard_frames: list[tuple[list, list]] = [([], []) for _ in shards]
        for k, group in enumerate(groups):
            path = os.path.join(work, f"collector{k}.npz")
            frames, times = load_frames(path)
            src = load_sources(path)
            for j, s in enumerate(group):
                rows = np.flatnonzero(src == j)
                per_shard_frames[s.index][0].extend(frames[r] for r in rows)
                per_shard_frames[s.index][1].append(times[rows])
    except ChildError as e:
        raise UserError(str(e)) from None
    finally:
        for child in children:
            child.close()
        for svc in services:
            svc.close()
        if ctx is not None:
            ctx.destroy(linger=0)
        restore_process(saved_env, saved_mask, work)

    inst = load.events["instrument"][:sent]
    per_shard, hists, stage_hists = [], [], []
    for s, (frames, times), st, svc, cores_seen in zip(shards, per_shard_frames, stats, services, seen):
        idx = np.flatnonzero(np.isin(inst, np.asarray(s.owned, dtype=inst.dtype)))
        answers = decode_frames(frames, np.concatenate(times) if times else np.zeros(0, np.int64))
        res = analyse(answers, load.events["instrument"][idx], load.events["seq"][idx], intended[idx], idx.size,
                      measure_from=int(np.count_nonzero(idx < load.measure_from)))
        hists.append(res.tick_histogram)
        if st is not None and "service" in st.hists:
            stage_hists.append(st.hists["service"])
        status = res.service_status
        steps_per_s = st.counter_rate("batches") if st is not None else None
        per_shard.append({
            "shard": s.label, "name": s.name, "instruments": int(np.unique(inst[idx]).size),
            "universe_instruments": len(s.owned),
            "engine": status.engine if status else None,
            "stages": st.summary() if st is not None else {},
            TICK_TO_DECISION: res.tick_to_decision, "send_to_service_recv": res.send_to_service_recv,
            "accounting": res.accounting, "decided_per_s": res.accounting["decided"] / elapsed_s if elapsed_s else 0.0,
            "by_reason": run_reasons(status, None),
            "busiest_instrument": busiest_instrument(inst[idx], elapsed_s),
            "steps_per_s": steps_per_s,
            "beyond_step_rate": beyond_step_rate(inst[idx], elapsed_s, steps_per_s),
            "shed_by_instrument": shed_by_instrument(res.outcome, inst[idx]),
            "loop": st.loop_health() if st is not None else None,
            "duplicates": res.duplicates, "unmatched_decisions": res.unmatched,
            "service_exit_code": svc.proc.returncode, "service_cores_seen": cores_seen,
            "run_dir": str(run_dir / f"shard{s.index}")})
        if res.tick_histogram.get_total_count():
            write_hgrm(res.tick_histogram, str(run_dir / f"shard{s.index}" / f"{TICK_TO_DECISION}.hgrm"))
        if st is not None:
            st.write_timeline(run_dir / f"shard{s.index}" / "snapshots.jsonl")
    owned_any = np.isin(inst, np.asarray(sorted({i for s in shards for i in s.owned}), dtype=inst.dtype))
    out = {
        "config": to_toml_dict(cfg),
        "service": "null" if target.null else "child",
        "shards": n,
        "rate_offered": (extra or {}).get("rate_offered"),
        "rate_achieved": (sent - 1) / elapsed_s if sent > 1 else 0.0,
        "per_shard": per_shard,
        "aggregate": aggregate(per_shard, hists, stage_hists, sent, elapsed_s,
                               unowned=int(np.count_nonzero(~owned_any))),
        "warmup_events": load.measure_from,
        "harness": plan.as_dict() | {"collectors": k_coll, "shards_per_collector": [len(g) for g in groups],
                                     "feed_batch": feed_batch},
        "pacer_lateness_max_us": float(np.max(actual[:sent] - intended[:sent]) / 1e3) if sent else None,
        "pacer_lateness": summarize(lateness_histogram(actual[:sent] - intended[:sent], load.measure_from)),
        "run_dir": str(run_dir),
        "machine": machine_info(),
    } | ({"null_service": {"egress": target.null_egress, "delay_us": target.null_delay_us}} if target.null else {}) \
      | (extra or {})
    steps = [p["steps_per_s"] for p in per_shard]
    out["aggregate"]["steps_per_s"] = None if None in steps else sum(steps)
    beyond = [p["beyond_step_rate"] for p in per_shard]
    out["aggregate"]["beyond_step_rate"] = None if None in beyond else sum(beyond)
    reasons = [p["by_reason"] for p in per_shard]  # None: a shard sent no Status
    out["aggregate"]["by_reason"] = None if None in reasons else {
        name: sum(r.get(name, 0) for r in reasons) for name in sorted({n for r in reasons for n in r})}
    loops = [p["loop"] for p in per_shard]  # counters summed; span_s: the run's measured seconds (the longest)
    out["aggregate"]["loop"] = None if None in loops else {
        k: (max if k == "span_s" else sum)(lp[k] for lp in loops) for k in loops[0]}
    out["aggregate"]["busiest_instrument"] = busiest_instrument(inst, elapsed_s)
    out["aggregate"]["shed_by_instrument"] = merge_shed_by_instrument([p["shed_by_instrument"] for p in per_shard])
    busiest, quietest = load_spread([p["accounting"]["sent"] for p in per_shard])
    out["split"] = {"by": "universe.shard_weights" if shards[0].cfg.universe.shard_weights else "position % N",
                    "busiest_over_mean": busiest, "quietest_over_mean": quietest}
    merged = out["aggregate"].pop("_tick_histogram")
    if merged.get_total_count():
        write_hgrm(merged, str(run_dir / f"{TICK_TO_DECISION}.hgrm"))
    return out


def aggregate(per_shard: list[dict], hists: list, stage_hists: list, sent: int, elapsed_s: float, *,
              unowned: int) -> dict:
    """The shards together: counters summed, histograms added (exact: same bucket layout)."""
    keys = ("sent", "received", "decided", "shed", "conflated", "rejected", "lost")
    acc = {k: sum((p["accounting"][k] or 0) for p in per_shard) for k in keys}
    # an event no shard owns was offered but can end nowhere: lost
    acc["lost"] += unowned
    acc["sent"] = sent
    acc["unowned"] = unowned
    tick = new_histogram()
    for h in hists:
        tick.add(h)
    service = None
    if stage_hists:
        service = new_histogram(stage_hists[0].highest_trackable_value, stage_hists[0].significant_figures)
        for h in stage_hists:
            service.add(h)
    return {"accounting": acc, TICK_TO_DECISION: summarize(tick),
            "stages": {"service": summarize(service)} if service is not None else {},
            "decided_per_s": acc["decided"] / elapsed_s if elapsed_s else 0.0,
            "unmatched_decisions": sum(p["unmatched_decisions"] for p in per_shard),
            "duplicates": sum(p["duplicates"] for p in per_shard), "_tick_histogram": tick}
