/* Usage chart for the operator page: stacked bars per day, one series per
 * key · model, drawn as SVG. No library; exposes window.UsageChart. */
"use strict";

window.UsageChart = (function () {
  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2457c5", "#e07b00", "#1d7a3e", "#b3261e", "#7b3fb5", "#00838f",
                   "#c2185b", "#5d6d00", "#6d4c41", "#455a64"];
  const W = 900, H = 260, LEFT = 56, RIGHT = 12, TOP = 12, BOTTOM = 28;

  function el(name, attrs, text) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  /** "YYYY-MM-DD" (UTC) of a Date. */
  function isoDay(date) { return date.toISOString().slice(0, 10); }

  /** The last `count` UTC days ending today, oldest first. */
  function lastDays(count, now) {
    const days = [];
    const end = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate());
    for (let i = count - 1; i >= 0; i--) days.push(isoDay(new Date(end - i * 86400000)));
    return days;
  }

  function compact(n) {
    const abs = Math.abs(n);
    if (abs >= 1e9) return (n / 1e9).toFixed(abs >= 1e10 ? 0 : 1) + "G";
    if (abs >= 1e6) return (n / 1e6).toFixed(abs >= 1e7 ? 0 : 1) + "M";
    if (abs >= 1e3) return (n / 1e3).toFixed(abs >= 1e4 ? 0 : 1) + "k";
    return String(Math.round(n));
  }

  /** A round step so that max fits in about four grid lines. */
  function niceStep(max) {
    const raw = max / 4;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= raw) return m * mag;
    return 10 * mag;
  }

  function value(row, metric) {
    return metric === "requests" ? row.requests
      : (row.input_tokens || 0) + (row.output_tokens || 0);
  }

  /** Series (key · model) with a colour each, biggest first, and per-day totals. */
  function collect(rows, days, metric) {
    const inRange = new Set(days);
    const series = new Map();
    for (const row of rows) {
      if (!inRange.has(row.day)) continue;
      const id = row.key + " · " + row.model;
      if (!series.has(id)) series.set(id, { id, total: 0, byDay: new Map() });
      const s = series.get(id);
      const v = value(row, metric);
      s.total += v;
      s.byDay.set(row.day, (s.byDay.get(row.day) || 0) + v);
    }
    const list = [...series.values()].filter((s) => s.total > 0)
      .sort((a, b) => b.total - a.total || a.id.localeCompare(b.id));
    list.forEach((s, i) => { s.color = PALETTE[i % PALETTE.length]; });
    return list;
  }

  /** Draw into `container` and fill `legend`; returns the number of series drawn. */
  function draw(container, legend, rows, options) {
    const metric = options.metric || "tokens";
    const days = lastDays(options.days || 30, options.now || new Date());
    const series = collect(rows, days, metric);
    container.replaceChildren();
    legend.replaceChildren();
    if (!series.length) {
      const p = document.createElement("p");
      p.className = "hint";
      p.textContent = "No usage in the last " + days.length + " days.";
      container.append(p);
      return 0;
    }
    const totals = days.map((d) => series.reduce((t, s) => t + (s.byDay.get(d) || 0), 0));
    const step = niceStep(Math.max(1, ...totals));
    const top = Math.max(step, Math.ceil(Math.max(...totals) / step) * step);
    const plotW = W - LEFT - RIGHT, plotH = H - TOP - BOTTOM;
    const y = (v) => TOP + plotH - (v / top) * plotH;
    const slot = plotW / days.length, barW = Math.max(2, slot * 0.72);

    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
      "aria-label": `${metric} per day, last ${days.length} days` });
    for (let v = 0; v <= top + 1e-9; v += step) {
      svg.append(el("line", { class: "grid", x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v) }));
      svg.append(el("text", { x: LEFT - 6, y: y(v) + 4, "text-anchor": "end" }, compact(v)));
    }
    days.forEach((day, i) => {
      const x = LEFT + i * slot + (slot - barW) / 2;
      let base = 0;
      for (const s of series) {
        const v = s.byDay.get(day) || 0;
        if (!v) continue;
        const rect = el("rect", { x, y: y(base + v), width: barW,
          height: Math.max(1, y(base) - y(base + v)), fill: s.color, "data-series": s.id,
          "data-day": day });
        rect.append(el("title", {}, `${day} ${s.id}: ${v.toLocaleString()} ${metric}`));
        svg.append(rect);
        base += v;
      }
      if (i % 5 === (days.length - 1) % 5) {
        svg.append(el("text", { x: LEFT + i * slot + slot / 2, y: H - 8, "text-anchor": "middle" },
          day.slice(5)));
      }
    });
    container.append(svg);

    for (const s of series) {
      const li = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = s.color;
      li.append(swatch, document.createTextNode(`${s.id} — ${s.total.toLocaleString()}`));
      legend.append(li);
    }
    return series.length;
  }

  return { draw, lastDays, isoDay, compact };
})();
