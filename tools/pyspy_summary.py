#!/usr/bin/env python3
"""Where a busy-polling service's hot thread spends its time, from a py-spy speedscope profile.

    py-spy record --nonblocking -r 1000 -f speedscope -o shard0.json -p PID
    python tools/pyspy_summary.py shard0.json [more.json ...] [--marker NAME,...] [--top 30]

A service under load busy-polls before and after its feed, and starts up (kernels, graph
captures) before that, so a profile of its whole life says little about the loaded loop. This
tool keeps the samples of the *feed window*: from the first to the last sample whose stack holds
one of the marker functions (by default the ingest's EventBatch column path and the per-frame
path: functions that run only when events arrive), in the thread with the most samples there
(the hot loop). py-spy's speedscope samples are in time order, each a stack of frame indices
(root first) with its weight in seconds.

For each file: the window's span and samples; the inclusive share of each function (in the stack
at all: where whole phases go, e.g. Stepper.ingest against Stepper.submit and Stepper.complete);
and the self share of each (function, line) (where the leaf sat: a numpy call shows as the line
that calls it, py-spy not reading native frames unless asked). Shares are of the window's samples;
with 1,000 samples a second, a 2 s feed gives ~2,000 per thread, so +-1-2 points.

`gpu_session.sh`'s `pyspy_watch` records the shards of a run this way (BENCHMARKS.md says where).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

DEFAULT_MARKERS = "EventBatchPaths._batch_columns,Ingest._handle"


def load(path: str) -> tuple[list[dict], list[dict]]:
    """(frames, profiles) of a py-spy speedscope file."""
    with open(path) as f:
        doc = json.load(f)
    return doc["shared"]["frames"], [p for p in doc["profiles"] if p.get("type") == "sampled"]


def window(samples: list[list[int]], marked: set[int]) -> tuple[int, int]:
    """[first, last + 1) over the samples whose stack holds a marked frame; (0, 0) if none does."""
    hits = [i for i, stack in enumerate(samples) if marked.intersection(stack)]
    return (hits[0], hits[-1] + 1) if hits else (0, 0)


def summarize(path: str, markers: list[str], top: int) -> str:
    frames, profiles = load(path)
    names = [fr["name"] for fr in frames]
    marked = {i for i, name in enumerate(names) if name in markers}
    best = None  # (samples in the window, profile, lo, hi)
    for prof in profiles:
        lo, hi = window(prof["samples"], marked)
        if best is None or hi - lo > best[0]:
            best = (hi - lo, prof, lo, hi)
    out = [f"# {os.path.basename(path)}"]
    if best is None or best[0] == 0:
        out.append(f"no sample holds a marker ({', '.join(markers)}): no feed window")
        return "\n".join(out)
    n, prof, lo, hi = best
    samples, weights = prof["samples"][lo:hi], prof["weights"][lo:hi]
    span = sum(weights)
    incl: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    for stack, w in zip(samples, weights):
        for name in {names[i] for i in stack}:
            incl[name] += w
        if stack:
            leaf = frames[stack[-1]]
            own[f"{leaf['name']} ({os.path.basename(leaf['file'])}:{leaf['line']})"] += w
    out.append(f"thread {prof['name']}: feed window samples {lo}..{hi} of {len(prof['samples'])}, "
               f"{n:,} samples, {span:.2f} s sampled")
    out.append(f"\n## inclusive share (in the stack), top {top}\n\n| function | % |\n| --- | ---: |")
    out += [f"| {name} | {100 * w / span:.1f} |" for name, w in incl.most_common(top)]
    out.append(f"\n## self share (the leaf, by line), top {top}\n\n| function (file:line) | % |\n| --- | ---: |")
    out += [f"| {name} | {100 * w / span:.1f} |" for name, w in own.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profiles", nargs="+", help="py-spy speedscope files (-f speedscope)")
    ap.add_argument("--marker", default=DEFAULT_MARKERS, metavar="NAME,...",
                    help=f"functions (py-spy's names) that mark the feed window (default {DEFAULT_MARKERS})")
    ap.add_argument("--top", type=int, default=30, help="rows of each table (default 30)")
    a = ap.parse_args(argv)
    markers = [m for m in a.marker.split(",") if m]
    rc = 0
    for path in a.profiles:
        try:
            print(summarize(path, markers, a.top), end="\n\n")
        except (OSError, ValueError, KeyError) as e:
            print(f"pyspy_summary: {path}: {e}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
