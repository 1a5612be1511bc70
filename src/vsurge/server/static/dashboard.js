// The dashboard: polls /v1/stats every second and charts each model's engine.
// Rates come from differencing two snapshots; latency percentiles over the last WINDOW_S seconds
// come from differencing histogram buckets (the server's own p50/p90/p99 are since start-up).
import { askForKey } from "./apikey.js";
import { getJSON } from "./api.js";
import { LineChart } from "./charts.js";

const POLL_MS = 1000;
const WINDOW_S = 10;
const COLORS = { blue: "#2f6fde", orange: "#e8833a", green: "#2e9e5b", red: "#d64545", purple: "#8a5cd6" };

const $ = (id) => document.getElementById(id);
const panels = new Map();
let panelsMade = 0; // panel ids stay unique while models come and go

// Prometheus' histogram_quantile over cumulative counts (the last one is the +Inf bucket).
export function bucketQuantile(q, bounds, counts) {
  const total = counts[counts.length - 1];
  if (!(total > 0)) return null;
  const rank = q * total;
  let lowerBound = 0;
  let lowerCount = 0;
  for (let i = 0; i < counts.length; i++) {
    if (counts[i] >= rank) {
      if (i >= bounds.length) return lowerBound; // in the +Inf bucket: the highest finite bound
      if (counts[i] === lowerCount) return bounds[i];
      return lowerBound + ((bounds[i] - lowerBound) * (rank - lowerCount)) / (counts[i] - lowerCount);
    }
    lowerBound = bounds[i];
    lowerCount = counts[i];
  }
  return lowerBound;
}

function windowPercentiles(now, before) {
  let counts = now.bucket_counts;
  if (before && before.bucket_counts.length === counts.length) {
    counts = counts.map((c, i) => c - before.bucket_counts[i]);
  }
  const q = (p) => bucketQuantile(p, now.bucket_bounds, counts);
  return { p50: q(0.5), p90: q(0.9), p99: q(0.99) };
}

const count = (v) => (Number.isFinite(v) ? (Number.isInteger(v) ? String(v) : v.toFixed(1)) : "–");
const perSecond = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
const percent = (v) => (Number.isFinite(v) ? `${(v * 100).toFixed(v < 0.1 && v > 0 ? 1 : 0)}%` : "–");
function seconds(v) {
  if (!Number.isFinite(v)) return "–";
  if (v === 0) return "0";
  return v < 1 ? `${(v * 1000).toFixed(v < 0.01 ? 1 : 0)} ms` : `${v.toFixed(2)} s`;
}

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
// Binary units, the way device memory is sized: 730460160 -> "696.6 MiB".
export function formatBytes(n) {
  if (!Number.isFinite(n) || n < 0) return "–";
  let unit = 0;
  while (n >= 1024 && unit < BYTE_UNITS.length - 1) {
    n /= 1024;
    unit++;
  }
  return unit === 0 ? `${n} B` : `${n.toFixed(1)} ${BYTE_UNITS[unit]}`;
}

// A loaded model's footprint: weights, KV pages and (hybrid models) recurrent states, all its engines.
function memoryOf(m) {
  const state = m.state_cache_bytes || 0;
  return { total: m.weight_bytes + m.kv_cache_bytes + state, weights: m.weight_bytes, kv: m.kv_cache_bytes, state };
}

// A new element of `className`, holding `text` (as text: names on the page are the user's).
function element(tag, className, text) {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// An own field only: names are the user's, and "constructor" must not find Object's.
const own = (object, key) => (object && Object.hasOwn(object, key) ? object[key] : undefined);

function formatUptime(s) {
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  return [d && `${d}d`, (d || h) && `${h}h`, `${m}m`, `${Math.floor(s % 60)}s`].filter(Boolean).join(" ");
}

class ModelPanel {
  constructor(parent, name, index) {
    this.history = []; // recent snapshots {t, model}, for rates and windowed percentiles
    this.root = document.createElement("section");
    this.root.className = "model-panel";
    this.root.id = `model-${index}`;
    this.root.dataset.model = name;
    const title = document.createElement("h2");
    title.textContent = name;
    this.badge = document.createElement("span");
    this.badge.className = "badge";
    title.append(this.badge);
    this.tiles = document.createElement("div");
    this.tiles.className = "tiles";
    this.tileValues = {};
    const tiles = [["running", "Running"], ["waiting", "Waiting"], ["toks", "Output tok/s"],
      ["finished", "Finished"], ["failures", "Failures"], ["preemptions", "Preemptions"], ["kv", "KV cache"],
      ["memory", "Memory"], ["prefix", "Prefix-cache hits"], ["ttft", "TTFT p50 / p99"], ["itl", "ITL p50 / p99"]];
    for (const [key, label] of tiles) this.addTile(key, label);
    this.memoryDetail = document.createElement("div"); // the split under the total: seen without hovering
    this.memoryDetail.className = "detail";
    this.tileValues.memory.after(this.memoryDetail);
    this.adapters = this.adapterListing();
    const charts = document.createElement("div");
    charts.className = "charts";
    this.root.append(title, this.tiles, this.adapters, charts);
    parent.append(this.root);
    const c = COLORS;
    this.charts = {
      requests: new LineChart(charts, { title: "Requests", format: count, minTop: 2, series: [
        { key: "running", label: "running", color: c.blue }, { key: "waiting", label: "waiting", color: c.orange }] }),
      toks: new LineChart(charts, { title: "Output tokens per second", format: perSecond,
        series: [{ key: "toks", label: "tok/s", color: c.green }] }),
      ttft: new LineChart(charts, { title: `Time to first token (last ${WINDOW_S} s)`, format: seconds, series: [
        { key: "p50", label: "p50", color: c.blue }, { key: "p90", label: "p90", color: c.orange },
        { key: "p99", label: "p99", color: c.red }] }),
      itl: new LineChart(charts, { title: `Inter-token latency (last ${WINDOW_S} s)`, format: seconds, series: [
        { key: "p50", label: "p50", color: c.blue }, { key: "p90", label: "p90", color: c.orange },
        { key: "p99", label: "p99", color: c.red }] }),
      cache: new LineChart(charts, { title: "KV cache use and prefix-cache hit rate", format: percent, max: 1,
        series: [{ key: "kv", label: "KV cache", color: c.purple },
          { key: "hits", label: `prefix hits (last ${WINDOW_S} s)`, color: c.green }] }),
      events: new LineChart(charts, { title: "Finished and preempted requests per second", format: perSecond,
        series: [{ key: "finished", label: "finished/s", color: c.blue },
          { key: "preempted", label: "preempted/s", color: c.red }] }),
      steps: new LineChart(charts, { title: "Engine steps per second, by the engine's role", format: perSecond,
        series: [{ key: "both", label: "prefill + decode", color: c.purple },
          { key: "prefill", label: "prefill", color: c.orange }, { key: "decode", label: "decode", color: c.green }] }),
    };
    this.charts.toks.root.id = `${this.root.id}-toks`;
    this.charts.steps.root.id = `${this.root.id}-steps`;
    this.disaggregated = false;
  }

  // Prefill and decode engines on their own devices: the hand-over's tiles and chart, added once.
  showHandover() {
    this.disaggregated = true;
    this.addTile("transfer", "KV transfer p50 / p99");
    this.addTile("transferq", "Transfer queue");
    this.charts.handover = new LineChart(this.root.querySelector(".charts"), {
      title: "Prefixes handed to decode engines per second", format: perSecond,
      series: [{ key: "handovers", label: "hand-overs/s", color: COLORS.blue }] });
    this.charts.handover.root.id = `${this.root.id}-handover`;
  }

  // LoRA adapters in the engine's device slots, each with its running requests (hidden without LoRA).
  adapterListing() {
    const box = element("div", "adapters");
    box.hidden = true;
    this.adapterList = element("span", "list");
    box.append(element("span", "label", "LoRA adapters on the device"), this.adapterList);
    return box;
  }

  showAdapters(resident) {
    this.adapters.hidden = resident === undefined;
    if (resident === undefined) return;
    const chips = Object.entries(resident).sort(([a], [b]) => a.localeCompare(b)).map(([name, running]) => {
      const chip = document.createElement("span");
      chip.className = "adapter";
      chip.dataset.adapter = name;
      chip.dataset.running = String(running);
      chip.textContent = `${name} · ${count(running)} running`;
      return chip;
    });
    if (!chips.length) {
      const none = document.createElement("span");
      none.className = "none";
      none.textContent = "none now (each is copied in by its first request)";
      chips.push(none);
    }
    this.adapterList.replaceChildren(...chips);
  }

  addTile(key, label) {
    const tile = element("div", "tile");
    tile.dataset.tile = key;
    const value = element("div", "value", "–");
    tile.append(element("div", "label", label), value);
    this.tiles.append(tile);
    this.tileValues[key] = value;
  }

  setTile(key, text, tooltip) {
    this.tileValues[key].textContent = text;
    if (tooltip !== undefined) this.tileValues[key].title = tooltip;
  }

  // `resident`: this model's entry of /v1/stats' adapters, undefined when it serves no LoRA adapters.
  update(t, m, resident) {
    const last = this.history[this.history.length - 1];
    if (last && (t <= last.t || m.streamed_tokens < last.model.streamed_tokens)) this.history = []; // restarted
    const previous = this.history[this.history.length - 1];
    const windowStart = this.history.find((h) => t - h.t <= WINDOW_S + 0.5) || previous;
    this.history.push({ t, model: m });
    while (this.history.length && t - this.history[0].t > WINDOW_S + 2) this.history.shift();

    const rate = (field) => (previous ? (m[field] - previous.model[field]) / (t - previous.t) : null);
    const toks = rate("streamed_tokens");
    const hits = windowStart ? m.prefix_cache_hits - windowStart.model.prefix_cache_hits : 0;
    const queries = windowStart ? m.prefix_cache_queries - windowStart.model.prefix_cache_queries : 0;
    const ttft = windowPercentiles(m.ttft, windowStart && windowStart.model.ttft);
    const itl = windowPercentiles(m.itl, windowStart && windowStart.model.itl);

    const roles = m.replicas.map((r) => r.role || "both");
    const engines = (role) => roles.filter((r) => r === role).length;
    if (!this.disaggregated && roles.some((r) => r !== "both")) this.showHandover();
    const layout = this.disaggregated ? `${engines("prefill")} prefill + ${engines("decode")} decode engines`
      : `${m.replicas.length} replica${m.replicas.length === 1 ? "" : "s"}`;
    this.badge.textContent = `${m.ready ? "ready" : "not ready"} · context ${m.max_model_len} tokens · ${layout}`;
    this.setTile("running", count(m.running));
    this.setTile("waiting", count(m.waiting));
    this.setTile("toks", toks === null ? "–" : perSecond(toks));
    const reasons = Object.entries(m.finished).map(([r, n]) => `${r}: ${n}`).join(", ");
    this.setTile("finished", count(m.finished_total), reasons || "none yet");
    this.setTile("failures", count(m.failures));
    this.setTile("preemptions", count(m.preemptions));
    this.setTile("kv", m.kv_cache_usage === null ? "n/a" : percent(m.kv_cache_usage),
      m.kv_cache_usage === null ? "this engine does not report KV-cache use (dense: one region per slot)" : "");
    const tiers = Object.entries(m.kv_tier_hits || {}).filter(([, n]) => n > 0);
    const swaps = m.kv_swaps || {};
    this.setTile("prefix", m.prefix_cache_hit_rate === null ? "n/a" : percent(m.prefix_cache_hit_rate),
      `${m.prefix_cache_hits} of ${m.prefix_cache_queries} prompt tokens since start` +
      (tiers.length ? `; by tier: ${tiers.map(([tier, n]) => `${tier} ${n}`).join(", ")}` : "") +
      (swaps.out ? `; pages swapped out ${swaps.out}, found again ${swaps.in || 0}` : ""));
    const memory = memoryOf(m);
    this.setTile("memory", formatBytes(memory.total), `weights ${formatBytes(memory.weights)} · KV cache ` +
      `${formatBytes(memory.kv)} (${m.kv_cache_pages} pages)` +
      (memory.state ? ` · recurrent state ${formatBytes(memory.state)}` : ""));
    this.memoryDetail.textContent = `weights ${formatBytes(memory.weights)} · KV ${formatBytes(memory.kv)}` +
      (memory.state ? ` · state ${formatBytes(memory.state)}` : "");
    this.showAdapters(resident);
    this.setTile("ttft", `${seconds(m.ttft.p50)} / ${seconds(m.ttft.p99)}`, `${m.ttft.count} requests since start`);
    this.setTile("itl", `${seconds(m.itl.p50)} / ${seconds(m.itl.p99)}`, `${m.itl.count} gaps since start`);

    this.charts.requests.push({ running: m.running, waiting: m.waiting });
    this.charts.toks.push({ toks });
    this.charts.ttft.push(ttft);
    this.charts.itl.push(itl);
    this.charts.cache.push({ kv: m.kv_cache_usage, hits: queries > 0 ? hits / queries : null });
    this.charts.cache.setNote(m.kv_cache_usage === null ? "The dense engine does not report KV-cache use." : "");
    this.charts.events.push({ finished: rate("finished_total"), preempted: rate("preemptions") });
    const steps = m.steps || {};
    const stepRate = (role) => (previous && previous.model.steps
      ? ((steps[role] || 0) - (previous.model.steps[role] || 0)) / (t - previous.t) : null);
    this.charts.steps.push({ both: stepRate("both"), prefill: stepRate("prefill"), decode: stepRate("decode") });
    if (this.disaggregated) {
      const moved = m.kv_transfer;
      this.setTile("transfer", `${seconds(moved.p50)} / ${seconds(moved.p99)}`, `${moved.count} prefixes moved since start`);
      this.setTile("transferq", count(m.kv_transfer_queue_depth),
        "prefixes between the prefill engines and their decode engine's next step");
      this.charts.handover.push({ handovers: previous && previous.model.kv_transfer
        ? (moved.count - previous.model.kv_transfer.count) / (t - previous.t) : null });
    }
  }
}

// One row per model the server may serve: the router's catalog (several models), else the loaded ones.
function modelRows(stats) {
  const loaded = new Map(stats.models.map((m) => [m.name, m]));
  if (stats.catalog && stats.catalog.length) {
    return stats.catalog.map((e) => ({ id: e.id, state: e.state, path: e.path, loads: e.loads,
      loadSeconds: e.load_seconds, error: e.error, memoryBytes: e.memory_bytes, model: loaded.get(e.id) }));
  }
  return stats.models.map((m) => ({ id: m.name, state: m.ready ? "loaded" : "loading", model: m }));
}

const COLUMNS = ["name", "state", "memory", "weights", "kv", "recurrent", "loads", "load"];

// The Models table: rows keyed by model, kept (not rebuilt) so a hovered title survives the next poll.
class ModelTable {
  constructor(body) {
    this.body = body;
    this.rows = new Map();
  }

  update(rows) {
    const ids = new Set(rows.map((r) => r.id));
    for (const [id, tr] of this.rows) {
      if (!ids.has(id)) {
        tr.remove();
        this.rows.delete(id);
      }
    }
    rows.forEach((row, i) => {
      if (!this.rows.has(row.id)) this.rows.set(row.id, this.addRow(row.id));
      const tr = this.rows.get(row.id);
      this.fill(tr, row);
      if (this.body.children[i] !== tr) this.body.insertBefore(tr, this.body.children[i] || null);
    });
  }

  addRow(id) {
    const tr = document.createElement("tr");
    tr.dataset.model = id;
    for (const key of COLUMNS) {
      const td = document.createElement("td");
      td.dataset.col = key;
      tr.append(td);
    }
    return tr;
  }

  fill(tr, row) {
    const cell = (key) => tr.querySelector(`td[data-col=${key}]`);
    cell("name").textContent = row.id;
    cell("name").title = row.path || "";
    const state = cell("state");
    if (state.dataset.state !== row.state || state.dataset.error !== (row.error || "")) { // (keeps a selection)
      state.dataset.state = row.state;
      state.dataset.error = row.error || "";
      state.textContent = row.state;
      if (row.error) { // a failed load's reason, under its state: the operator's next step
        const error = document.createElement("div");
        error.className = "error";
        error.textContent = row.error;
        state.append(error);
      }
    }
    const m = row.model && memoryOf(row.model);
    const total = Number.isFinite(row.memoryBytes) ? row.memoryBytes : m ? m.total : null;
    cell("memory").textContent = formatBytes(total);
    // an unloaded model's figure is its footprint when last loaded: what loading it again will take
    cell("memory").classList.toggle("stale", !m && total !== null);
    cell("memory").title = !m && total !== null ? "its footprint when it was last loaded" : "";
    cell("weights").textContent = m ? formatBytes(m.weights) : "–";
    cell("kv").textContent = m ? formatBytes(m.kv) : "–";
    cell("kv").title = m ? `${row.model.kv_cache_pages} pages` : "";
    cell("recurrent").textContent = m ? formatBytes(m.state) : "–";
    cell("loads").textContent = count(row.loads);
    cell("load").textContent = Number.isFinite(row.loadSeconds) ? seconds(row.loadSeconds) : "–";
  }
}

const modelTable = new ModelTable(document.querySelector("#model-table tbody"));

// A model unloaded since the last poll loses its panel (the table keeps its row); a loaded one gains one,
// in the server's order.
function updatePanels(stats) {
  const container = $("models");
  const names = new Set(stats.models.map((m) => m.name));
  for (const [name, panel] of panels) {
    if (!names.has(name)) {
      panel.root.remove();
      panels.delete(name);
    }
  }
  stats.models.forEach((model, i) => {
    if (!panels.has(model.name)) panels.set(model.name, new ModelPanel(container, model.name, panelsMade++));
    const panel = panels.get(model.name);
    panel.update(stats.timestamp, model, own(stats.adapters, model.name));
    if (container.children[i] !== panel.root) container.insertBefore(panel.root, container.children[i] || null);
  });
}

let polling = true;

async function poll() {
  try {
    const stats = await getJSON("v1/stats");
    $("banner").hidden = true;
    modelTable.update(modelRows(stats));
    updatePanels(stats);
    $("status").textContent = `up ${formatUptime(stats.uptime_s)} · updated ` +
      new Date(stats.timestamp * 1000).toLocaleTimeString();
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (error) {
    if (error.status === 401) {
      await askForKey(error.message);
    } else {
      $("banner").textContent = `Could not read v1/stats: ${error.message}. Retrying every second.`;
      $("banner").hidden = false;
    }
  }
  if (polling) setTimeout(poll, POLL_MS);
}

window.vsurgeDashboard = { panels, bucketQuantile, formatBytes, stop: () => { polling = false; } };
poll();
