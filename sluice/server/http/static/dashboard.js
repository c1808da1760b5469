// sluice dashboard: reads /metrics every second and draws its own charts.
// Rates and percentiles are over the last interval, from counter and
// histogram-bucket differences between two scrapes.
"use strict";

const INTERVAL_MS = 1000;
const MAX_POINTS = 120; // two minutes of history
const COLORS = ["#2f6fdf", "#e67e22", "#27ae60", "#8e44ad"];

// name -> [{labels, value}] from the Prometheus text exposition.
function parseMetrics(text) {
  const metrics = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([^\s{]+)(?:\{(.*)\})?\s+(\S+)/);
    if (!match) continue;
    const labels = {};
    for (const pair of (match[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
      labels[pair[1]] = pair[2];
    }
    if (!metrics.has(match[1])) metrics.set(match[1], []);
    metrics.get(match[1]).push({ labels, value: Number(match[3]) });
  }
  return metrics;
}

// The model the charts show ("": every model); samples without a model_name
// label (the server's own: connections, refusals, the loop) always count.
let selectedModel = "";

function ofSelectedModel(sample) {
  const model = sample.labels.model_name;
  return selectedModel === "" || model === undefined || model === selectedModel;
}

// The sum of a metric's samples (only those of API key `key`, if given).
function sum(metrics, name, key) {
  return (metrics.get(name) || [])
    .filter((sample) => key === undefined || sample.labels.key === key)
    .filter(ofSelectedModel)
    .reduce((total, sample) => total + sample.value, 0);
}

// The model selector offers every model_name the metrics carry (shown once
// the server serves several).
function updateModelFilter(metrics) {
  const names = new Set();
  for (const samples of metrics.values()) {
    for (const sample of samples) {
      if (sample.labels.model_name !== undefined) names.add(sample.labels.model_name);
    }
  }
  const select = document.getElementById("model-filter");
  const known = new Set([...select.options].map((option) => option.value));
  for (const name of [...names].sort()) {
    if (known.has(name)) continue;
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    select.appendChild(option);
  }
  document.getElementById("model-filter-label").hidden = names.size < 2;
}

// Cumulative bucket counts by upper bound ("le"), in bound order, summed over
// the other labels (each API key has its own histogram) or of key `key` only.
function buckets(metrics, name, key) {
  const byBound = new Map();
  for (const s of metrics.get(`${name}_bucket`) || []) {
    if (key !== undefined && s.labels.key !== key) continue;
    if (!ofSelectedModel(s)) continue;
    const le = Number(s.labels.le);
    byBound.set(le, (byBound.get(le) || 0) + s.value);
  }
  return [...byBound].map(([le, count]) => ({ le, count })).sort((a, b) => a.le - b.le);
}

// One row per API key (the `key` label of the request series; none without
// keys): requests finished, tokens delivered per second and time to first
// token (p50) over the last interval, prompt tokens in all.
function keyRows(metrics, before, dt) {
  const names = new Set();
  for (const sample of metrics.get("sluice:request_success_total") || []) {
    if (sample.labels.key !== undefined) names.add(sample.labels.key);
  }
  const ttft = "sluice:time_to_first_token_seconds";
  return [...names].sort().map((key) => {
    const delta = (name) => sum(metrics, name, key) - sum(before, name, key);
    const p50 = quantile(0.5, buckets(before, ttft, key), buckets(metrics, ttft, key));
    return {
      key,
      requests: sum(metrics, "sluice:request_success_total", key),
      tokensPerS: delta("sluice:tokens_per_chunk_sum") / dt,
      ttftP50Ms: p50 === null ? null : 1000 * p50,
      promptTokens: sum(metrics, "sluice:prompt_tokens_total", key),
    };
  });
}

function updateKeys(metrics, before, dt) {
  const rows = keyRows(metrics, before, dt);
  const section = document.getElementById("keys");
  section.hidden = rows.length === 0;
  section.querySelector("tbody").innerHTML = rows.map((row) =>
    `<tr><td>${escapeHtml(row.key)}</td><td>${formatNumber(row.requests)}</td>`
    + `<td>${formatNumber(row.tokensPerS)}</td><td>${formatNumber(row.ttftP50Ms)}</td>`
    + `<td>${formatNumber(row.promptTokens)}</td></tr>`).join("");
}

function escapeHtml(text) {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

// The q-quantile of the observations between two scrapes (linear in a bucket).
function quantile(q, before, after) {
  const counts = after.map((b, i) => ({ le: b.le, count: b.count - (before[i]?.count || 0) }));
  const total = counts.length ? counts[counts.length - 1].count : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lower = 0, below = 0;
  for (const bucket of counts) {
    if (bucket.count >= rank) {
      if (!Number.isFinite(bucket.le)) return lower;
      const inside = bucket.count - below;
      return lower + (bucket.le - lower) * (inside ? (rank - below) / inside : 1);
    }
    lower = bucket.le;
    below = bucket.count;
  }
  return lower;
}

// What each card shows: its title, its series (from two scrapes and the seconds
// between them), and how a value reads.
const CARDS = [
  { id: "requests", title: "Requests running / waiting", unit: "",
    series: { running: (m) => sum(m, "sluice:num_requests_running"),
              waiting: (m) => sum(m, "sluice:num_requests_waiting") } },
  { id: "kv", title: "KV cache in use", unit: "%",
    series: { used: (m) => 100 * sum(m, "sluice:kv_cache_usage_perc") } },
  // Tokens handed to clients (reported within a second), not counted at finish.
  { id: "throughput", title: "Generated tokens / s", unit: "",
    series: { "tokens/s": (m, p, dt) => (sum(m, "sluice:tokens_per_chunk_sum")
                                         - sum(p, "sluice:tokens_per_chunk_sum")) / dt } },
  { id: "ttft", title: "Time to first token (last interval)", unit: " ms",
    series: histogramQuantiles("sluice:time_to_first_token_seconds") },
  { id: "itl", title: "Inter-token latency (last interval)", unit: " ms",
    series: histogramQuantiles("sluice:inter_token_latency_seconds") },
  { id: "chunk", title: "Tokens per chunk (coalescing)", unit: "",
    series: { mean: (m, p) => ratioOfDeltas(m, p, "sluice:tokens_per_chunk") } },
  // With --speculative-config: drafted tokens the model accepted (none drafted: no point).
  { id: "spec", title: "Speculative decoding: drafted tokens accepted (last interval)", unit: "%",
    series: { accepted: (m, p) => acceptanceRate(m, p) } },
  { id: "lag", title: "Event-loop lag, worst of the last window", unit: " ms",
    series: { lag: (m) => 1000 * sum(m, "sluice:event_loop_lag_max_seconds") } },
  { id: "refusals", title: "Refused / aborted / engine restarts (total)", unit: "",
    series: { refused: (m) => sum(m, "sluice:requests_refused_total"),
              aborted: (m) => sum(m, "sluice:request_aborted_total"),
              restarts: (m) => sum(m, "sluice:engine_restarts_total") } },
];

function histogramQuantiles(name) {
  const at = (q) => (m, p) => {
    const value = quantile(q, buckets(p, name), buckets(m, name));
    return value === null ? null : 1000 * value;
  };
  return { p50: at(0.5), p95: at(0.95), p99: at(0.99) };
}

function acceptanceRate(m, p) {
  const delta = (name) => sum(m, `sluice:spec_decode_num_${name}_total`)
                          - sum(p, `sluice:spec_decode_num_${name}_total`);
  const drafted = delta("draft_tokens");
  return drafted > 0 ? 100 * delta("accepted_tokens") / drafted : null;
}

function ratioOfDeltas(m, p, name) {
  const count = sum(m, `${name}_count`) - sum(p, `${name}_count`);
  return count > 0 ? (sum(m, `${name}_sum`) - sum(p, `${name}_sum`)) / count : null;
}

function buildCards() {
  for (const card of CARDS) {
    const element = document.createElement("section");
    element.className = "card";
    element.innerHTML = `<h2>${card.title}</h2><div class="value"></div>`
      + `<canvas data-points="0"></canvas><div class="legend"></div>`;
    element.id = `card-${card.id}`;
    const legend = Object.keys(card.series).map((label, i) =>
      `<span style="color:${COLORS[i]}">■ ${label}</span>`).join("");
    element.querySelector(".legend").innerHTML = legend;
    document.getElementById("cards").appendChild(element);
    card.points = Object.fromEntries(Object.keys(card.series).map((label) => [label, []]));
  }
}

// A line chart of `series` (label -> values, null = no data) on `canvas`.
function drawChart(canvas, series) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = canvas.clientWidth * ratio;
  canvas.height = canvas.clientHeight * ratio;
  const context = canvas.getContext("2d");
  context.scale(ratio, ratio);
  const width = canvas.clientWidth, height = canvas.clientHeight, pad = 4;
  const values = Object.values(series).flat().filter((v) => v !== null);
  const top = Math.max(1e-9, ...values) * 1.1;
  context.strokeStyle = "#dde1e8";
  context.strokeRect(0.5, 0.5, width - 1, height - 1);
  context.fillStyle = "#6b7385";
  context.font = "11px system-ui";
  context.fillText(formatNumber(top), 4, 12);
  Object.values(series).forEach((points, index) => {
    context.strokeStyle = COLORS[index];
    context.lineWidth = 1.5;
    context.beginPath();
    let isDrawing = false;
    points.forEach((value, i) => {
      if (value === null) { isDrawing = false; return; }
      const x = pad + (width - 2 * pad) * (i + MAX_POINTS - points.length) / (MAX_POINTS - 1);
      const y = height - pad - (height - 2 * pad) * value / top;
      if (isDrawing) context.lineTo(x, y); else context.moveTo(x, y);
      isDrawing = true;
      context.fillStyle = COLORS[index];
      context.fillRect(x - 1.5, y - 1.5, 3, 3); // a lone point shows too
    });
    context.stroke();
  });
}

function formatNumber(value) {
  if (value === null || value === undefined) return "–";
  if (Number.isInteger(value)) return String(value);
  if (Math.abs(value) >= 100) return value.toFixed(0);
  return value.toFixed(Math.abs(value) >= 10 ? 1 : 2);
}

let previous = null, previousMs = 0;

async function tick() {
  const response = await fetch("/metrics");
  const metrics = parseMetrics(await response.text());
  updateModelFilter(metrics);
  const nowMs = performance.now();
  if (previous !== null) {
    const dt = (nowMs - previousMs) / 1000;
    for (const card of CARDS) update(card, metrics, previous, dt);
    updateKeys(metrics, previous, dt);
  }
  previous = metrics;
  previousMs = nowMs;
  document.getElementById("status").textContent =
    `updated ${new Date().toLocaleTimeString()}`;
}

function update(card, metrics, before, dt) {
  const element = document.getElementById(`card-${card.id}`);
  const shown = [];
  for (const [label, read] of Object.entries(card.series)) {
    const value = read(metrics, before, dt);
    const points = card.points[label];
    points.push(value);
    if (points.length > MAX_POINTS) points.shift();
    shown.push(`${label} ${formatNumber(value)}${value === null ? "" : card.unit}`);
  }
  element.querySelector(".value").textContent = shown.join(" · ");
  const canvas = element.querySelector("canvas");
  drawChart(canvas, card.points);
  canvas.dataset.points = String(Object.values(card.points)[0].length);
}

buildCards();
// A new choice restarts the charts: they show one model's series from then on.
document.getElementById("model-filter").addEventListener("change", (event) => {
  selectedModel = event.target.value;
  for (const card of CARDS) {
    for (const points of Object.values(card.points)) points.length = 0;
  }
  previous = null;
});
tick();
setInterval(() => tick().catch((error) => {
  document.getElementById("status").textContent = `cannot read /metrics: ${error}`;
}), INTERVAL_MS);
