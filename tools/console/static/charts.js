// A small line chart on a canvas: series of numbers over the last samples, one scale from 0.
"use strict";

const CHART_COLORS = ["#2f6fdb", "#d9822b", "#2e9e57", "#b3261e"];

function formatAmount(value) {
  const abs = Math.abs(value);
  if (abs >= 1e9) return (value / 1e9).toFixed(1) + "G";
  if (abs >= 1e6) return (value / 1e6).toFixed(1) + "M";
  if (abs >= 1e3) return (value / 1e3).toFixed(1) + "k";
  return String(Math.round(value * 10) / 10);
}

// series: [{label, values: [number|null]}]; every series has one value per sample.
function drawLineChart(canvas, series) {
  const ctx = canvas.getContext("2d");
  const width = canvas.width, height = canvas.height;
  const left = 48, right = 8, top = 22, bottom = 16;
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";
  let max = 0, count = 0;
  for (const s of series) {
    count = Math.max(count, s.values.length);
    for (const v of s.values) if (v !== null && v > max) max = v;
  }
  max = max > 0 ? max * 1.1 : 1;
  ctx.strokeStyle = "#dde2ea";
  ctx.fillStyle = "#6a7385";
  for (let i = 0; i <= 4; i++) {
    const y = top + (height - top - bottom) * i / 4;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(width - right, y); ctx.stroke();
    ctx.fillText(formatAmount(max * (4 - i) / 4), 4, y + 4);
  }
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
    ctx.fillText(s.label + (last === null ? "" : " " + formatAmount(last)), left + index * 150, 12);
  });
}
