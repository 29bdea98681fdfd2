"""/metrics names against Prometheus's conventions, the README's list and the Grafana dashboard.

Everything is checked against a live scrape: a real control process fed real
Snapshots by `tools/snapshot_feeder.py` over its ipc PUSH (as test_control.py
does). `promtool check metrics` (Prometheus's own linter) runs when promtool is
installed (`.ci/run` installs it; `HFT_INFER_REQUIRE_PROMTOOL=1` makes its absence
a failure); the naming rules it enforces are also checked here without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from snapshot_feeder import SyntheticService, open_push
from test_control import DEADLINE_S, INTERVAL_NS, Control, _send

from hft_infer.metrics import SERVICE_STAGES
from hft_infer.transport.stats import COUNTERS, GAUGES, encode_snapshot

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "hft-infer.json"
# Labels Prometheus itself attaches to every scraped series.
TARGET_LABELS = {"instance", "job"}


def _promtool() -> str | None:
    found = shutil.which("promtool") or shutil.which("promtool", path=str(Path(sys.executable).parent))
    if found is None and os.environ.get("HFT_INFER_REQUIRE_PROMTOOL") == "1":
        pytest.fail("promtool is required here (HFT_INFER_REQUIRE_PROMTOOL=1) but is not on PATH")
    return found


@pytest.fixture(scope="module")
def scrape():
    """The text of one /metrics scrape after three snapshots, and its parsed families."""
    import tempfile

    import zmq

    sock_dir = tempfile.mkdtemp(prefix="hft-m-", dir="/tmp")
    ctl = Control(sock_dir, Path(sock_dir) / "run").start()
    ctx = zmq.Context()
    try:
        push = open_push(ctx, ctl.endpoint)
        svc = SyntheticService(rate=3000, seed=11)
        t0 = time.time_ns()
        for k in range(3):
            _send(push, encode_snapshot(svc.step(t0 + (k + 1) * INTERVAL_NS, INTERVAL_NS)))
        ctl.wait_snapshots(3)
        status, _, body = ctl.get("/metrics")
        assert status == 200
        text = body.decode()
        yield text, {f.name: f for f in text_string_to_metric_families(text)}
    finally:
        ctx.destroy(linger=0)
        if ctl.proc.poll() is None:
            ctl.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _exposed(text: str) -> dict[str, str]:
    """Exposed name (as in `# TYPE name type`) -> type."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def _sample_names(fams) -> set[str]:
    return {s.name for f in fams.values() for s in f.samples}


def test_promtool_check_metrics_accepts_a_live_scrape(scrape):
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool not installed (Debian: the prometheus package; .ci/run installs it); "
                    "the naming rules are checked without it below")
    text, _ = scrape
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=DEADLINE_S)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


# promtool's linter (client_golang promlint): these are its rules that our names could break.
_TYPES_IN_NAMES = ("counter", "gauge", "histogram", "summary")
_UNIT_ABBREVIATIONS = {"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"}
_NON_BASE_UNITS = ("milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days", "kilobytes",
                   "megabytes", "gigabytes", "percent", "celsius")


def test_names_follow_the_rules_promtool_enforces(scrape):
    text, fams = scrape
    exposed = _exposed(text)
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    assert exposed, text[:500]
    for name, kind in exposed.items():
        assert re.fullmatch(r"hft_infer_[a-z0-9_]+", name), name
        assert helps.get(name, "").strip(), f"{name}: no help text"
        parts = name.split("_")
        assert not any(t in parts for t in _TYPES_IN_NAMES), f"{name}: metric name should not include its type"
        assert not _UNIT_ABBREVIATIONS & set(parts), f"{name}: unit abbreviation"
        assert not any(u in name for u in _NON_BASE_UNITS), f"{name}: use base units"
        assert (kind == "counter") == name.endswith("_total"), f"{name} ({kind}): counters and only they end _total"
        assert ":" not in name and name == name.lower()
    # What the service ships is all there, with the conventional names.
    for c in COUNTERS:  # in base units: hot_runqueue_wait_us is hft_infer_hot_runqueue_wait_seconds_total
        name = f"hft_infer_{c[:-3]}_seconds_total" if c.endswith("_us") else f"hft_infer_{c}_total"
        assert exposed[name] == "counter"
    for g in GAUGES:
        name = f"hft_infer_{g[:-3]}_seconds" if g.endswith("_us") else f"hft_infer_{g}"
        assert exposed[name] == "gauge"
    assert exposed["hft_infer_stage_latency_seconds"] == "histogram"
    assert exposed["hft_infer_shed_or_rejected_total"] == "counter"
    assert not any(kind == "summary" for kind in exposed.values())
    stages = {s.labels["stage"] for s in fams["hft_infer_stage_latency_seconds"].samples}
    assert stages >= set(SERVICE_STAGES)


def test_the_readme_lists_every_metric(scrape):
    text, _ = scrape
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("<!-- metrics:start -->"):readme.index("<!-- metrics:end -->")]
    listed = set(re.findall(r"`(hft_infer_[a-z0-9_]+)", block))
    assert listed == set(_exposed(text)), ("README lists but /metrics lacks: "
                                           f"{sorted(listed - set(_exposed(text)))}; /metrics has but README "
                                           f"lacks: {sorted(set(_exposed(text)) - listed)}")


# --------------------------------------------------------------------------- the Grafana dashboard

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}


def _expressions(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]
    for var in dash["templating"]["list"]:
        q = var.get("query")
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", q["query"] if isinstance(q, dict) else q)
            assert m, var
            exprs.append(f'count by ({m.group(2)}) ({m.group(1)})')  # the same names, as PromQL
    return exprs


def _names_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """Metric names and label names an expression refers to."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values and strings
    labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", "".join(re.findall(r"\{[^}]*\}", e))))
    for clause in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", e):
        labels |= {x.strip() for x in clause.split(",") if x.strip()}
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    idents = re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*+)(?!\s*\()", e)  # possessive: no backtracking
    return {i for i in idents if i.lower() not in _KEYWORDS}, labels


def test_the_grafana_dashboard_only_names_metrics_the_exporter_emits(scrape):
    _, fams = scrape
    dash = json.loads(DASHBOARD.read_text())
    emitted = {}
    for f in fams.values():
        for s in f.samples:
            emitted.setdefault(s.name, set()).update(s.labels)
    exprs = _expressions(dash)
    assert len(exprs) >= 10
    used = set()
    for expr in exprs:
        names, labels = _names_and_labels(expr)
        assert names, expr
        missing = names - set(emitted)
        assert not missing, f"{expr}: names no emitted metric {sorted(missing)}"
        known = set().union(*(emitted[n] for n in names)) | TARGET_LABELS
        assert labels <= known, f"{expr}: labels {sorted(labels - known)} not on {sorted(names)}"
        used |= names
    # what the issue asks the dashboard to show
    assert "hft_infer_stage_latency_seconds_bucket" in used and "hft_infer_shed_or_rejected_total" in used
    assert {"hft_infer_received_total", "hft_infer_decided_total"} <= used
    assert any(e.startswith("histogram_quantile(") and "sum by (le, stage)" in e for e in exprs)
    stages = {s.labels["stage"] for s in fams["hft_infer_stage_latency_seconds"].samples}
    for value in re.findall(r'stage="(\w+)"', " ".join(exprs)):
        assert value in stages, value
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])


def test_the_grafana_expressions_are_valid_promql(tmp_path):
    """promtool parses every expression as a recording rule (Grafana variables filled in)."""
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool not installed (Debian: the prometheus package; .ci/run installs it)")
    dash = json.loads(DASHBOARD.read_text())
    exprs = [e.replace("$instance", ".*").replace("$stage", ".*") for e in _expressions(dash)]
    assert not any("$" in e for e in exprs), [e for e in exprs if "$" in e]
    rules = {"groups": [{"name": "grafana", "rules": [{"record": f"grafana:expr_{k}", "expr": e}
                                                      for k, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 0 and f"{len(exprs)} rules found" in r.stdout, r.stdout + r.stderr


def test_a_counter_kept_in_microseconds_is_exposed_in_seconds(scrape):
    """hot_runqueue_wait_us (the snapshot's unit) scraped as seconds: the feeder adds 40 µs per preemption."""
    _, fams = scrape
    value = {s.name: s.value for f in fams.values() for s in f.samples}
    preemptions = value["hft_infer_hot_preemptions_total"]
    assert preemptions > 0
    assert value["hft_infer_hot_runqueue_wait_seconds_total"] == pytest.approx(40e-6 * preemptions)
