// A small line chart on a canvas: series of numbers over the last samples, one scale from 0.
"use strict";

const CHART_COLORS = ["#2f6fdb", "#d9822b", "#2e9e57", "#b3261e"];

// How a chart's axis counts: the tick step for a largest value, and each value's label.
const RATE_SCALE = {step: niceStep, label: formatAmount};
const BYTE_SCALE = {step: niceByteStep, label: (bytes) => formatBytes(bytes).replace(".0 ", " ")};
const TICKS = 4;

// series: [{label, values: [number|null]}]; every series has one value per sample. The axis
// runs from 0 to TICKS round steps of `scale` (format.js) covering the largest value.
function drawLineChart(canvas, series, scale) {
  const ctx = canvas.getContext("2d");
  const width = canvas.width, height = canvas.height;
  const left = 64, right = 8, top = 22, bottom = 16;
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";
  let max = 0, count = 0;
  for (const s of series) {
    count = Math.max(count, s.values.length);
    for (const v of s.values) if (v !== null && v > max) max = v;
  }
  const step = scale.step(max > 0 ? max : TICKS, TICKS);
  max = step * TICKS;
  ctx.strokeStyle = "#dde2ea";
  ctx.fillStyle = "#6a7385";
  const ticks = [];
  for (let i = 0; i <= TICKS; i++) {
    const y = top + (height - top - bottom) * i / TICKS;
    const label = scale.label(step * (TICKS - i));
    ticks.push(label);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(width - right, y); ctx.stroke();
    ctx.fillText(label, 4, y + 4);
  }
  canvas.dataset.ticks = ticks.join("|");  // what the axis says, for a reader of the page's DOM
  const plotWidth = width - left - right, plotHeight = height - top - bottom;
  series.forEach((s, index) => {
    const color = CHART_COLORS[index % CHART_COLORS.length];
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let drawing = false;
    s.values.forEach((v, i) => {
      if (v === null) { drawing = false; return; }
      const x = left + (count > 1 ? plotWidth * i / (count - 1) : plotWidth);
      const y = top + plotHeight * (1 - v / max);
      if (drawing) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      drawing = true;
    });
    ctx.stroke();
    ctx.lineWidth = 1;
    ctx.fillStyle = color;
    const last = s.values.length ? s.values[s.values.length - 1] : null;
    ctx.fillText(s.label + (last === null ? "" : " " + scale.label(last)), left + index * 150, 12);
  });
}
