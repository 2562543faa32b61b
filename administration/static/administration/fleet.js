/* The console's fleet page (administration/fleet_page.py): polls the fleet JSON every few seconds,
 * keeps a rolling window of points per worker, and draws SVG line charts (requests/s, in flight,
 * engine queue, KV usage) and a health timeline. Self-contained: no library, no build step.
 *
 * Requests/s comes from counter deltas: (requests_total now - before) / (server_time now - before).
 * A counter that went down (a restarted gateway process) leaves a gap instead of a negative rate.
 * Each chart's <svg> carries data-points, data-series, data-latest and data-max, and #gw-fleet carries
 * data-refreshes, so the state the charts show can be read back (the browser test does).
 *
 * Split: the charts draw one line per worker, or one per role (regular, prefill, decode, encode) from
 * the JSON's per-role sums (asked with ?by=role); #gw-split switches, ?split= keeps the choice.
 */
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";
  var WIDTH = 600, HEIGHT = 190, LEFT = 48, RIGHT = 12, TOP = 12, BOTTOM = 24;
  var PALETTE = ["#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#db2777", "#65a30d",
                 "#7c3aed", "#0d9488", "#ca8a04", "#4f46e5"];
  var STATUS_COLORS = { ready: "#15803d", pending: "#2563eb", not_ready: "#c2410c", draining: "#7c3aed",
                        failed: "#b91c1c" };

  var root = document.getElementById("gw-fleet");
  if (!root) { return; }
  var dataUrl = root.getAttribute("data-url");
  var every = parseFloat(root.getAttribute("data-refresh-secs")) || 2;
  var points = parseInt(root.getAttribute("data-points"), 10) || 60;
  var split = root.getAttribute("data-split") === "role" ? "role" : "worker";
  var ROLES = ["regular", "prefill", "decode", "encode"];
  var ROLE_COLORS = { regular: "#475569", prefill: "#d97706", decode: "#0891b2", encode: "#9333ea" };
  var roleHistory = {};   // role -> its series and the counters of the last answer
  var roleCounts = {};    // role -> {workers, ready} of the last answer

  var history = {};       // worker id -> its series and the counters of the last answer
  var order = [];         // worker ids in the server's order
  var colorsUsed = 0;
  var lastTime = null;
  var refreshes = 0;
  var timer = null;
  var paused = false;

  // --- small helpers -----------------------------------------------------------------------------

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) { node.setAttribute(name, attrs[name]); });
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function svgEl(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (name) { node.setAttribute(name, attrs[name]); });
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  function push(series, t, value) {
    series.push([t, value]);
    if (series.length > points) { series.splice(0, series.length - points); }
  }

  function last(series) {
    for (var i = series.length - 1; i >= 0; i--) { if (series[i][1] !== null) { return series[i][1]; } }
    return null;
  }

  function formatNumber(value) {
    if (value === null || value === undefined || isNaN(value)) { return "—"; }
    if (value === 0) { return "0"; }
    if (Math.abs(value) >= 100) { return String(Math.round(value)); }
    if (Math.abs(value) >= 10) { return value.toFixed(1).replace(/\.0$/, ""); }
    return value.toFixed(2).replace(/\.?0+$/, "");
  }

  function niceMax(value, floor) {
    if (!(value > floor)) { return floor; }
    var magnitude = Math.pow(10, Math.floor(Math.log10(value)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) {
      if (steps[i] * magnitude >= value) { return steps[i] * magnitude; }
    }
    return 10 * magnitude;
  }

  function statusLabel(status) { return status.replace(/_/g, "-"); }

  // --- state -------------------------------------------------------------------------------------

  function ingest(state) {
    var t = state.server_time;
    if (lastTime !== null && t <= lastTime) { return false; }
    var seen = {};
    order = [];
    state.workers.forEach(function (worker) {
      var h = history[worker.id];
      if (!h) {
        h = history[worker.id] = {
          color: PALETTE[colorsUsed++ % PALETTE.length],
          rate: [], failed: [], inflight: [], running: [], waiting: [], usage: [], health: [], prev: null
        };
      }
      var rate = null, failed = null;
      if (h.prev && t > h.prev.t) {
        var dt = t - h.prev.t;
        var done = worker.requests_total - h.prev.requests;
        var bad = worker.failures_total - h.prev.failures;
        if (done >= 0 && bad >= 0) { rate = done / dt; failed = bad / dt; }
      }
      push(h.rate, t, rate);
      push(h.failed, t, failed);
      push(h.inflight, t, worker.in_flight);
      push(h.running, t, worker.engine ? worker.engine.running_requests : null);
      push(h.waiting, t, worker.engine ? worker.engine.waiting_requests : null);
      push(h.usage, t, worker.engine ? worker.engine.token_usage * 100 : null);
      push(h.health, t, worker.status);
      h.prev = { t: t, requests: worker.requests_total, failures: worker.failures_total };
      h.worker = worker;
      seen[worker.id] = true;
      order.push(worker.id);
    });
    Object.keys(history).forEach(function (id) { if (!seen[id]) { delete history[id]; } });
    ingestRoles(t, state.roles || {});
    lastTime = t;
    refreshes += 1;
    root.setAttribute("data-refreshes", String(refreshes));
    root.setAttribute("data-server-time", String(t));
    root.setAttribute("data-counters", state.counters);
    return true;
  }

  function ingestRoles(t, roles) {
    ROLES.forEach(function (role) {
      var total = roles[role];
      var h = roleHistory[role];
      if (!h) {
        h = roleHistory[role] = { color: ROLE_COLORS[role], rate: [], failed: [], inflight: [], running: [],
                                  waiting: [], usage: [], prev: null };
      }
      roleCounts[role] = total ? { workers: total.workers, ready: total.ready } : { workers: 0, ready: 0 };
      if (!total || !total.workers) {
        [h.rate, h.failed, h.inflight, h.running, h.waiting, h.usage].forEach(function (series) { push(series, t, null); });
        h.prev = null;
        return;
      }
      var rate = null, failed = null;
      if (h.prev && t > h.prev.t) {
        var dt = t - h.prev.t;
        var done = total.requests_total - h.prev.requests;
        var bad = total.failures_total - h.prev.failures;
        if (done >= 0 && bad >= 0) { rate = done / dt; failed = bad / dt; }  // a worker left or restarted: a gap
      }
      push(h.rate, t, rate);
      push(h.failed, t, failed);
      push(h.inflight, t, total.in_flight);
      push(h.running, t, total.engine ? total.engine.running_requests : null);
      push(h.waiting, t, total.engine ? total.engine.waiting_requests : null);
      push(h.usage, t, total.engine ? total.engine.token_usage * 100 : null);
      h.prev = { t: t, requests: total.requests_total, failures: total.failures_total };
    });
  }

  function rolesShown() {
    return ROLES.filter(function (role) { return roleCounts[role] && roleCounts[role].workers > 0; });
  }

  // --- charts ------------------------------------------------------------------------------------

  function xOf(t, now) {
    var span = Math.max(1, (points - 1) * every);
    return LEFT + (WIDTH - LEFT - RIGHT) * (1 - (now - t) / span);
  }

  function pathOf(series, now, yOf) {
    var d = "", open = false, drawn = 0;
    series.forEach(function (point) {
      if (point[1] === null || point[1] === undefined || xOf(point[0], now) < LEFT - 0.5) { open = false; return; }
      d += (open ? "L" : "M") + xOf(point[0], now).toFixed(1) + "," + yOf(point[1]).toFixed(1);
      open = true;
      drawn += 1;
    });
    return { d: d, drawn: drawn };
  }

  // lines: [{color, series, dashed}]; options: {floor, fixedMax, unit, empty}
  function drawChart(svg, lines, options) {
    clear(svg);
    svg.setAttribute("viewBox", "0 0 " + WIDTH + " " + HEIGHT);
    var max = 0;
    lines.forEach(function (line) {
      line.series.forEach(function (point) { if (point[1] !== null && point[1] > max) { max = point[1]; } });
    });
    max = options.fixedMax || niceMax(max, options.floor || 1);
    var plotHeight = HEIGHT - TOP - BOTTOM;
    var yOf = function (value) { return TOP + plotHeight * (1 - Math.min(value, max) / max); };
    var grid = svgEl("g", { "class": "gw-grid" });
    [0, 0.25, 0.5, 0.75, 1].forEach(function (fraction) {
      var y = TOP + plotHeight * (1 - fraction);
      grid.appendChild(svgEl("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: y, y2: y }));
      if (fraction % 0.5 === 0) {
        grid.appendChild(svgEl("text", { x: LEFT - 6, y: y + 4, "text-anchor": "end" },
                               formatNumber(max * fraction) + (options.unit || "")));
      }
    });
    var span = Math.round((points - 1) * every);
    grid.appendChild(svgEl("text", { x: LEFT, y: HEIGHT - 6, "text-anchor": "start" }, "−" + span + " s"));
    grid.appendChild(svgEl("text", { x: WIDTH - RIGHT, y: HEIGHT - 6, "text-anchor": "end" }, "now"));
    svg.appendChild(grid);

    var now = lastTime || 0, longest = 0, latest = 0, withData = 0;
    lines.forEach(function (line) {
      var drawn = pathOf(line.series, now, yOf);
      if (!drawn.drawn) { return; }
      withData += 1;
      longest = Math.max(longest, drawn.drawn);
      if (!line.dashed) { latest += last(line.series) || 0; }
      var attrs = { d: drawn.d, stroke: line.color, "class": "gw-line" + (line.dashed ? " gw-dashed" : "") };
      svg.appendChild(svgEl("path", attrs));
      var end = line.series[line.series.length - 1];
      if (end && end[1] !== null) {
        svg.appendChild(svgEl("circle", { cx: xOf(end[0], now).toFixed(1), cy: yOf(end[1]).toFixed(1), r: 2.5,
                                          fill: line.color }));
      }
    });
    if (!withData) {
      svg.appendChild(svgEl("text", { x: (LEFT + WIDTH - RIGHT) / 2, y: TOP + plotHeight / 2, "text-anchor": "middle",
                                      "class": "gw-empty" }, options.empty || "no data yet"));
    }
    svg.setAttribute("data-points", String(longest));
    svg.setAttribute("data-series", String(withData));
    svg.setAttribute("data-latest", latest.toFixed(3));
    svg.setAttribute("data-max", String(max));
  }

  function drawHealth(container) {
    clear(container);
    var now = lastTime || 0, span = Math.max(1, (points - 1) * every);
    var xBand = function (t) { return WIDTH * (1 - (now - t) / span); };
    document.getElementById("gw-health-span").textContent = "−" + Math.round(span) + " s";
    order.forEach(function (id) {
      var h = history[id];
      var row = el("div", { "class": "gw-health-row", "data-worker-id": id });
      var label = el("span", { "class": "gw-health-label", title: h.worker.url });
      label.appendChild(el("span", { "class": "gw-swatch", style: "background:" + h.color }));
      label.appendChild(document.createTextNode(h.worker.url));
      row.appendChild(label);
      var svg = svgEl("svg", { viewBox: "0 0 " + WIDTH + " 14", preserveAspectRatio: "none", "class": "gw-band",
                               role: "img", "aria-label": "health of " + h.worker.url });
      var drawn = 0;
      h.health.forEach(function (point, index) {
        var next = h.health[index + 1];
        var x0 = Math.max(0, xBand(point[0]));
        var x1 = next ? xBand(next[0]) : WIDTH;
        if (x1 <= 0) { return; }
        var rect = svgEl("rect", { x: x0.toFixed(1), y: 0, width: Math.max(1, x1 - x0).toFixed(1), height: 14,
                                   fill: STATUS_COLORS[point[1]] || "#6b7280" });
        rect.appendChild(svgEl("title", {}, statusLabel(point[1])));
        svg.appendChild(rect);
        drawn += 1;
      });
      svg.setAttribute("data-points", String(drawn));
      row.appendChild(svg);
      container.appendChild(row);
    });
    if (!order.length) { container.appendChild(el("p", { "class": "gw-note" }, "No workers registered.")); }
  }

  // --- table and summary -------------------------------------------------------------------------

  function badge(kind, value, label) {
    return el("span", { "class": "gw-badge gw-" + kind + "-" + (value || "none") }, label);
  }

  function cell(row, field, content) {
    var td = el("td", { "class": "field-" + field });
    if (content instanceof Node) { td.appendChild(content); } else { td.textContent = content; }
    row.appendChild(td);
    return td;
  }

  function drawTable(tbody) {
    clear(tbody);
    order.forEach(function (id, index) {
      var h = history[id], w = h.worker;
      var row = el("tr", { "data-worker-id": id });
      var url = el("span");
      url.appendChild(el("span", { "class": "gw-swatch", style: "background:" + h.color }));
      url.appendChild(el("a", { href: w.change_url }, w.url));
      cell(row, "url", url);
      cell(row, "model", w.model_id || "—");
      cell(row, "type", w.worker_type);
      cell(row, "runtime", w.runtime_type);
      cell(row, "status", badge("status", w.status, w.status_label));
      cell(row, "breaker", w.breaker_state ? badge("breaker", w.breaker_state, statusLabel(w.breaker_state)) : "—");
      cell(row, "in_flight", w.in_flight === null ? "—" : String(w.in_flight));
      var engine = "—";
      if (w.engine) {
        engine = w.engine.running_requests + " running · " + w.engine.waiting_requests + " waiting · " +
                 formatNumber(w.engine.token_usage * 100) + "% KV";
      }
      cell(row, "engine", engine);
      if (w.overloaded) { row.lastChild.appendChild(badge("status", "failed", "overloaded")); }
      cell(row, "rate", formatNumber(last(h.rate)));
      cell(row, "failed", formatNumber(last(h.failed)));
      row.className = index % 2 ? "row2" : "row1";
      tbody.appendChild(row);
    });
    if (!order.length) {
      var empty = el("tr");
      empty.appendChild(el("td", { colspan: "10" }, "No workers registered."));
      tbody.appendChild(empty);
    }
  }

  function drawLegend(container) {
    clear(container);
    container.setAttribute("data-split", split);
    if (split === "role") {
      rolesShown().forEach(function (role) {
        var item = el("span", { "class": "gw-legend-item", "data-role": role });
        item.appendChild(el("span", { "class": "gw-swatch", style: "background:" + ROLE_COLORS[role] }));
        var counts = roleCounts[role];
        item.appendChild(document.createTextNode(role + " (" + counts.ready + " / " + counts.workers + " ready)"));
        container.appendChild(item);
      });
      return;
    }
    order.forEach(function (id) {
      var item = el("span", { "class": "gw-legend-item" });
      item.appendChild(el("span", { "class": "gw-swatch", style: "background:" + history[id].color }));
      item.appendChild(document.createTextNode(history[id].worker.url));
      container.appendChild(item);
    });
  }

  function drawSummary() {
    var ready = 0, open = 0, rate = 0, inflight = 0, waiting = null;
    order.forEach(function (id) {
      var h = history[id], w = h.worker;
      if (w.status === "ready") { ready += 1; }
      if (w.breaker_state === "open") { open += 1; }
      rate += last(h.rate) || 0;
      inflight += w.in_flight || 0;
      if (w.engine) { waiting = (waiting || 0) + w.engine.waiting_requests; }
    });
    var roles = rolesShown().map(function (role) { return roleCounts[role].workers + " " + role; }).join(" · ");
    var values = { workers: order.length, ready: ready + " / " + order.length, breakers: open,
                   rate: formatNumber(rate), inflight: inflight, waiting: waiting === null ? "—" : waiting,
                   roles: roles || "—" };
    Object.keys(values).forEach(function (key) {
      var node = root.querySelector('[data-summary="' + key + '"]');
      if (node) { node.textContent = String(values[key]); }
    });
  }

  function lines(field, dashedField) {
    var result = [];
    if (split === "role") {
      rolesShown().forEach(function (role) {
        var h = roleHistory[role];
        result.push({ color: h.color, series: h[field] });
        if (dashedField) { result.push({ color: h.color, series: h[dashedField], dashed: true }); }
      });
      return result;
    }
    order.forEach(function (id) {
      var h = history[id];
      result.push({ color: h.color, series: h[field] });
      if (dashedField) { result.push({ color: h.color, series: h[dashedField], dashed: true }); }
    });
    return result;
  }

  function render() {
    root.setAttribute("data-split", split);
    Array.prototype.forEach.call(root.querySelectorAll("[data-split-title]"), function (node) {
      node.textContent = node.getAttribute("data-split-title").replace("{split}", split === "role" ? "role" : "worker");
    });
    drawChart(document.getElementById("gw-chart-rate"), lines("rate", "failed"), { floor: 1, unit: "/s" });
    drawChart(document.getElementById("gw-chart-inflight"), lines("inflight"), { floor: 4 });
    drawChart(document.getElementById("gw-chart-engine"), lines("running", "waiting"),
              { floor: 4, empty: "no engine load report yet (load monitor)" });
    drawChart(document.getElementById("gw-chart-usage"), lines("usage"),
              { fixedMax: 100, unit: "%", empty: "no engine load report yet (load monitor)" });
    drawHealth(document.getElementById("gw-health"));
    drawTable(document.getElementById("gw-fleet-rows"));
    drawLegend(document.getElementById("gw-legend"));
    drawSummary();
  }

  // --- polling -----------------------------------------------------------------------------------

  function setStatus(text, failed) {
    var node = document.getElementById("gw-fleet-status");
    node.textContent = text;
    node.className = "gw-fleet-status" + (failed ? " gw-fleet-error" : "");
  }

  function schedule() {
    clearTimeout(timer);
    if (!paused) { timer = setTimeout(poll, every * 1000); }
  }

  function poll() {
    if (document.hidden) { schedule(); return; }
    fetch(dataUrl + (dataUrl.indexOf("?") < 0 ? "?" : "&") + "by=role", { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (response) {
        var json = (response.headers.get("Content-Type") || "").indexOf("application/json") === 0;
        if (response.redirected || !json) { throw new Error("session expired: reload the page to log in again"); }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (state) {
        if (ingest(state)) { render(); }
        setStatus("Updated " + new Date(state.server_time * 1000).toLocaleTimeString(), false);
      })
      .catch(function (error) { setStatus("Refresh failed: " + error.message, true); })
      .then(schedule);
  }

  var select = document.getElementById("gw-refresh");
  select.addEventListener("change", function () {
    every = parseFloat(select.value) || every;
    root.setAttribute("data-refresh-secs", String(every));
    var url = new URL(window.location.href);
    url.searchParams.set("refresh", String(every));
    window.history.replaceState(null, "", url.toString());
    render();
    schedule();
  });
  var splitSelect = document.getElementById("gw-split");
  if (splitSelect) {
    splitSelect.addEventListener("change", function () {
      split = splitSelect.value === "role" ? "role" : "worker";
      var url = new URL(window.location.href);
      url.searchParams.set("split", split);
      window.history.replaceState(null, "", url.toString());
      render();
    });
  }
  var pause = document.getElementById("gw-pause");
  pause.addEventListener("click", function () {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    if (paused) { clearTimeout(timer); setStatus("Paused", false); } else { poll(); }
  });

  var initial = document.getElementById("gw-fleet-initial");
  if (initial) {
    ingest(JSON.parse(initial.textContent));
    render();
  }
  schedule();
})();
