"use strict";
// The dashboard page: one WebSocket, fixed-size rings, redraw once per
// animation frame. Memory stays flat however long the page is open: history
// lives in preallocated typed arrays sized by the server's history_points,
// and the DOM is built once per stage set, then only its text changes.

(() => {
  // One colour per stage, in pipeline order; the sixth (service) kept apart from step's pink.
  const COLORS = ["#58a6ff", "#3fb950", "#d29922", "#f778ba", "#a371f7", "#56d4dd", "#ff7b72", "#e3b341",
                  "#8ddb8c", "#79c0ff"];
  const FIGURE_COUNTERS = ["received", "decided", "shed", "conflated", "rejected", "egress_dropped",
                           "control_dropped", "seq_gaps"];
  const ALERT_COUNTERS = new Set(["shed", "rejected", "egress_dropped", "control_dropped", "seq_gaps"]);
  const $ = (id) => document.getElementById(id);

  // What a test (or a curious user in the console) can read.
  const stats = { hellos: 0, frames: 0, statuses: 0, draws: 0, reconnects: 0, lastTs: null, live: false };
  window.hftDashboard = stats;

  let layout = null;        // from hello: nines_x, ticks, percentiles, capacity
  let ring = null;          // history
  let stageNames = [];      // current stage set (order as sent)
  let lastFrame = null;
  let dirty = false;

  // --- history ring -----------------------------------------------------------
  class Ring {
    constructor(capacity, stages) {
      this.cap = capacity; this.n = 0; this.head = 0;  // head: next write slot
      this.t = new Float64Array(capacity);
      this.ev = new Float64Array(capacity).fill(NaN);
      this.dec = new Float64Array(capacity).fill(NaN);
      this.st = {};
      for (const s of stages) this.addStage(s);
    }
    addStage(name) {
      if (!this.st[name]) this.st[name] = [0, 1, 2].map(() => new Float64Array(this.cap).fill(NaN));
    }
    push(p) {
      const i = this.head;
      this.t[i] = p.t;
      this.ev[i] = p.events_per_s ?? NaN;
      this.dec[i] = p.decisions_per_s ?? NaN;
      for (const name in this.st) {
        const v = p.stages[name], a = this.st[name];
        for (let k = 0; k < 3; k++) a[k][i] = v ? v[k] : NaN;
      }
      this.head = (i + 1) % this.cap;
      if (this.n < this.cap) this.n++;
    }
    idx(i) { return (this.head - this.n + i + this.cap) % this.cap; }  // i-th oldest
    lastT() { return this.n ? this.t[this.idx(this.n - 1)] : -Infinity; }
  }
  stats.ringLength = () => (ring ? ring.n : 0);
  stats.ringCapacity = () => (ring ? ring.cap : 0);

  // --- DOM built once per stage set ------------------------------------------
  const cells = {};  // stage -> {iv: [td...], cum: [td...]}
  const tsCanvases = {};
  function colorOf(name) { return COLORS[Math.max(0, stageNames.indexOf(name)) % COLORS.length]; }

  function buildStages(names) {
    stageNames = names.slice();
    const body = $("stage-table").tBodies[0];
    body.textContent = "";
    const grid = $("ts-grid");
    grid.textContent = "";
    const legend = $("dist-legend");
    legend.textContent = "";
    for (const k in cells) delete cells[k];
    for (const k in tsCanvases) delete tsCanvases[k];
    for (const name of stageNames) {
      const rows = {};
      for (const kind of ["iv", "cum"]) {
        const tr = body.insertRow();
        if (kind === "cum") tr.className = "cum";
        const first = tr.insertCell();
        if (kind === "iv") {
          const sw = document.createElement("span");
          sw.className = "sw"; sw.style.background = colorOf(name);
          first.append(sw, name);
        } else {
          first.textContent = "  cumulative";
        }
        rows[kind] = Array.from({ length: 7 }, () => tr.insertCell());
      }
      cells[name] = rows;
      const cell = document.createElement("div");
      cell.className = "cell";
      const h = document.createElement("h3");
      h.textContent = name;
      h.style.color = colorOf(name);
      const c = document.createElement("canvas");
      c.dataset.stage = name;
      cell.append(h, c);
      grid.append(cell);
      tsCanvases[name] = c;
      const item = document.createElement("span");
      const sw = document.createElement("i");
      sw.style.background = colorOf(name);
      item.append(sw, name);
      legend.append(item);
    }
  }

  // --- figures and tables -------------------------------------------------------
  function setText(el, text) { if (el && el.textContent !== text) el.textContent = text; }

  function renderFrame(f) {
    const svc = f.service || {};
    setText($("svc-name"), svc.service || "–");
    setText($("svc-pid"), svc.pid ? String(svc.pid) : "–");
    setText($("svc-engine"), svc.engine || "–");
    $("svc-engine").title = svc.engine_reason || "";
    setText($("svc-model"), svc.model_version || "–");
    setText($("engine-reason"), svc.engine_reason ? "engine: " + svc.engine_reason : "");
    const pl = svc.placement || {};
    setText($("placement"), Object.keys(pl).length
      ? "placement: " + Object.entries(pl).map(([k, v]) => k + "=" + v).join(", ") : "");
    setText($("updated"), new Date(f.ts * 1000).toLocaleTimeString());
    setText($("f-events_per_s"), Plot.fmtNum(f.rates.events_per_s));
    setText($("f-decisions_per_s"), Plot.fmtNum(f.rates.decisions_per_s));
    setText($("f-queue_depth"), Plot.fmtNum(f.gauges.queue_depth));
    setText($("f-last_batch_size"), Plot.fmtNum(f.gauges.last_batch_size));
    const late = f.gauges.feed_late_us ?? 0;  // 0: on time (hft_infer/late_feed.py)
    setText($("f-feed_late_us"), late > 0 ? Plot.fmtUs(late) : "no");
    $("f-feed_late_us").classList.toggle("alert", late > 0);
    for (const k of FIGURE_COUNTERS) {
      const el = $("f-" + k), v = f.counters[k];
      setText(el, Plot.fmtNum(v));
      if (el) el.classList.toggle("alert", ALERT_COUNTERS.has(k) && v > 0);
    }
    const keys = ["count", "p50", "p90", "p99", "p99_9", "p99_99", "max"];
    for (const name of stageNames) {
      const s = f.stages[name], row = cells[name];
      if (!row) continue;
      for (const [kind, data] of [["iv", s && s.interval], ["cum", s && s.cumulative]]) {
        keys.forEach((k, j) => {
          const v = data ? data[k] : null;
          setText(row[kind][j], v === null || v === undefined ? "–" : (k === "count" ? Plot.fmtNum(v) : Plot.fmtUs(v)));
        });
      }
    }
    const body = $("reasons").tBodies[0];
    const reasons = Object.entries(f.by_reason || {}).sort((a, b) => b[1] - a[1]);
    const rows = [["conflated", f.counters.conflated ?? 0], ...reasons];
    while (body.rows.length > rows.length) body.deleteRow(-1);
    while (body.rows.length < rows.length) { const tr = body.insertRow(); tr.insertCell(); tr.insertCell(); }
    rows.forEach(([k, v], i) => { setText(body.rows[i].cells[0], k); setText(body.rows[i].cells[1], Plot.fmtNum(v)); });
    const c = f.control || {};
    setText($("control-note"), `snapshots: ${c.snapshots_ok ?? 0} ok, ${c.snapshots_bad ?? 0} bad` +
      (c.service_restarts ? ` · service restarts seen: ${c.service_restarts}` : ""));
  }

  // --- plots ------------------------------------------------------------------
  function drawAll() {
    dirty = false;
    if (!layout) return;
    stats.draws++;
    const nx = layout.nines_x;
    const series = [];
    if (lastFrame) {
      for (const name of stageNames) {
        const s = lastFrame.stages[name];
        if (!s) continue;
        for (const [curve, dash, width] of [[s.curve_cumulative, null, 2], [s.curve_interval, [5, 4], 1.2]]) {
          if (curve) series.push({ n: curve.length, x: (i) => nx[i], y: (i) => curve[i], color: colorOf(name), dash, width });
        }
      }
    }
    Plot.draw($("dist"), {
      xmin: 0, xmax: nx[nx.length - 1], xticks: layout.nines_ticks, ylog: true, yfmt: Plot.fmtUsAxis, series,
      empty: "waiting for the first snapshot",
    });
    if (!ring || ring.n === 0) {
      for (const name of stageNames) Plot.draw(tsCanvases[name], { xmin: 0, xmax: 0, series: [] });
      Plot.draw($("rates"), { xmin: 0, xmax: 0, series: [] });
      return;
    }
    const tEnd = ring.lastT(), span = Math.max(10, tEnd - ring.t[ring.idx(0)]);
    const xmin = -span, x = (i) => ring.t[ring.idx(i)] - tEnd;
    const xfmt = (v) => (v === 0 ? "now" : Math.round(v) + "s");
    for (const name of stageNames) {
      const a = ring.st[name];
      if (!a) continue;
      Plot.draw(tsCanvases[name], {
        xmin, xmax: 0, xfmt, ylog: true, yfmt: Plot.fmtUsAxis, empty: "no samples yet",
        series: [0, 1, 2].map((k) => ({ n: ring.n, x, y: (i) => a[k][ring.idx(i)], color: colorOf(name), width: [1, 1.8, 2.8][k] })),
      });
    }
    Plot.draw($("rates"), {
      xmin, xmax: 0, xfmt, ylog: false, yfmt: Plot.fmtNum,
      series: [
        { n: ring.n, x, y: (i) => ring.ev[ring.idx(i)], color: "#58a6ff", width: 2 },
        { n: ring.n, x, y: (i) => ring.dec[ring.idx(i)], color: "#3fb950", width: 1.5, dash: [4, 3] },
      ],
    });
  }

  function schedule() {
    if (!dirty) { dirty = true; requestAnimationFrame(drawAll); }
  }

  // --- messages ---------------------------------------------------------------
  function stagesOf(f) { return f ? Object.keys(f.stages) : []; }

  function onHello(m) {
    stats.hellos++;
    layout = m;
    const names = stagesOf(m.frame);
    ring = new Ring(Math.max(2, m.history_points), names);
    for (const p of m.history) ring.push(p);
    buildStages(names);
    lastFrame = m.frame;
    if (lastFrame) renderFrame(lastFrame);
    schedule();
  }

  function onFrame(f) {
    stats.frames++;
    stats.lastTs = f.ts;
    const names = stagesOf(f);
    if (names.join() !== stageNames.join()) {
      for (const n of names) ring.addStage(n);
      buildStages(names);
    }
    if (f.point.t > ring.lastT()) ring.push(f.point);  // hello's history may already hold it
    lastFrame = f;
    renderFrame(f);
    schedule();
  }

  function onStatus(m) {
    stats.statuses++;
    stats.live = m.live;
    const el = $("conn");
    if (m.live) { el.className = "badge live"; el.textContent = "live"; }
    else if (m.final) { el.className = "badge stale"; el.textContent = "service stopped"; }
    else if (m.age_s === null) { el.className = "badge stale"; el.textContent = "waiting for the service"; }
    else { el.className = "badge stale"; el.textContent = `no data for ${Math.round(m.age_s)} s`; }
  }

  // --- connection (reconnects when the control process restarts) --------------
  let backoffMs = 500;
  function connect() {
    const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws");
    ws.onopen = () => { backoffMs = 500; };
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.type === "frame") { if (ring) onFrame(m); }
      else if (m.type === "status") onStatus(m);
      else if (m.type === "hello") onHello(m);
    };
    ws.onclose = () => {
      const el = $("conn");
      el.className = "badge off"; el.textContent = "control process unreachable";
      stats.live = false;
      stats.reconnects++;
      setTimeout(connect, backoffMs);
      backoffMs = Math.min(backoffMs * 2, 5000);
    };
  }
  window.addEventListener("resize", schedule);
  connect();
})();
