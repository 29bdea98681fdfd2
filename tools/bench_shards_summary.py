#!/usr/bin/env python3
"""The summary of tools/bench_shards.sh: one row per (model, shard count), the scaling efficiency.

    python3 tools/bench_shards_summary.py OUTDIR [--budget S] [--elapsed S]

Reads OUTDIR/runs.tsv (model, shards, offered/s, state, json path, note: one line per run
the script planned) and each run's `bench --shards --json` file; prints the table and
writes OUTDIR/summary.md and OUTDIR/summary.json. Efficiency from 1 to N shards:
decided/s(N) / (N x decided/s(1)), at the same offered rate per shard; it only says
something about capacity when one shard is saturated at that rate (decided < offered),
and the table says when it is not. A run cut off after its feed (timeout) still gets its decided/s
from its shards' service.json and the pacer's log where they are complete (`from_shards`), and
stays a failure. Exit 1 when a run failed or lost an event, or no run succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

_SENT = re.compile(r"pacer: sent (\d+) in ([0-9.]+) s")


def from_shards(run_dir: Path, shards: int) -> dict:
    """A run cut off after its feed (bench killed before its report: 12 shards under MPS took ~40 s
    to be READY in wave24): decided/s from each shard's service.json and the pacer's send time, as
    the report would compute it; {} unless the pacer finished and every shard wrote its summary.
    Tick-to-decision and lost need the collectors' report and stay unknown."""
    try:
        sent_line = _SENT.findall((run_dir / "pacer.log").read_text())
        accounts = [json.loads((run_dir / f"shard{i}" / "service" / "service.json").read_text())["accounting"]
                    for i in range(shards)]
    except (OSError, ValueError, KeyError):
        return {}
    if not sent_line:
        return {}
    sent, seconds = int(sent_line[-1][0]), float(sent_line[-1][1])
    decided = sum(a["decided"] for a in accounts)
    return {"decided_per_s": decided / seconds if seconds > 0 else None, "decided": decided, "sent": sent,
            "shed": sum(a["shed"] for a in accounts), "from_shards": True}


def load_rows(outdir: Path) -> list[dict]:
    rows = []
    tsv = outdir / "runs.tsv"
    for line in tsv.read_text().splitlines() if tsv.exists() else []:
        model, n, offered, state, path, note = (line.split("\t") + [""] * 6)[:6]
        row = {"model": model, "shards": int(n), "offered_per_s": float(offered), "state": state, "note": note}
        if state == "ok":
            try:
                out = json.loads(Path(path).read_text())
            except (OSError, ValueError) as e:
                row["state"], row["note"] = "no-json", f"{path}: {e}"
                rows.append(row)
                continue
            agg = out["aggregate"]
            acc = agg["accounting"]
            t2d = agg["tick_to_decision"]
            row |= {"decided_per_s": agg["decided_per_s"], "achieved_per_s": out["rate_achieved"],
                    "decided": acc["decided"], "shed": acc["shed"], "conflated": acc["conflated"],
                    "rejected": acc["rejected"], "lost": acc["lost"], "sent": acc["sent"],
                    "unmatched": agg["unmatched_decisions"],
                    "t2d_p50_us": t2d["p50_us"], "t2d_p99_us": t2d["p99_us"],
                    "service_p99_us_worst_shard": max((p["stages"].get("service", {}).get("p99_us") or 0.0
                                                       for p in out["per_shard"]), default=None),
                    "engine": ",".join(sorted({p["engine"] or "-" for p in out["per_shard"]})),
                    "hot_cores": sorted({c for p in out["per_shard"] for c in (p["service_cores_seen"] or [])})}
            if "floor" in out:
                f = out["floor"]["aggregate"]["tick_to_decision"]
                row |= {"floor_p50_us": f["p50_us"], "floor_p99_us": f["p99_us"]}
            if row["lost"] or row["unmatched"]:
                row["state"] = "lost"
        elif state in ("timeout", "cut-budget") and (got := from_shards(Path(path).with_suffix(""), int(n))):
            row |= got
            row["note"] = ((note + "; " if note else "")
                           + "decided/s from the shards' service.json: cut off after the feed")
        rows.append(row)
    return rows


def efficiencies(rows: list[dict]) -> dict:
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        ok = {r["shards"]: r for r in rows if r["model"] == model and r["state"] == "ok"}
        one = ok.get(1)
        for n in (2, 4, 8):
            if one and n in ok and one["decided_per_s"]:
                out[f"{model} 1->{n}"] = ok[n]["decided_per_s"] / (n * one["decided_per_s"])
        if one:
            out[f"{model} 1 shard saturated"] = one["decided"] < 0.99 * one["sent"]
    return out


def fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def table(rows: list[dict]) -> str:
    header = ["model", "N", "offered/s", "decided/s", "shed", "lost", "t2d p50 µs", "t2d p99 µs",
              "floor p50 µs", "floor p99 µs", "service p99 µs (worst shard)", "engine", "hot cores", "state"]
    body = [[r["model"], str(r["shards"]), fmt(r["offered_per_s"], 0), fmt(r.get("decided_per_s"), 0),
             fmt(r.get("shed")), fmt(r.get("lost")), fmt(r.get("t2d_p50_us")), fmt(r.get("t2d_p99_us")),
             fmt(r.get("floor_p50_us")), fmt(r.get("floor_p99_us")), fmt(r.get("service_p99_us_worst_shard")),
             r.get("engine", "-"), ",".join(map(str, r.get("hot_cores", []))) or "-",
             r["state"] + (f" ({r['note']})" if r["state"] != "ok" and r["note"] else "")] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--elapsed", type=float, default=None)
    a = ap.parse_args(argv)
    outdir = Path(a.outdir)
    rows = load_rows(outdir)
    eff = efficiencies(rows)
    mps = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    lines = ["# bench_shards: N shards on one host, one feed", "",
             f"CUDA MPS: on (CUDA_MPS_PIPE_DIRECTORY={mps}; each shard's share of the SMs: "
             f"{os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '100')} %)" if mps else
             "CUDA MPS: off (the shards' CUDA contexts time-slice the GPU; tools/with_mps.sh runs with it)",
             "", table(rows), ""]
    for k, v in eff.items():
        lines.append(f"- {k}: " + (fmt(v) if isinstance(v, bool) else f"{v * 100:.0f} %"))
    if not any(k.endswith("1->4") for k in eff):
        lines.append("- scaling efficiency 1->4: not computed (needs both the N=1 and the N=4 run)")
    lines += ["", "decided/s: decisions over the pacer's send time, all shards; t2d: tick_to_decision of all "
              "shards' decided events (histograms added); floor: the null service in as many shards, same feed "
              "(lstm_a runs). Efficiency 1->N = decided/s(N) / (N x decided/s(1)) at the same offered rate per "
              "shard: a capacity figure only where one shard is saturated."]
    if a.budget is not None and a.elapsed is not None:
        lines.append(f"time: {a.elapsed:.0f} s of a {a.budget:.0f} s budget")
    text = "\n".join(lines)
    print(text)
    (outdir / "summary.md").write_text(text + "\n")
    (outdir / "summary.json").write_text(json.dumps({"runs": rows, "efficiency": eff, "cuda_mps_pipe": mps,
                                                     "budget_s": a.budget, "elapsed_s": a.elapsed}, indent=2))
    bad = [r for r in rows if r["state"] not in ("ok", "skipped-budget", "skipped-cores", "cut-budget")]
    for r in bad:
        print(f"bench_shards: {r['model']} N={r['shards']}: {r['state']} {r['note']}", file=sys.stderr)
    if not any(r["state"] == "ok" for r in rows):
        print("bench_shards: no run succeeded", file=sys.stderr)
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
