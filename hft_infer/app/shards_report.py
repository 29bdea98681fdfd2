"""What `hft-infer bench --shards N` prints, and when it exits 1 (hft_infer.app.shards runs it).

One table per run: a row per shard and one for all shards together
(tick_to_decision and the `service` stage percentiles, decided/s and every
accounting outcome), then, with `--with-floor`, the same table for the null
service and the aggregate tick_to_decision beside it.
"""

from __future__ import annotations

import sys

from hft_infer.accounting import reasons_line
from hft_infer.loop_stalls import loop_line
from hft_infer.metrics import TICK_TO_DECISION
from hft_infer.replay.collector import shed_by_instrument_line

_COLUMNS = (
    # header, function of a per-shard (or aggregate) row
    ("shard", lambda r: r["shard"]),
    ("instr", lambda r: r["instruments"]),
    ("sent", lambda r: r["accounting"]["sent"]),
    ("decided", lambda r: r["accounting"]["decided"]),
    ("shed", lambda r: r["accounting"]["shed"]),
    ("conflated", lambda r: r["accounting"]["conflated"]),
    ("rejected", lambda r: r["accounting"]["rejected"]),
    ("lost", lambda r: r["accounting"]["lost"]),
    ("decided/s", lambda r: round(r["decided_per_s"])),
    ("steps/s", lambda r: None if r.get("steps_per_s") is None else round(r["steps_per_s"])),
    ("busiest/s", lambda r: None if not r.get("busiest_instrument") else round(r["busiest_instrument"]["per_s"] or 0)),
    ("beyond steps", lambda r: r.get("beyond_step_rate")),
    ("t2d p50 µs", lambda r: r[TICK_TO_DECISION]["p50_us"]),
    ("p99", lambda r: r[TICK_TO_DECISION]["p99_us"]),
    ("p99.9", lambda r: r[TICK_TO_DECISION]["p999_us"]),
    ("max", lambda r: r[TICK_TO_DECISION]["max_us"]),
    ("service p50 µs", lambda r: r["stages"].get("service", {}).get("p50_us")),
    ("p99", lambda r: r["stages"].get("service", {}).get("p99_us")),
)


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return str(v)


def grid(header: list[str], rows: list[list]) -> str:
    """Plain text, every column as wide as its widest cell (never cut), numbers right-aligned."""
    cells = [header] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]).rstrip()
                     for r in cells)


def shards_table(out: dict, title: str) -> str:
    agg = dict(out["aggregate"], shard="all", instruments=sum(p["instruments"] for p in out["per_shard"]))
    rows = [[f(p) for _, f in _COLUMNS] for p in out["per_shard"]] + [[f(agg) for _, f in _COLUMNS]]
    acc, h = agg["accounting"], out["harness"]
    lines = [title, grid([c for c, _ in _COLUMNS], rows),
             f"tick_to_decision (t2d): intended send time -> decision received, decided events after the "
             f"{out['warmup_events']:,} warm-up events; service: receive -> decision sent, inside each shard; "
             f"the 'all' row adds the shards' histograms",
             "steps/s: the shard's model steps per second (measured intervals); busiest/s: the events/s of the "
             "shard's busiest instrument, the step rate a stateful model needs to decide every event "
             "(one row per instrument per step); beyond steps: the shard's events past steps/s on their instrument, "
             "shed at that step rate however many rows a step holds",
             f"accounting (all {acc['sent']:,} events of the one feed, warm-up included): "
             + ", ".join(f"{k}={v:,}" for k, v in acc.items())
             + f"; answers from the wrong shard or for no event: {agg['unmatched_decisions']:,}, "
               f"duplicates: {agg['duplicates']:,}",
             split_line(out.get("split")),
             reasons_line(agg.get("by_reason"), f"all {out['shards']} shards, summed"),
             f"harness: pacer {h['pacer']}" + (f" on core {h['pacer_core']}" if h["pacer_core"] is not None else "")
             + f", {h['collectors']} collector(s) ({h['collector']}; shards per collector "
               f"{h['shards_per_collector']}); feed: "
             + (f"up to {h['feed_batch']} due events per EventBatch frame, one frame per shard"
                if h.get("feed_batch", 1) > 1 else "one event per frame") + f"; {h['reason']}",
             pacer_line(out)]
    if out.get("service") != "null":
        lines.append(loop_line(agg.get("loop"), f"all {out['shards']} shards, summed"))
    return "\n".join(lines)


def split_line(split: dict | None) -> str:
    """How evenly the feed's events fell on the shards: the busiest shard sets what N deliver together."""
    if not split:
        return "feed split: -"
    return (f"feed split (by {split['by']}): busiest shard {split['busiest_over_mean']:.2f}x the mean events, "
            f"quietest {split['quietest_over_mean']:.2f}x"
            + ("" if split["by"] != "position % N" else "; --balance-shards splits by the feed's counts instead"))


def pacer_line(out: dict) -> str:
    """The pacer's lateness past the warm-up: an offered rate is only what it says while this is small."""
    lat = out.get("pacer_lateness") or {}
    if not lat.get("count"):
        return "pacer lateness: -"
    return (f"pacer lateness (actual - intended send, past the warm-up): p50 {lat['p50_us']:,.1f} µs, p99 "
            f"{lat['p99_us']:,.1f}, max {lat['max_us']:,.1f}")


def floor_line(floor: dict, main: dict) -> str:
    f, m = floor["aggregate"][TICK_TO_DECISION], main["aggregate"][TICK_TO_DECISION]
    rows = []
    for name, r in (("floor (null service)", f), ("service", m)):
        rows.append([name, r["count"], r["p50_us"], r["p99_us"], r["p999_us"], r["max_us"]])
    rows.append(["service / floor", ""] + [f"{m[k] / f[k]:.2f}x" if m.get(k) and f.get(k) else "-"
                                           for k in ("p50_us", "p99_us", "p999_us", "max_us")])
    return (f"{TICK_TO_DECISION}, all {main['shards']} shards, beside the harness floor (same feed, pacer, "
            f"collectors and shard split)\n"
            + grid(["", "count", "p50 µs", "p99 µs", "p99.9 µs", "max µs"], rows))


def print_shards(out: dict) -> None:
    n = out["shards"]
    engine = {p["engine"] for p in out["per_shard"]} - {None}
    what = "the null service (harness floor)" if out["service"] == "null" else \
        f"engine={','.join(sorted(engine)) or '-'}"
    if "floor" in out:
        print(shards_table(out["floor"], f"floor: the null service in {n} shard(s) under the same load"))
        print()
    print(shards_table(out, f"hft-infer bench --shards {n} — {out['rate_offered']:g} events/s offered, "
                            f"{out['rate_achieved']:,.0f} achieved, {what}"))
    shed_line = shed_by_instrument_line(out["aggregate"].get("shed_by_instrument"))
    if shed_line:
        print(shed_line)
    if "floor" in out:
        print()
        print(floor_line(out["floor"], out))
    print(f"results: {out['run_dir']}/summary.json")


def shards_exit_status(out: dict, label: str = "bench") -> int:
    """1, with a line saying why, when a shard failed, an event was lost, or an answer came
    from a shard that does not own its instrument."""
    reasons = []
    for name, o in ([("floor", out["floor"])] if "floor" in out else []) + [("", out)]:
        where = f" ({name} run)" if name else ""
        for p in o["per_shard"]:
            if p["service_exit_code"] not in (0, None):
                reasons.append(f"shard {p['shard']} exited with code {p['service_exit_code']}{where}; see "
                               f"{p['run_dir']}/service.log")
        acc = o["aggregate"]["accounting"]
        if acc["lost"] > 0:
            reasons.append(f"{acc['lost']:,} of {acc['sent']:,} events lost{where}: sent, but no shard decided, "
                           "shed, conflated or rejected them")
        if o["aggregate"]["unmatched_decisions"]:
            reasons.append(f"{o['aggregate']['unmatched_decisions']:,} answers name no event of their shard{where}")
    for r in reasons:
        print(f"{label}: exit 1: {r}", file=sys.stderr)
    return 1 if reasons else 0
