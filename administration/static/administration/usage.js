/* The console's usage page (administration/usage_page.py): draws the page's JSON (#gw-usage-charts:
 * per chart, the range's days and up to nine series of daily values) as SVG line charts with a legend.
 * Self-contained like fleet.js: no library, no build step, no polling (the page is a report).
 * Each chart's <svg> carries data-series, data-points and data-total, so what it shows can be read back.
 */
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";
  var WIDTH = 600, HEIGHT = 200, LEFT = 56, RIGHT = 12, TOP = 12, BOTTOM = 24;
  var PALETTE = ["#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#db2777", "#65a30d", "#6b7280"];

  var root = document.getElementById("gw-usage");
  var data = document.getElementById("gw-usage-charts");
  if (!root || !data) { return; }
  var charts = JSON.parse(data.textContent);

  function svgEl(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (name) { node.setAttribute(name, attrs[name]); });
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function formatNumber(value) {
    if (!value) { return "0"; }
    var abs = Math.abs(value);
    if (abs >= 1e9) { return (value / 1e9).toFixed(1).replace(/\.0$/, "") + "G"; }
    if (abs >= 1e6) { return (value / 1e6).toFixed(1).replace(/\.0$/, "") + "M"; }
    if (abs >= 1e3) { return (value / 1e3).toFixed(1).replace(/\.0$/, "") + "k"; }
    if (abs >= 10) { return String(Math.round(value)); }
    return value.toFixed(2).replace(/\.?0+$/, "");
  }

  function niceMax(value) {
    if (!(value > 0)) { return 1; }
    var magnitude = Math.pow(10, Math.floor(Math.log10(value)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (steps[i] * magnitude >= value) { return steps[i] * magnitude; } }
    return 10 * magnitude;
  }

  function draw(svg, chart, legend) {
    svg.setAttribute("viewBox", "0 0 " + WIDTH + " " + HEIGHT);
    var days = chart.days, series = chart.series, max = 0, total = 0;
    series.forEach(function (line) { line.values.forEach(function (v) { if (v > max) { max = v; } }); total += line.total; });
    max = niceMax(max);
    var plotHeight = HEIGHT - TOP - BOTTOM, span = Math.max(1, days.length - 1);
    var xOf = function (i) { return LEFT + (WIDTH - LEFT - RIGHT) * (days.length > 1 ? i / span : 0.5); };
    var yOf = function (v) { return TOP + plotHeight * (1 - v / max); };
    var grid = svgEl("g", { "class": "gw-grid" });
    [0, 0.5, 1].forEach(function (fraction) {
      var y = TOP + plotHeight * (1 - fraction);
      grid.appendChild(svgEl("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: y, y2: y }));
      grid.appendChild(svgEl("text", { x: LEFT - 6, y: y + 4, "text-anchor": "end" }, formatNumber(max * fraction)));
    });
    if (days.length) {
      grid.appendChild(svgEl("text", { x: LEFT, y: HEIGHT - 6, "text-anchor": "start" }, days[0]));
      grid.appendChild(svgEl("text", { x: WIDTH - RIGHT, y: HEIGHT - 6, "text-anchor": "end" }, days[days.length - 1]));
    }
    svg.appendChild(grid);
    var points = 0;
    series.forEach(function (line, index) {
      var color = PALETTE[index % PALETTE.length], d = "";
      line.values.forEach(function (v, i) { d += (i ? "L" : "M") + xOf(i).toFixed(1) + "," + yOf(v).toFixed(1); });
      var path = svgEl("path", { d: d, stroke: color, "class": "gw-line", "data-label": line.label });
      path.appendChild(svgEl("title", {}, line.label + ": " + formatNumber(line.total)));
      svg.appendChild(path);
      if (line.values.length === 1) { svg.appendChild(svgEl("circle", { cx: xOf(0), cy: yOf(line.values[0]), r: 3, fill: color })); }
      points = Math.max(points, line.values.length);
      if (legend) {
        var item = document.createElement("span");
        var swatch = document.createElement("span");
        swatch.className = "gw-swatch";
        swatch.style.background = color;
        item.appendChild(swatch);
        item.appendChild(document.createTextNode(line.label + " (" + formatNumber(line.total) + ")"));
        legend.appendChild(item);
      }
    });
    if (!series.length) {
      svg.appendChild(svgEl("text", { x: (LEFT + WIDTH - RIGHT) / 2, y: TOP + plotHeight / 2, "text-anchor": "middle",
                                      "class": "gw-empty" }, "no usage in this range"));
    }
    svg.setAttribute("data-series", String(series.length));
    svg.setAttribute("data-points", String(points));
    svg.setAttribute("data-total", String(total));
  }

  Array.prototype.forEach.call(root.querySelectorAll("svg[data-chart]"), function (svg) {
    var name = svg.getAttribute("data-chart");
    if (charts[name]) { draw(svg, charts[name], root.querySelector('[data-legend="' + name + '"]')); }
  });
})();
