// A small hand-drawn SVG line chart: a fixed number of recent points, newest on the right, gaps for null.
const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 400;
const HEIGHT = 130;
const PAD = { left: 46, right: 8, top: 8, bottom: 18 };

function svg(tag, attributes = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

// The smallest 1, 2 or 5 times a power of ten that is >= value.
export function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (step * power >= value * 0.9999) return step * power;
  return 10 * power;
}

export class LineChart {
  // series: [{key, label, color}]; format: value -> text; max: a fixed top of the y axis (else from the data)
  // minTop: the y axis reaches at least this high (a request count axis of 0..0.5 says nothing)
  constructor(parent, { title, series, format = (v) => String(v), max = null, minTop = 0, capacity = 120, note = "" }) {
    this.series = series;
    this.minTop = minTop;
    this.format = format;
    this.max = max;
    this.capacity = capacity;
    this.points = [];
    this.root = document.createElement("div");
    this.root.className = "chart";
    const heading = document.createElement("div");
    heading.className = "title";
    heading.textContent = title;
    this.svg = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": title });
    this.legend = document.createElement("div");
    this.legend.className = "legend";
    this.note = document.createElement("div");
    this.note.className = "note";
    this.note.textContent = note;
    this.root.append(heading, this.svg, this.legend, this.note);
    parent.append(this.root);
    this.draw();
  }

  // values: {key: number | null}, one point per poll
  push(values) {
    this.points.push(values);
    if (this.points.length > this.capacity) this.points.shift();
    this.draw();
  }

  setNote(text) {
    this.note.textContent = text;
  }

  draw() {
    const plotWidth = WIDTH - PAD.left - PAD.right;
    const plotHeight = HEIGHT - PAD.top - PAD.bottom;
    const values = this.points.flatMap((p) => this.series.map((s) => p[s.key])).filter((v) => Number.isFinite(v));
    const top = this.max ?? niceCeiling(Math.max(this.minTop, ...values));
    const x = (i) => PAD.left + ((i + this.capacity - this.points.length) / (this.capacity - 1)) * plotWidth;
    const y = (v) => PAD.top + plotHeight - (Math.min(v, top) / top) * plotHeight;
    const nodes = [];
    for (const fraction of [0, 0.5, 1]) {
      const level = PAD.top + plotHeight - fraction * plotHeight;
      nodes.push(svg("line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: level, y2: level, stroke: "#e3e6ea" }));
      const label = svg("text", { x: PAD.left - 6, y: level + 4, "text-anchor": "end", "font-size": 10,
        fill: "#66707c" });
      label.textContent = this.format(top * fraction);
      nodes.push(label);
    }
    for (const [text, at, anchor] of [[`-${this.capacity} s`, PAD.left, "start"], ["now", WIDTH - PAD.right, "end"]]) {
      const label = svg("text", { x: at, y: HEIGHT - 4, "text-anchor": anchor, "font-size": 10, fill: "#66707c" });
      label.textContent = text;
      nodes.push(label);
    }
    for (const s of this.series) {
      let d = "";
      let open = false;
      this.points.forEach((p, i) => {
        const v = p[s.key];
        if (!Number.isFinite(v)) {
          open = false;
          return;
        }
        d += `${open ? "L" : "M"}${x(i).toFixed(1)} ${y(v).toFixed(1)} `;
        open = true;
      });
      const path = svg("path", { d: d.trim(), fill: "none", stroke: s.color, "stroke-width": 1.8,
        "stroke-linejoin": "round", "data-series": s.key });
      nodes.push(path);
    }
    this.svg.replaceChildren(...nodes);
    this.drawLegend();
  }

  drawLegend() {
    const latest = this.points[this.points.length - 1] || {};
    this.legend.replaceChildren(...this.series.map((s) => {
      const item = document.createElement("span");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = s.color;
      const v = latest[s.key];
      item.append(swatch, `${s.label} ${Number.isFinite(v) ? this.format(v) : "–"}`);
      return item;
    }));
    // for scripts and tests: the newest values and how many points are drawn
    this.root.dataset.latest = JSON.stringify(latest);
    this.root.dataset.points = String(this.points.length);
  }
}
