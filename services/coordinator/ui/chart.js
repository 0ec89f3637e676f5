// A small SVG line chart: numeric x (steps) and y, a legend, and axis ticks. No dependencies.

const SVG = "http://www.w3.org/2000/svg";
export const COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563"];

function el(tag, attrs = {}, text = "") {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

function ticks(lo, hi, count) {
  if (hi === lo) return [lo];
  const raw = (hi - lo) / count;
  const unit = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * unit).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

function fmt(v) {
  return Math.abs(v) >= 1000 || (v !== 0 && Math.abs(v) < 0.01) ? v.toExponential(1) : String(+v.toFixed(3));
}

// series: [{name, points: [[x, y], ...]}]; options: {title, yMin, yMax, width, height}
export function lineChart(series, options = {}) {
  const width = options.width || 520, height = options.height || 260;
  const pad = { left: 52, right: 12, top: 48, bottom: 34 };
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": options.title || "chart" });
  svg.appendChild(el("text", { x: pad.left, y: 16, class: "chart-title" }, options.title || ""));
  const points = series.flatMap((s) => s.points.filter((p) => p[1] !== null && Number.isFinite(p[1])));
  if (!points.length) {
    svg.appendChild(el("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "chart-empty" },
      "no data yet"));
    return svg;
  }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  let y0 = options.yMin ?? Math.min(...ys), y1 = options.yMax ?? Math.max(...ys);
  if (y0 === y1) [y0, y1] = [y0 - 1, y1 + 1];
  const sx = (x) => pad.left + ((x - x0) / (x1 - x0)) * (width - pad.left - pad.right);
  const sy = (y) => height - pad.bottom - ((y - y0) / (y1 - y0)) * (height - pad.top - pad.bottom);

  for (const t of ticks(y0, y1, 4)) {
    svg.appendChild(el("line", { x1: pad.left, x2: width - pad.right, y1: sy(t), y2: sy(t), class: "grid" }));
    svg.appendChild(el("text", { x: pad.left - 6, y: sy(t) + 4, "text-anchor": "end", class: "tick" }, fmt(t)));
  }
  for (const t of ticks(x0, x1, 6).filter((t) => Number.isInteger(t))) {
    svg.appendChild(el("text", { x: sx(t), y: height - pad.bottom + 16, "text-anchor": "middle", class: "tick" },
      String(t)));
  }
  svg.appendChild(el("text", { x: width - pad.right, y: height - 4, "text-anchor": "end", class: "tick" }, "step"));

  let legendX = pad.left;
  series.forEach((s, i) => {
    const colour = s.colour || COLOURS[i % COLOURS.length];
    const valid = s.points.filter((p) => p[1] !== null && Number.isFinite(p[1]));
    if (valid.length) {
      const d = valid.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
      svg.appendChild(el("path", { d, stroke: colour, class: "line", "data-series": s.name }));
      for (const p of valid.length <= 40 ? valid : []) {
        svg.appendChild(el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: colour }));
      }
    }
    svg.appendChild(el("line", { x1: legendX, x2: legendX + 14, y1: 33, y2: 33, stroke: colour, class: "line" }));
    svg.appendChild(el("text", { x: legendX + 18, y: 37, class: "legend" }, s.name));
    legendX += 30 + 7 * s.name.length;
  });
  return svg;
}
