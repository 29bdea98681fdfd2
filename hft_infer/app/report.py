"""`hft-infer report`: compare runs in one self-contained HTML page (and a PNG).

Sources, any mix:
- a run directory (serve, bench, replay, the control process): its
  `summary.json` (bench/replay) or `service.json` (serve) gives the table and
  the accounting; its `*.hlog` (interval logs, merged per tag) and `*.hgrm`
  (percentile distributions) give the curves. Subdirectories one level down
  are searched too (bench keeps the service's files in `service/`).
- an `.hlog` file: curves and table from its merged intervals.
- an `.hgrm` file: one stage's curve and table (stage = file name).

Where several sources give the same stage, a histogram (.hlog) beats a
percentile listing (.hgrm) for the curve, and the run's JSON beats both for
the table (it is the service's own complete count, while a log may have
missed snapshots).

The HTML embeds the plot as inline SVG and has no links to fetch anything;
the PNG is the same figure. matplotlib (and numpy) are imported when a
report is made, not when the CLI builds its parser.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import html
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hft_infer import __version__
from hft_infer.errors import UserError
from hft_infer.metrics import SERVICE_STAGES, TICK_TO_DECISION, summarize
from hft_infer.metrics.histograms import percentile_values
from hft_infer.metrics.hlog import HlogError, merge_by_tag, read_hgrm, read_hlog

if TYPE_CHECKING:  # numpy is imported where it is used: building the CLI parser stays light
    import numpy as np

SUMMARY_FILES = ("summary.json", "service.json")
TABLE_KEYS = (("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9"), ("max_us", "max"))
ACCOUNTING_KEYS = ("sent", "received", "decided", "shed", "conflated", "rejected", "lost", "pending")
RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


@dataclass
class Curve:
    x: np.ndarray  # nines: -log10(1 - p)
    values_us: np.ndarray
    source: str  # file it came from
    count: int
    max_us: float | None


@dataclass
class Run:
    label: str
    path: str
    summary: dict | None = None
    summary_file: str | None = None
    curves: dict[str, Curve] = field(default_factory=dict)
    table: dict[str, dict] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    @property
    def accounting(self) -> dict | None:
        acc = (self.summary or {}).get("accounting")
        return acc if isinstance(acc, dict) else None


# --- loading -------------------------------------------------------------------

def _user_error(msg: str) -> Exception:
    return UserError(msg)


def _nines(percentiles: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return -np.log10(1.0 - np.asarray(percentiles, dtype=np.float64) / 100.0)


def curve_from_histogram(hist, source: str) -> Curve | None:
    """Dense curve up to the sample's resolution (p <= 1 - 1/count), capped at 6 nines."""
    n = int(hist.get_total_count())
    if n == 0:
        return None
    top = min(6.0, max(1.0, math.log10(n)))
    x = np.arange(0.0, top + 1e-9, 0.05)
    pct = 100.0 * (1.0 - 10.0 ** -x)
    return Curve(x, percentile_values(hist, pct) / 1e3, source, n, hist.get_max_value() / 1e3)


def curve_from_hgrm(path: str) -> Curve | None:
    d = read_hgrm(path)
    keep = d.percentiles < 100.0  # 100 % is at infinity on the nines axis
    if not keep.any():
        return None
    return Curve(_nines(d.percentiles[keep]), d.values[keep], path, d.total, d.max_value)


def table_from_histogram(hist) -> dict:
    return summarize(hist)


def table_from_curve(c: Curve) -> dict:
    """Percentiles read off a listing: the first row at or past each percentile."""
    out = {"count": c.count, "max_us": c.max_us}
    for key, p in (("p50_us", 50.0), ("p90_us", 90.0), ("p99_us", 99.0), ("p999_us", 99.9)):
        i = np.searchsorted(c.x, _nines(np.array([p]))[0] - 1e-9)
        out[key] = float(c.values_us[i]) if i < len(c.x) else c.max_us
    return out


def _load_hlog(run: Run, path: str) -> None:
    try:
        merged = merge_by_tag(read_hlog(path))
    except HlogError as e:
        raise _user_error(str(e)) from None
    for tag, hist in merged.items():
        stage = tag or Path(path).stem
        c = curve_from_histogram(hist, path)
        if c is not None and (stage not in run.curves or run.curves[stage].source.endswith(".hgrm")):
            run.curves[stage] = c
            run.table.setdefault(stage, table_from_histogram(hist))
    run.sources.append(path)


def _load_hgrm(run: Run, path: str) -> None:
    stage = Path(path).stem
    if stage in run.curves:
        return  # a histogram already gave this stage
    c = curve_from_hgrm(path)
    if c is not None:
        run.curves[stage] = c
        run.table.setdefault(stage, table_from_curve(c))
        run.sources.append(path)


def _summary_tables(summary: dict) -> dict[str, dict]:
    out = {}
    for stage, row in (summary.get("stages") or {}).items():
        if isinstance(row, dict) and row.get("count"):
            out[stage] = row
    ttd = summary.get(TICK_TO_DECISION)
    if isinstance(ttd, dict) and ttd.get("count"):
        out[TICK_TO_DECISION] = ttd
    return out


def load_run(source: str, label: str) -> Run:
    p = Path(source)
    if not p.exists():
        raise FileNotFoundError(2, "No such file or directory", source)
    run = Run(label=label, path=source)
    if p.is_dir():
        dirs = [p] + sorted(d for d in p.iterdir() if d.is_dir())
        for d in dirs:
            for name in SUMMARY_FILES:
                f = d / name
                if run.summary is None and f.is_file():
                    try:
                        run.summary = json.loads(f.read_text())
                    except (OSError, ValueError) as e:
                        raise _user_error(f"{f}: not readable JSON: {e}") from None
                    run.summary_file = str(f)
                    run.sources.append(str(f))
        for d in dirs:
            for f in sorted(d.glob("*.hlog")):
                _load_hlog(run, str(f))
        for d in dirs:
            for f in sorted(d.glob("*.hgrm")):
                _load_hgrm(run, str(f))
        if run.summary is None and not run.curves:
            raise _user_error(f"{source}: no summary.json, service.json, .hlog or .hgrm files here "
                              "(or one level down)")
    elif p.suffix == ".hlog":
        _load_hlog(run, source)
    elif p.suffix == ".hgrm":
        _load_hgrm(run, source)
    else:
        raise _user_error(f"{source}: not a run directory, .hlog or .hgrm file")
    if run.summary:
        run.table.update(_summary_tables(run.summary))  # the service's own complete counts win
    if not run.table:
        raise _user_error(f"{source}: no latency samples in it")
    return run


def _labels(sources: list[str], given: list[str]) -> list[str]:
    if given:
        if len(given) != len(sources):
            raise _user_error(f"--label given {len(given)} times for {len(sources)} sources")
        return given
    names = []
    for s in sources:
        p = Path(s.rstrip("/"))
        if p.is_dir():
            names.append(p.name)
        else:  # service.hlog says little; its directory says which run
            names.append(f"{p.parent.name}/{p.stem}" if p.stem == "service" and p.parent.name else p.stem)
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if names.count(n) == 1 else f"{n} #{seen[n]}")
    return out


# --- figure ----------------------------------------------------------------------

def _stage_order(runs: list[Run]) -> list[str]:
    names = {s for r in runs for s in (*r.curves, *r.table)}
    first = [s for s in (TICK_TO_DECISION, *SERVICE_STAGES) if s in names]
    return first + sorted(names - set(first))


def make_figure(runs: list[Run], title: str):
    try:
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter, LogLocator
    except ImportError:
        raise _user_error("report needs matplotlib: pip install 'hft-infer[plot]'") from None

    stages = [s for s in _stage_order(runs) if any(s in r.curves for r in runs)]
    if not stages:
        return None
    cols = min(3, len(stages))
    rows = math.ceil(len(stages) / cols)
    fig = Figure(figsize=(5.2 * cols, 3.6 * rows + 0.6), dpi=110, layout="constrained")
    fig.suptitle(title)
    axes = fig.subplots(rows, cols, squeeze=False)
    xt = [math.log10(2), 1, 2, 3, 4, 5, 6]
    xl = ["50%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"]
    for ax, stage in zip(axes.flat, stages):
        top = 1.0
        for i, run in enumerate(runs):
            c = run.curves.get(stage)
            if c is None:
                continue
            ax.plot(c.x, c.values_us, color=RUN_COLORS[i % len(RUN_COLORS)], lw=1.6, label=run.label)
            top = max(top, float(c.x[-1]))
        ax.set_title(stage, fontsize=11)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(_fmt_us_tick))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ticks = [(x, lab) for x, lab in zip(xt, xl) if x <= top + 1e-9]
        ax.set_xticks([t for t, _ in ticks], [lab for _, lab in ticks], fontsize=8)
        ax.set_xlim(0, max(1.0, top))
        ax.grid(True, which="major", alpha=0.3)
        ax.set_ylabel("latency")
    for ax in list(axes.flat)[len(stages):]:
        ax.set_visible(False)
    if len(runs) > 1:
        handles = [Line2D([], [], color=RUN_COLORS[i % len(RUN_COLORS)], lw=1.6) for i in range(len(runs))]
        fig.legend(handles, [r.label for r in runs], loc="outside lower center", ncols=min(len(runs), 4))
    return fig


def _fmt_us_tick(v: float, _pos=None) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g} s"
    if v >= 1e3:
        return f"{v / 1e3:g} ms"
    return f"{v:g} µs"


def _svg_of(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text: small, no embedded font files
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # drop the XML prolog and DOCTYPE (which names an external DTD)


# --- HTML ------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1b1f24;max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.sub{color:#57606a;margin:0 0 16px}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;margin:4px 0 8px}
th,td{border-bottom:1px solid #d0d7de;padding:3px 10px;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}th{background:#f6f8fa;font-weight:600}
th[colspan]{text-align:center;border-left:1px solid #d0d7de}td.src{text-align:left}
td.worse{color:#cf222e}td.better{color:#1a7f37}.sw{display:inline-block;width:10px;height:10px;margin-right:6px}
.fig svg{max-width:100%;height:auto}.note{color:#57606a;font-size:12px}code{font-size:12px}
"""


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _fmt_us(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if v >= 1e6:
        return f"{v / 1e6:.3g} s"
    if v >= 1e3:
        return f"{v / 1e3:.3g} ms"
    return f"{v:.1f} µs" if v < 1000 else f"{v:.0f} µs"


def _fmt_n(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.1f}"
    return f"{int(v):,}"


def render_html(runs: list[Run], title: str, svg: str | None) -> str:
    out = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>",
           f"<style>{_CSS}</style></head><body>",
           f"<h1>{_e(title)}</h1>",
           f"<p class='sub'>generated {_e(_dt.datetime.now().isoformat(timespec='seconds'))} by hft-infer "
           f"{_e(__version__)} · latencies in µs unless marked</p>"]

    out.append("<h2>Runs</h2><table><tr><th>run</th><th>engine</th><th>model</th><th>rate offered</th>"
               "<th>rate achieved</th><th>duration</th><th>sources</th></tr>")
    for i, r in enumerate(runs):
        s = r.summary or {}
        cfg_engine = ((s.get("config") or {}).get("runner") or {}).get("engine")
        out.append(
            f"<tr><td><span class='sw' style='background:{RUN_COLORS[i % len(RUN_COLORS)]}'></span>{_e(r.label)}</td>"
            f"<td>{_e(s.get('engine') or cfg_engine or '–')}</td><td>{_e(s.get('model_version') or '–')}</td>"
            f"<td>{_fmt_n(s.get('rate_offered'))}</td><td>{_fmt_n(s.get('rate_achieved'))}</td>"
            f"<td>{_e(str(s['duration_s']) + ' s' if s.get('duration_s') is not None else '–')}</td>"
            f"<td class='note src'>{'<br>'.join(_e(x) for x in r.sources)}</td></tr>")
    out.append("</table>")

    if svg:
        out.append("<h2>Percentile distribution per stage</h2>"
                   "<p class='note'>x: percentile on the HDR “nines” axis (90 % → 99 % → 99.9 % evenly spaced); "
                   "y: latency, log scale. Curves stop where the sample runs out of resolution.</p>")
        out.append(f"<div class='fig'>{svg}</div>")

    stages = _stage_order(runs)
    out.append("<h2>Latency by stage</h2><table><tr><th>stage</th>")
    for r in runs:
        out.append(f"<th colspan='{len(TABLE_KEYS) + 1}'>{_e(r.label)}</th>")
    if len(runs) > 1:
        out.append(f"<th colspan='{len(runs) - 1}'>p99 vs {_e(runs[0].label)}</th>")
    out.append("</tr><tr><th></th>")
    for _ in runs:
        out.append("<th>count</th>" + "".join(f"<th>{_e(name)}</th>" for _, name in TABLE_KEYS))
    out.extend(f"<th>{_e(r.label)}</th>" for r in runs[1:])
    out.append("</tr>")
    for stage in stages:
        out.append(f"<tr><td>{_e(stage)}</td>")
        for r in runs:
            row = r.table.get(stage)
            out.append(f"<td>{_fmt_n(row.get('count')) if row else '–'}</td>")
            out.extend(f"<td>{_fmt_us(row.get(k)) if row else '–'}</td>" for k, _ in TABLE_KEYS)
        base = (runs[0].table.get(stage) or {}).get("p99_us")
        for r in runs[1:]:
            v = (r.table.get(stage) or {}).get("p99_us")
            if base and v:
                ratio = v / base
                cls = "worse" if ratio > 1.05 else "better" if ratio < 0.95 else ""
                out.append(f"<td class='{cls}'>×{ratio:.2f}</td>")
            else:
                out.append("<td>–</td>")
        out.append("</tr>")
    out.append("</table>")
    out.append("<p class='note'>Tables come from the run's summary JSON where there is one (the service's "
               "complete counts), else from the merged interval log or the .hgrm listing.</p>")

    if any(r.accounting for r in runs):
        keys = [k for k in ACCOUNTING_KEYS if any(k in (r.accounting or {}) for r in runs)]
        extra = sorted({k for r in runs for k in (r.accounting or {}) if k not in ACCOUNTING_KEYS})
        out.append("<h2>Accounting</h2><table><tr><th>events</th>"
                   + "".join(f"<th>{_e(r.label)}</th>" for r in runs) + "</tr>")
        for k in keys + extra:
            out.append(f"<tr><td>{_e(k)}</td>"
                       + "".join(f"<td>{_fmt_n((r.accounting or {}).get(k))}</td>" for r in runs) + "</tr>")
        out.append("</table>")
        reasons = [(r, (r.summary or {}).get("rejected_by_reason")) for r in runs]
        if any(rb for _, rb in reasons):
            names = sorted({k for _, rb in reasons for k in (rb or {})})
            out.append("<h2>Shed and rejected by reason</h2><table><tr><th>reason</th>"
                       + "".join(f"<th>{_e(r.label)}</th>" for r in runs) + "</tr>")
            for k in names:
                out.append(f"<tr><td>{_e(k)}</td>"
                           + "".join(f"<td>{_fmt_n((rb or {}).get(k))}</td>" for _, rb in reasons) + "</tr>")
            out.append("</table>")
    out.append("</body></html>\n")
    return "".join(out)


# --- CLI -------------------------------------------------------------------------

def build_report(sources: list[str], out: str, *, png: str | None = None, labels=(), title: str = "") -> list[Run]:
    runs = [load_run(s, lab) for s, lab in zip(sources, _labels(sources, list(labels)))]
    title = title or "hft-infer latency report"
    fig = make_figure(runs, title)
    svg = _svg_of(fig) if fig is not None else None
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(render_html(runs, title, svg))
    os.replace(tmp, out)
    if png and fig is not None:
        fig.savefig(png, format="png")
    return runs


def main(args: argparse.Namespace) -> int:
    png = None if args.no_png else (args.png or str(Path(args.out).with_suffix(".png")))
    out_dir = Path(args.out).parent
    if not out_dir.is_dir():
        raise _user_error(f"--out {args.out}: directory {out_dir} does not exist")
    runs = build_report(args.sources, args.out, png=png, labels=args.label, title=args.title)
    print(f"report: {args.out}" + (f" and {png}" if png else "") + f" ({len(runs)} run{'s' * (len(runs) != 1)})")
    return 0
