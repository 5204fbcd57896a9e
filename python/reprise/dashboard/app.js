// Reprise dashboard: draws the server's snapshot once a second.
//
// Transport: /api/events read with fetch() as a stream of server-sent events (EventSource cannot send
// the Authorization header); if the stream cannot be opened, ends, or stays silent for STALL_MS (a
// proxy that buffers it), the page polls /api/snapshot every second instead. A 401 from either asks
// for the token again. `?transport=poll` skips the stream.
//
// Safety: table names and client peers are user-chosen text. They only ever reach the page through
// textContent, title or dataset (never innerHTML), and the page's Content-Security-Policy forbids
// inline script besides.
"use strict";

const TOKEN_KEY = "reprise-token";
const POLL_MS = 1000;
const STALL_MS = 5000;
const HISTORY_POINTS = 60;

const $ = (id) => document.getElementById(id);

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  abort: null,            // ends the running stream or poll loop
  previous: null,         // the last snapshot shown: rates between two snapshots come from it
  history: new Map(),     // table name -> {t, inserts, samples}: rates seen by this page, for tables without `rates`
  selected: null,         // name of the table in the detail section
  chart: null,            // the uPlot rate chart
  rows: new Map(),        // table name -> its <tr>
};

class Unauthorized extends Error {}

// --- connection ------------------------------------------------------------------------------------

function connect() {
  if (state.abort) state.abort.abort();
  state.abort = new AbortController();
  setStatus("connecting", "connecting…");
  if (new URLSearchParams(location.search).get("transport") === "poll") {
    poll(state.abort.signal);
  } else {
    stream(state.abort.signal);
  }
}

async function fetchApi(path, signal) {
  const headers = state.token ? { Authorization: `Bearer ${state.token}` } : {};
  const response = await fetch(path, { headers, signal, cache: "no-store" });
  if (response.status === 401) throw new Unauthorized();
  if (!response.ok) throw new Error(`${path} answered HTTP ${response.status}`);
  return response;
}

async function stream(signal) {
  const local = new AbortController();   // aborted by the caller's signal or by the stall watchdog
  const onAbort = () => local.abort();
  signal.addEventListener("abort", onAbort);
  let watchdog = setTimeout(onAbort, STALL_MS);
  try {
    const response = await fetchApi("/api/events", local.signal);
    setStatus("connecting", "waiting for the first snapshot…");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer = (buffer + value).replace(/\r\n/g, "\n");
      const blocks = buffer.split("\n\n");
      buffer = blocks.pop();   // an event not yet complete
      for (const block of blocks) {
        const event = parseEvent(block);
        if (event.type !== "snapshot") continue;   // ": ping" comments and other events
        clearTimeout(watchdog);
        watchdog = setTimeout(onAbort, STALL_MS);
        show(JSON.parse(event.data), "live");
      }
    }
  } catch (err) {
    if (err instanceof Unauthorized) {
      if (!signal.aborted) askForToken(true);
      return;
    }
    if (!signal.aborted) console.warn("event stream failed, polling instead:", err);
  } finally {
    clearTimeout(watchdog);
    signal.removeEventListener("abort", onAbort);
  }
  if (!signal.aborted) poll(signal);
}

// One server-sent event: "event: NAME" and "data: ..." lines; lines starting with ':' are comments.
function parseEvent(block) {
  let type = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") type = value;
    else if (field === "data") data.push(value);
  }
  return { type, data: data.join("\n") };
}

async function poll(signal) {
  while (!signal.aborted) {
    try {
      const response = await fetchApi("/api/snapshot", signal);
      show(await response.json(), "polling");
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof Unauthorized) {
        askForToken(true);
        return;
      }
      setStatus("down", `${err.message}; retrying`);
    }
    await sleep(POLL_MS, signal);
  }
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

// --- token -----------------------------------------------------------------------------------------

// `refused`: the server answered 401 (else the user asked to change the token).
function askForToken(refused) {
  if (refused) {
    if (state.abort) state.abort.abort();
    showError(state.token ? "Wrong or missing token: the server refused the token given. Enter the server's token."
                          : "Wrong or missing token: this server needs one. Enter the server's token.");
    sessionStorage.removeItem(TOKEN_KEY);
    setStatus("auth", "token needed");
  }
  $("token-form").hidden = false;
  $("token-input").value = "";
  $("token-input").focus();
}

function onTokenSubmit(event) {
  event.preventDefault();
  state.token = $("token-input").value.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  $("token-form").hidden = true;
  showError(null);
  connect();
}

// A link may carry the token in its fragment (#token=...): it is never sent to the server, and is
// moved into sessionStorage and out of the address bar at once.
function tokenFromFragment() {
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (token === null) return;
  state.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  history.replaceState(null, "", location.pathname + location.search);
}

// --- drawing ---------------------------------------------------------------------------------------

function show(snapshot, mode) {
  setStatus(mode, mode === "live" ? "live" : "polling every second");
  showError(null);
  $("view").hidden = false;

  const previous = state.previous;
  const dt = previous ? snapshot.time - previous.time : 0;
  const server = snapshot.server || {};
  $("server-name").textContent = server.name || server.address || "";
  $("version").textContent = snapshot.version;
  $("uptime").textContent = formatDuration(snapshot.uptime_seconds);
  $("client-count").textContent = snapshot.clients.length;
  const bytes = snapshot.bytes, before = previous && previous.bytes;
  $("bytes-received").textContent = bytesText(bytes.received, before && before.received, dt);
  $("bytes-sent").textContent = bytesText(bytes.sent, before && before.sent, dt);

  recordHistory(snapshot, previous, dt);
  drawTables(snapshot, previous, dt);
  drawDetail(snapshot);
  drawClients(snapshot, previous, dt);
  state.previous = snapshot;
}

// Rates between this snapshot and the one before, for tables whose `rates` extension is off.
function recordHistory(snapshot, previous, dt) {
  if (!previous || dt <= 0) return;
  const before = new Map(previous.tables.map((t) => [t.name, t]));
  for (const table of snapshot.tables) {
    const old = before.get(table.name);
    if (!old) continue;
    let h = state.history.get(table.name);
    if (!h) state.history.set(table.name, (h = { t: [], inserts: [], samples: [] }));
    h.t.push(snapshot.time);
    h.inserts.push(Math.max(0, table.num_inserts - old.num_inserts) / dt);
    h.samples.push(Math.max(0, table.num_samples - old.num_samples) / dt);
    for (const series of [h.t, h.inserts, h.samples]) series.splice(0, series.length - HISTORY_POINTS);
  }
  for (const name of state.history.keys()) {
    if (!snapshot.tables.some((t) => t.name === name)) state.history.delete(name);
  }
}

function rates(table) {
  const r = table.stats && table.stats.rates;
  if (r) return { inserts: r.insert_rate, samples: r.sample_rate };
  const h = state.history.get(table.name);
  return h ? { inserts: h.inserts.at(-1), samples: h.samples.at(-1) } : { inserts: null, samples: null };
}

const TABLE_FIELDS = ["name", "size", "max_size", "fill", "insert_rate", "sample_rate",
                      "num_inserts", "num_samples", "blocked_insert", "blocked_sample", "sampler"];

function drawTables(snapshot, previous, dt) {
  const tbody = $("table-rows");
  const before = new Map((previous ? previous.tables : []).map((t) => [t.name, t]));
  const names = new Set(snapshot.tables.map((t) => t.name));
  for (const [name, row] of state.rows) {
    if (!names.has(name)) { row.remove(); state.rows.delete(name); }
  }
  if (!names.has(state.selected)) state.selected = snapshot.tables.length ? snapshot.tables[0].name : null;

  for (const table of snapshot.tables) {
    const row = state.rows.get(table.name) || newTableRow(table.name);
    const cell = (field) => row.querySelector(`[data-field="${field}"]`);
    const r = rates(table);
    const limiter = table.rate_limiter;
    const old = before.get(table.name);
    cell("size").textContent = formatCount(table.size);
    cell("max_size").textContent = formatCount(table.max_size);
    const fill = table.max_size > 0 ? table.size / table.max_size : 0;
    cell("fill").querySelector(".fill-bar").style.width = `${Math.min(100, 100 * fill)}%`;
    cell("fill").querySelector(".fill-text").textContent = `${Math.round(100 * fill)}%`;
    cell("insert_rate").textContent = formatRate(r.inserts);
    cell("sample_rate").textContent = formatRate(r.samples);
    cell("num_inserts").textContent = formatCount(table.num_inserts);
    cell("num_samples").textContent = formatCount(table.num_samples);
    cell("blocked_insert").textContent = blockedText(limiter.blocked_insert_seconds,
      old && old.rate_limiter.blocked_insert_seconds, dt);
    cell("blocked_sample").textContent = blockedText(limiter.blocked_sample_seconds,
      old && old.rate_limiter.blocked_sample_seconds, dt);
    cell("sampler").textContent = table.sampler;
    row.classList.toggle("selected", table.name === state.selected);
    row.setAttribute("aria-selected", table.name === state.selected);
    tbody.append(row);   // moves existing rows into server order
  }
}

function newTableRow(name) {
  const row = document.createElement("tr");
  row.dataset.table = name;
  row.tabIndex = 0;
  for (const field of TABLE_FIELDS) {
    const td = document.createElement("td");
    td.dataset.field = field;
    row.append(td);
  }
  row.querySelector('[data-field="name"]').textContent = name;
  const fill = row.querySelector('[data-field="fill"]');
  fill.append(element("div", "fill", element("div", "fill-track", element("div", "fill-bar")),
                     element("span", "fill-text")));
  const select = () => {
    state.selected = name;
    for (const [other, r] of state.rows) {
      r.classList.toggle("selected", other === name);
      r.setAttribute("aria-selected", other === name);
    }
    if (state.previous) drawDetail(state.previous);
  };
  row.addEventListener("click", select);
  row.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") select(); });
  state.rows.set(name, row);
  return row;
}

function drawDetail(snapshot) {
  const table = snapshot.tables.find((t) => t.name === state.selected);
  $("detail").hidden = !table;
  if (!table) return;
  $("detail").dataset.table = table.name;
  $("detail-name").textContent = table.name;
  $("store-memory").textContent = storeMemory(table.store);
  const stats = table.stats || {};
  drawRateChart(rateSeries(table, snapshot));
  drawHistogram($("priority-histogram"), stats.priority_histogram, formatNumber);
  const age = stats.sampled_age;
  drawHistogram($("age-inserts-histogram"), age && age.inserts, formatNumber);
  drawHistogram($("age-seconds-histogram"), age && age.seconds, (s) => formatNumber(s) + " s");
  $("mean-age-inserts").textContent = age && age.mean_inserts != null ? `mean ${formatNumber(age.mean_inserts)}` : "";
  $("mean-age-seconds").textContent = age && age.mean_seconds != null ? `mean ${formatNumber(age.mean_seconds)} s` : "";
  drawHistogram($("times-sampled-histogram"), stats.times_sampled, formatNumber);
  const unique = stats.unique_samples;
  $("unique-fraction").textContent = unique && unique.fraction != null
    ? `${Math.round(100 * unique.fraction)}% unique in the last ${formatCount(unique.window)} draws` : "";
  drawStaleness(table, stats.staleness);
}

// What the table's store takes: "store 12 MB of 1.4 GB raw (117x)" (compressed or sparse).
function storeMemory(store) {
  if (!store || !store.raw_bytes) return "";
  const ratio = store.stored_bytes > 0 ? store.raw_bytes / store.stored_bytes : null;
  return `store ${formatBytes(store.stored_bytes)} of ${formatBytes(store.raw_bytes)} raw` +
    (ratio != null && ratio >= 1.05 ? ` (${formatNumber(ratio)}x)` : "");
}

// How many policy versions behind the table's version drawn items were (tables with a
// `version` attribute), with the version, the staleness counters and the pending groups.
function drawStaleness(table, s) {
  const hist = s ? { counts: s.behind, bounds: s.behind.map((_, i) => i).concat([s.behind.length]),
                     total: s.behind.reduce((a, b) => a + b, 0) } : null;
  drawHistogram($("staleness-histogram"), hist, (v) => (s && v >= s.behind.length ? "∞" : String(v)));
  const parts = [];
  if (table.version != null) parts.push(`version ${formatCount(table.version)}`);
  if (s && s.max_staleness != null) parts.push(`max ${formatCount(s.max_staleness)} behind`);
  if (table.stale_removed) parts.push(`${formatCount(table.stale_removed)} removed stale`);
  if (table.stale_dropped) parts.push(`${formatCount(table.stale_dropped)} dropped stale`);
  if (table.groups) parts.push(`${formatCount(table.groups.pending)} groups pending`);
  $("staleness-summary").textContent = parts.join(" · ");
}

// [times, inserts/s, samples/s]: from the table's `rates` extension, else from what this page saw
// between snapshots. The extension's per-second counts end with the second still filling (left out)
// and always span its whole window, zeros where nothing was counted: the seconds before the server
// started are left out too, so that the chart starts with the server instead of drawing a window of
// zeros that never happened. Count i of n is charted at the second `end - n + i` of this clock, but
// was counted on the table's extension clock, whose seconds begin up to a second apart: so that no
// count of the server's first second is dropped, counts are kept from the second before the one the
// server started in (the chart may open on one zero).
function rateSeries(table, snapshot) {
  const r = table.stats && table.stats.rates;
  if (r) {
    const n = r.inserts.length - 1;
    const end = Math.floor(snapshot.time);
    const started = snapshot.time - (snapshot.uptime_seconds ?? Infinity);
    const first = Math.max(0, n + Math.floor(started - end) - 1);
    const times = [];
    for (let i = first; i < n; i++) times.push(end - n + i);
    return [times, r.inserts.slice(first, n), r.samples.slice(first, n)];
  }
  const h = state.history.get(table.name);
  return h ? [h.t.slice(), h.inserts.slice(), h.samples.slice()] : [[], [], []];
}

function drawRateChart(data) {
  const box = $("rate-chart");
  box.dataset.points = data[0].length;
  box.dataset.firstTime = data[0].length ? data[0][0] : "";
  box.dataset.lastTime = data[0].length ? data[0].at(-1) : "";
  box.dataset.inserts = Math.round(data[1].reduce((a, b) => a + b, 0));
  box.dataset.samples = Math.round(data[2].reduce((a, b) => a + b, 0));
  if (typeof uPlot === "undefined") return;   // the numbers above still show
  if (state.chart) {
    state.chart.setData(data);
    return;
  }
  state.chart = new uPlot({
    width: chartWidth(), height: 220,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
    series: [
      {},
      { label: "inserts/s", stroke: "#2b6cb0", width: 2, value: (u, v) => formatRate(v) },
      { label: "samples/s", stroke: "#c05621", width: 2, value: (u, v) => formatRate(v) },
    ],
    axes: [{}, { size: 60 }],
  }, data, box);
}

function chartWidth() {
  return Math.max(300, $("rate-chart").clientWidth);
}

// Bars for a histogram {bounds, counts, total}; bar i spans [bounds[i], bounds[i+1]).
function drawHistogram(box, hist, formatBound) {
  box.dataset.total = hist ? hist.total : "";
  if (!hist || hist.counts.length === 0) {
    box.replaceChildren(element("p", "muted", hist ? "empty" : "not collected for this table"));
    return;
  }
  let bars = box.querySelector(".bars");
  if (!bars || bars.children.length !== hist.counts.length) {
    bars = element("div", "bars");
    for (let i = 0; i < hist.counts.length; i++) bars.append(element("div", "bar"));
    box.replaceChildren(bars, element("div", "axis", element("span"), element("span", "total"), element("span")));
  }
  const max = Math.max(...hist.counts);
  hist.counts.forEach((count, i) => {
    const bar = bars.children[i];
    bar.style.height = `${max > 0 ? (100 * count) / max : 0}%`;
    bar.title = `[${formatBound(hist.bounds[i])}, ${formatBound(hist.bounds[i + 1])}): ${formatCount(count)}`;
  });
  const [low, total, high] = box.querySelectorAll(".axis span");
  low.textContent = formatBound(hist.bounds[0]);
  total.textContent = `${formatCount(hist.total)} in all`;
  high.textContent = formatBound(hist.bounds.at(-1));
}

const CLIENT_FIELDS = ["id", "kind", "peer", "connected", "inserts", "samples"];

function drawClients(snapshot, previous, dt) {
  const before = new Map((previous ? previous.clients : []).map((c) => [c.id, c]));
  const rows = snapshot.clients.map((client) => {
    const row = document.createElement("tr");
    row.dataset.client = client.id;
    const old = before.get(client.id);
    const text = {
      id: String(client.id),
      kind: client.kind,
      peer: client.peer,
      connected: formatDuration(client.connected_seconds),
      inserts: countsText(client.inserts, old && old.inserts, dt),
      samples: countsText(client.samples, old && old.samples, dt),
    };
    for (const field of CLIENT_FIELDS) {
      const td = element("td", null, text[field]);
      td.dataset.field = field;
      row.append(td);
    }
    row.querySelector('[data-field="inserts"]').title = perTable(client.inserts);
    row.querySelector('[data-field="samples"]').title = perTable(client.samples);
    return row;
  });
  $("client-rows").replaceChildren(...rows);
}

// --- text ------------------------------------------------------------------------------------------

function element(tag, className, ...children) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  el.append(...children);   // strings become text nodes
  return el;
}

function setStatus(stateName, text) {
  const status = $("status");
  status.dataset.state = stateName;
  status.textContent = text;
}

function showError(text) {
  const box = $("error");
  box.hidden = text === null;
  box.textContent = text || "";
}

function formatCount(n) {
  return n == null ? "—" : Number(n).toLocaleString("en-US");
}

function formatRate(r) {
  if (r == null || !Number.isFinite(r)) return "—";
  return r < 10 ? r.toFixed(1) : Math.round(r).toLocaleString("en-US");
}

function formatNumber(x) {
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e-3 && a < 1e5) return String(Number(x.toPrecision(3)));
  return x.toExponential(1);
}

function formatDuration(s) {
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

function formatBytes(n) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

function bytesText(total, before, dt) {
  const rate = before != null && dt > 0 ? ` (${formatBytes(Math.max(0, total - before) / dt)}/s)` : "";
  return formatBytes(total) + rate;
}

// Cumulative seconds blocked, and the share of the last interval spent blocked (summed over the
// waiting threads, so several blocked writers can exceed 100%).
function blockedText(seconds, before, dt) {
  const share = before != null && dt > 0 ? ` · ${Math.round((100 * Math.max(0, seconds - before)) / dt)}%` : "";
  return `${formatNumber(seconds)} s${share}`;
}

function countsText(counts, before, dt) {
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  if (!before || dt <= 0) return formatCount(total);
  const old = Object.values(before).reduce((a, b) => a + b, 0);
  return `${formatCount(total)} (${formatRate(Math.max(0, total - old) / dt)}/s)`;
}

function perTable(counts) {
  return Object.entries(counts).map(([table, n]) => `${table}: ${formatCount(n)}`).join("\n");
}

// --- start -----------------------------------------------------------------------------------------

$("token-form").addEventListener("submit", onTokenSubmit);
$("change-token").addEventListener("click", () => askForToken(false));
window.addEventListener("resize", () => {
  if (state.chart) state.chart.setSize({ width: chartWidth(), height: 220 });
});
tokenFromFragment();
connect();
