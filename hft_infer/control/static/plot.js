"use strict";
// Small canvas line charts for the dashboard: no dependencies, nothing
// fetched. A series is read through accessors (n, x(i), y(i)) so the charts
// draw straight from the page's fixed-size ring buffers without copying them.

const Plot = (() => {
  const AXIS = "#8a96a3", GRID = "#26303a", TEXT = "#8a96a3";
  const PAD = { l: 54, r: 10, t: 8, b: 22 };

  function fit(canvas) {
    // Backing store = CSS size x devicePixelRatio, resized only when it changes.
    const dpr = window.devicePixelRatio || 1;
    const cw = Math.max(10, canvas.clientWidth), ch = Math.max(10, canvas.clientHeight);
    const w = Math.round(cw * dpr), h = Math.round(ch * dpr);
    if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cw, ch);
    return { ctx, w: cw, h: ch };
  }

  function fmtUs(us) {
    if (us === null || us === undefined || !isFinite(us)) return "–";
    if (us >= 1e6) return (us / 1e6).toPrecision(3) + " s";
    if (us >= 1e3) return (us / 1e3).toPrecision(3) + " ms";
    if (us >= 100) return us.toFixed(0) + " µs";
    if (us >= 10) return us.toFixed(1) + " µs";
    return us.toFixed(2) + " µs";
  }

  function fmtUsAxis(us) {  // tick labels: no trailing zeros ("10 ms", not "10.0 ms")
    if (us >= 1e6) return +(us / 1e6).toPrecision(3) + " s";
    if (us >= 1e3) return +(us / 1e3).toPrecision(3) + " ms";
    return +us.toPrecision(3) + " µs";
  }

  function fmtNum(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(2) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(2) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
    return Number.isInteger(v) ? String(v) : v.toFixed(1);
  }

  function logTicks(lo, hi) {
    // 1-2-5 per decade; 1-10 only when that would crowd the axis.
    const out = [];
    const d0 = Math.floor(Math.log10(lo)), d1 = Math.ceil(Math.log10(hi));
    const mults = d1 - d0 > 3 ? [1] : [1, 2, 5];
    for (let d = d0; d <= d1; d++) {
      for (const m of mults) {
        const v = m * Math.pow(10, d);
        if (v >= lo * 0.999 && v <= hi * 1.001) out.push(v);
      }
    }
    return out;
  }

  function linTicks(lo, hi, count) {
    const span = hi - lo;
    if (!(span > 0)) return [lo];
    const raw = span / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function yRange(series, log) {
    let lo = Infinity, hi = -Infinity;
    for (const s of series) {
      for (let i = 0; i < s.n; i++) {
        const y = s.y(i);
        if (y === null || !isFinite(y) || (log && y <= 0)) continue;
        if (y < lo) lo = y;
        if (y > hi) hi = y;
      }
    }
    if (lo === Infinity) return null;
    if (log) {
      // Whole 1-2-5 steps around the data, at least one decade tall.
      const snap = (v, up) => {
        const d = Math.pow(10, Math.floor(Math.log10(v)));
        const ms = up ? [1, 2, 5, 10] : [5, 2, 1];
        for (const m of ms) if (up ? m * d >= v : m * d <= v) return m * d;
        return up ? 10 * d : d;
      };
      lo = snap(lo, false); hi = snap(hi * 1.0001, true);
      if (hi / lo < 10) hi = lo * 10;
      return [lo, hi];
    }
    return [0, hi > 0 ? hi * 1.1 : 1];
  }

  // o = {xmin, xmax, xticks: [[x, label]] | null, xfmt, ylog, yfmt, series: [{n, x, y, color, width, dash}], empty}
  function draw(canvas, o) {
    const { ctx, w, h } = fit(canvas);
    const x0 = PAD.l, x1 = w - PAD.r, y0 = h - PAD.b, y1 = PAD.t;
    ctx.font = "11px system-ui, sans-serif";
    const yr = yRange(o.series, o.ylog);
    if (!yr || !(o.xmax > o.xmin)) {
      ctx.fillStyle = TEXT;
      ctx.textAlign = "center";
      ctx.fillText(o.empty || "waiting for data", w / 2, h / 2);
      return false;
    }
    const [ylo, yhi] = yr;
    const ly = o.ylog ? Math.log10 : (v) => v;
    const LLO = ly(ylo), LHI = ly(yhi);
    const sx = (x) => x0 + ((x - o.xmin) / (o.xmax - o.xmin)) * (x1 - x0);
    const sy = (y) => y0 - ((ly(y) - LLO) / (LHI - LLO)) * (y0 - y1);

    // grid and axes
    ctx.strokeStyle = GRID; ctx.lineWidth = 1; ctx.fillStyle = TEXT;
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    const yt = o.ylog ? logTicks(ylo, yhi) : linTicks(ylo, yhi, 4);
    for (const v of yt) {
      const y = Math.round(sy(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x0, y); ctx.lineTo(x1, y); ctx.stroke();
      ctx.fillText((o.yfmt || fmtNum)(v), x0 - 4, y);
    }
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    const xt = o.xticks || linTicks(o.xmin, o.xmax, 6).map((v) => [v, (o.xfmt || fmtNum)(v)]);
    let labelEnd = -Infinity;
    for (const [v, label] of xt) {
      if (v < o.xmin - 1e-9 || v > o.xmax + 1e-9) continue;
      const x = Math.round(sx(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, y0); ctx.lineTo(x, y1); ctx.stroke();
      // Keep labels inside the canvas and off each other (0% and 50% are close).
      const tw = ctx.measureText(label).width;
      const lx = Math.min(Math.max(x, tw / 2), w - tw / 2 - 1);
      if (lx - tw / 2 < labelEnd + 4) continue;
      ctx.fillText(label, lx, y0 + 4);
      labelEnd = lx + tw / 2;
    }
    ctx.strokeStyle = AXIS;
    ctx.beginPath(); ctx.moveTo(x0 + 0.5, y1); ctx.lineTo(x0 + 0.5, y0 + 0.5); ctx.lineTo(x1, y0 + 0.5); ctx.stroke();

    // series, clipped to the plot area; a gap (null/NaN) breaks the line
    ctx.save();
    ctx.beginPath(); ctx.rect(x0, y1 - 2, x1 - x0, y0 - y1 + 4); ctx.clip();
    ctx.lineJoin = "round";
    for (const s of o.series) {
      ctx.strokeStyle = s.color; ctx.lineWidth = s.width || 1.5;
      ctx.setLineDash(s.dash || []);
      ctx.beginPath();
      let pen = false;
      for (let i = 0; i < s.n; i++) {
        const y = s.y(i), x = s.x(i);
        if (y === null || !isFinite(y) || (o.ylog && y <= 0) || !isFinite(x)) { pen = false; continue; }
        const px = sx(x), py = sy(Math.min(Math.max(y, ylo), yhi));
        if (pen) ctx.lineTo(px, py); else { ctx.moveTo(px, py); pen = true; }
        if (s.n === 1) ctx.lineTo(px + 2, py);
      }
      ctx.stroke();
    }
    ctx.restore();
    ctx.setLineDash([]);
    return true;
  }

  return { draw, fmtUs, fmtUsAxis, fmtNum };
})();
