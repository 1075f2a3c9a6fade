// The console page: tabs, a one-second refresh of the shown tab, and the message lookup.
// Every value from the store goes into the page through textContent (message bodies are
// hostile input); no HTML is ever built from data.
"use strict";

const REFRESH_MS = 1000;
const TABS = ["overview", "topics", "groups", "lookup", "events"];

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function byId(id) { return document.getElementById(id); }

async function getJson(path) {
  const response = await fetch(path, {credentials: "same-origin", cache: "no-store"});
  const data = await response.json().catch(() => ({error: "HTTP " + response.status}));
  if (!response.ok) throw new Error(data.error || "HTTP " + response.status);
  return data;
}

// A column's unit comes from its name, as the API names fields: *_ts_ms, *_time_ms, *_at_ms
// are epoch stamps, other *_ms and *_s durations, *_bytes sizes.
function isTimeColumn(name) { return /(_ts_ms|_time_ms|_at_ms|^at_ms)$/.test(name); }
function isDurationColumn(name) { return !isTimeColumn(name) && /(_ms|_s)$/.test(name); }
function isBytesColumn(name) { return /_bytes$/.test(name); }

// Header words of columns whose name alone would read badly once the unit is in the cell.
const HEADERS = {
  uptime_s: "uptime", heartbeat_ms: "heartbeat age", rss_bytes: "memory (RSS)", cpu_percent: "CPU %",
  lag_bytes: "lag", lag_ms: "lag (time)", stored_bytes: "stored", lag_messages: "lag (messages)",
};

function headerText(name) {
  if (HEADERS[name]) return HEADERS[name];
  return (isTimeColumn(name) ? name.replace(/_ms$/, "") : name).replaceAll("_", " ");
}

function cellText(name, value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") {
    if (isTimeColumn(name)) return formatTime(value);
    if (isDurationColumn(name)) return formatDuration(/_s$/.test(name) ? value * 1000 : value);
    if (isBytesColumn(name)) return formatBytes(value);
  }
  if (Array.isArray(value)) return value.join(", ");
  if (typeof value === "object") return JSON.stringify(value);
  return value;
}

// Fills <table> with one row per object; columns are the keys of the first row unless given.
function fillTable(table, rows, columns) {
  table.replaceChildren();
  const cols = columns || (rows.length ? Object.keys(rows[0]) : []);
  const head = table.createTHead().insertRow();
  for (const col of cols) head.appendChild(el("th", headerText(col)));
  const body = table.createTBody();
  if (!rows.length) {
    const cell = body.insertRow().insertCell();
    cell.colSpan = Math.max(cols.length, 1);
    cell.textContent = "none";
    cell.className = "muted";
  }
  for (const row of rows) {
    const tr = body.insertRow();
    for (const col of cols) {
      const td = tr.insertCell();
      td.textContent = String(cellText(col, row[col]));
      if (typeof row[col] === "number") td.className = "num";
      td.dataset.column = col;
    }
  }
}

function pairsTable(table, object) {
  fillTable(table, Object.entries(object || {}).map(([name, value]) => ({name, value})), ["name", "value"]);
}

function showError(id, error) {
  const node = byId(id);
  node.hidden = !error;
  node.textContent = error ? String(error.message || error) : "";
}

// ------------------------------------------------------------------ overview
function renderOverview(data) {
  const status = data.status;
  if (!status) return;
  byId("store-path").textContent = status.store;
  const state = byId("state");
  state.textContent = status.state;
  state.className = "state " + status.state;
  if (!status.running) {
    byId("overview-detail").textContent = status.detail || "";
    return;
  }
  byId("overview-detail").textContent = "supervisor pid " + status.supervisor_pid + ", generation " +
    status.generation + ", flush " + status.flush + ", " + status.index_shards + " index shard(s)";
  byId("append-rate").textContent = formatAmount(status.rates.append_msgs_per_s);
  byId("dispatch-rate").textContent = formatAmount(status.rates.dispatch_msgs_per_s);
  byId("flush-rate").textContent = formatAmount(status.rates.flushes_per_s);
  byId("appended-total").textContent = String(status.totals.appended_msgs);
  byId("written-pos").textContent = String(status.positions.written);
  const lagMs = status.lag_ms.dispatch;
  byId("dispatch-lag").textContent = formatBytes(status.lag_bytes.dispatch) +
    (lagMs === null ? "" : ", " + formatDuration(lagMs));
  fillTable(byId("processes-table"), status.processes.map((p) => ({
    role: p.role + (p.role === "index_builder" ? "[" + p.shard + "]" : ""), pid: p.pid, state: p.state,
    uptime_s: p.uptime_s, restarts: p.restarts, rss_bytes: p.rss_bytes,
    cpu_percent: p.cpu_percent, heartbeat_ms: p.heartbeat_age_ms,
  })));
  const pos = status.positions;
  const positions = [
    {part: "written", commit_pos: pos.written, lag_bytes: null, lag_ms: null},
    {part: "flushed", commit_pos: pos.flushed, lag_bytes: status.lag_bytes.flush, lag_ms: status.lag_ms.flush},
    {part: "dispatched", commit_pos: pos.dispatched, lag_bytes: status.lag_bytes.dispatch, lag_ms: lagMs},
  ];
  pos.indexed.forEach((p, shard) => positions.push({part: "indexed[" + shard + "]", commit_pos: p,
    lag_bytes: status.lag_bytes.index[shard], lag_ms: status.lag_ms.index[shard]}));
  fillTable(byId("positions-table"), positions);
  pairsTable(byId("retention-table"), retentionRows(status.retention));
  const history = data.history;
  drawLineChart(byId("chart-rates"), [
    {label: "append", values: history.map((h) => h.append_msgs_per_s)},
    {label: "dispatch", values: history.map((h) => h.dispatch_msgs_per_s)},
  ], RATE_SCALE);
  drawLineChart(byId("chart-lags"), [
    {label: "flush", values: history.map((h) => h.flush_lag_bytes)},
    {label: "dispatch", values: history.map((h) => h.dispatch_lag_bytes)},
    {label: "index (max)", values: history.map((h) => h.index_lag_bytes)},
  ], BYTE_SCALE);
}

// The retention facts of `mqstore status` in words, each value in its unit.
function retentionRows(retention) {
  const allocated = retention.bytes_allocated || {};
  const used = retention.bytes_used || {};
  const onDisk = (part) => formatBytes(allocated[part]) + " (" + formatBytes(used[part]) + " used)";
  const oldest = retention.oldest_retained_ms;
  const lastPass = retention.last_pass_ms;
  return {
    "oldest retained message": oldest === null ? "none (no message)" :
      formatTime(oldest) + " (" + formatDuration(Math.max(Date.now() - oldest, 0)) + " ago)",
    "retention line (commit_pos)": String(retention.min_commit_pos),
    "commitlog on disk": onDisk("commitlog"),
    "consume queues on disk": onDisk("consumequeue"),
    "index on disk": onDisk("index"),
    "retention passes": String(retention.passes),
    "segments removed": retention.segments_removed + " (" + formatBytes(retention.bytes_removed) + ")",
    "last pass": lastPass === null ? "none yet" : formatTime(lastPass) + " (trigger: " + retention.last_reason + ")",
  };
}

// ------------------------------------------------------------------ topics, groups, events
async function refreshTopics() {
  try {
    fillTable(byId("topics-table"), (await getJson("/api/topics")).topics);
    showError("topics-error", null);
  } catch (error) { showError("topics-error", error); }
}

async function refreshGroups() {
  try {
    const groups = (await getJson("/api/groups")).groups;
    fillTable(byId("groups-table"), groups, ["group", "topics", "queue_count", "last_commit_time_ms"]);
    const select = byId("lag-group");
    const chosen = select.value;
    const names = [...new Set(groups.map((g) => g.group))];
    if (select.options.length !== names.length + 1) {
      select.replaceChildren(el("option", "all groups"));
      select.options[0].value = "";
      for (const name of names) { const option = el("option", name); option.value = name; select.appendChild(option); }
      select.value = chosen;
    }
    const query = select.value ? "?group=" + encodeURIComponent(select.value) : "";
    fillTable(byId("lag-table"), (await getJson("/api/lag" + query)).lag);
    showError("groups-error", null);
  } catch (error) { showError("groups-error", error); }
}

async function refreshEvents() {
  const data = await getJson("/api/events");
  byId("events-source").textContent = data.source;
  fillTable(byId("events-table"), data.events, ["at_ms", "kind", "process", "message"]);
  for (const cell of byId("events-table").querySelectorAll("td[data-column=kind]")) {
    cell.classList.add("kind", "kind-" + cell.textContent);
  }
}

// ------------------------------------------------------------------ lookup
function showLookupFields() {
  const by = byId("lookup-by").value;
  for (const label of byId("lookup-form").querySelectorAll("label[data-for]")) {
    label.hidden = !label.dataset.for.split(" ").includes(by);
  }
}

function messageCard(message) {
  const card = el("div", null, "message");
  card.appendChild(el("strong", message.topic + "/" + message.queue_id + " @ " + message.queue_offset));
  const fields = el("table", null, "fields");
  const shown = {msg_id: message.msg_id, commit_pos: message.commit_pos, store_time: formatTime(message.store_ts_ms),
    born_time: formatTime(message.born_ts_ms), tags: message.tags, keys: message.keys,
    uniq_key: message.uniq_key, body: formatBytes(message.body_bytes)};
  pairsTable(fields, shown);
  const props = el("table", null, "properties");
  pairsTable(props, message.properties);
  const meta = el("div", null, "meta");
  const left = el("div"), right = el("div");
  left.append(el("div", "message", "muted"), fields);
  right.append(el("div", "properties", "muted"), props);
  meta.append(left, right);
  card.appendChild(meta);
  const asText = el("button", "text", "toggle");
  const asHex = el("button", "hex", "toggle");
  const body = el("pre", null, "body");
  const hex = message.body_hex.replace(/(..)/g, "$1 ").trim() + (message.body_hex_truncated ? " …" : "");
  const show = (text) => { body.textContent = text; };
  asText.type = asHex.type = "button";
  asText.addEventListener("click", () => show(message.body_text === null ? "(not UTF-8 text: see hex)" : message.body_text));
  asHex.addEventListener("click", () => show(hex));
  card.appendChild(el("div", "body", "muted"));
  card.append(asText, asHex, body);
  show(message.body_text === null ? hex : message.body_text);
  return card;
}

async function lookUp(event) {
  event.preventDefault();
  const form = new FormData(byId("lookup-form"));
  const by = form.get("by");
  const params = new URLSearchParams({by});
  const wanted = {key: ["topic", "key"], msg_id: ["msg_id"], offset: ["topic", "queue_id", "queue_offset"]}[by];
  for (const name of wanted) params.set(name, form.get(name) || "");
  const results = byId("lookup-results");
  const status = byId("lookup-status");
  results.replaceChildren();
  status.textContent = "looking up…";
  status.className = "muted";
  try {
    const data = await getJson("/api/lookup?" + params.toString());
    status.textContent = data.messages.length + " message(s)" +
      (data.skipped.length ? ", " + data.skipped.length + " corrupt record(s) skipped" : "");
    for (const message of data.messages) results.appendChild(messageCard(message));
  } catch (error) {
    status.textContent = String(error.message || error);
    status.className = "error";
  }
}

// ------------------------------------------------------------------ tabs and refresh
const REFRESHERS = {
  overview: async () => renderOverview(await getJson("/api/overview")),
  topics: refreshTopics, groups: refreshGroups, events: refreshEvents, lookup: async () => {},
};

function currentTab() {
  const name = location.hash.slice(1);
  return TABS.includes(name) ? name : "overview";
}

function showTab() {
  const tab = currentTab();
  for (const name of TABS) byId("tab-" + name).hidden = name !== tab;
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.tab === tab);
  refresh();
}

let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    if (currentTab() !== "overview") renderOverview(await getJson("/api/overview"));  // the header's state
    await REFRESHERS[currentTab()]();
    byId("updated").textContent = "updated " + formatTime(Date.now());
  } catch (error) {
    byId("updated").textContent = "update failed: " + (error.message || error);
  } finally {
    refreshing = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  if (location.search.includes("token=")) history.replaceState(null, "", location.pathname + location.hash);
  byId("lookup-by").addEventListener("change", showLookupFields);
  byId("lookup-form").addEventListener("submit", lookUp);
  byId("lag-group").addEventListener("change", refresh);
  window.addEventListener("hashchange", showTab);
  showLookupFields();
  showTab();
  setInterval(refresh, REFRESH_MS);
});
