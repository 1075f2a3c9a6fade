// Values in the units people read, as `mqstore topics`/`lag` print them (tools/ops_commands.py)
// and as the RocketMQ dashboard and Grafana show them: bytes in KiB/MiB/GiB, durations in
// ms/s/min/h, one date format with its zone, rates and chart ticks without float noise.
"use strict";

const BYTE_UNITS = ["KiB", "MiB", "GiB", "TiB"];

// Bytes in B below 1 KiB, else in the largest binary unit, one decimal (human_bytes).
function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  if (Math.abs(bytes) < 1024) return Math.round(bytes) + " B";
  let value = bytes, unit = -1;
  while (Math.abs(value) >= 1024 && unit < BYTE_UNITS.length - 1) { value /= 1024; unit++; }
  return value.toFixed(1) + " " + BYTE_UNITS[unit];
}

// Milliseconds as ms below 1 s, then s below 2 min, min below 2 h, else h (human_ms).
function formatDuration(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return Math.round(ms) + " ms";
  const seconds = ms / 1000;
  if (seconds < 120) return seconds.toFixed(1) + " s";
  return seconds < 7200 ? (seconds / 60).toFixed(1) + " min" : (seconds / 3600).toFixed(1) + " h";
}

function pad(number, width) { return String(number).padStart(width || 2, "0"); }

// The browser's zone as UTC or UTC±hh:mm, for the date it applies to.
function zoneOf(date) {
  const offset = -date.getTimezoneOffset();
  if (offset === 0) return "UTC";
  const abs = Math.abs(offset);
  return "UTC" + (offset > 0 ? "+" : "-") + pad(Math.floor(abs / 60)) + ":" + pad(abs % 60);
}

// An epoch-ms stamp as YYYY-MM-DD HH:MM:SS in the browser's zone, the zone named.
function formatTime(ms) {
  if (ms === null || ms === undefined || ms <= 0) return "–";
  const d = new Date(ms);
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + " " + zoneOf(d);
}

// A count or rate with k/M/G, at most one decimal and no trailing ".0" (1k, 2.5k, 231.7).
function formatAmount(value) {
  if (value === null || value === undefined) return "–";
  const abs = Math.abs(value);
  const scaled = abs >= 1e9 ? [value / 1e9, "G"] : abs >= 1e6 ? [value / 1e6, "M"] :
    abs >= 1e3 ? [value / 1e3, "k"] : [value, ""];
  return String(Math.round(scaled[0] * 10) / 10) + scaled[1];
}

// The smallest step of 1, 2, 2.5 or 5 times a power of ten with `count` steps covering `max`:
// ticks at 0, 250, 500, 750, 1000 rather than at quarters of the largest value.
function niceStep(max, count) {
  const raw = max / count;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const factor of [1, 2, 2.5, 5, 10]) if (factor * power >= raw) return factor * power;
  return 10 * power;
}

// The same for byte scales: powers of two (1, 2, 4 ... KiB) so the ticks read 0, 4 KiB, 8 KiB.
function niceByteStep(max, count) {
  const raw = max / count;
  return raw <= 1 ? 1 : Math.pow(2, Math.ceil(Math.log2(raw)));
}
