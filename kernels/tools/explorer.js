/* The book's explorers on the static site: controls over a grid computed in Python, drawn as
   SVG bars (no library, nothing fetched). kernels/tools/interactive.py inlines this file after
   each explorer's HTML and calls it with the explorer's root element. */
(function (root) {
  "use strict";
  var spec = JSON.parse(root.querySelector("script.book-explorer-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var NARROW = 560;  // px: below this the panels are stacked
  var inputs = spec.controls.map(function (c) {
    return root.querySelector("[data-control='" + c.name + "']");
  });
  var outputs = spec.controls.map(function (c) {
    return root.querySelector("output[data-for='" + c.name + "']");
  });
  var svg = root.querySelector("svg.book-explorer-plot");
  var reading = root.querySelector(".book-explorer-reading");

  function index(sel, n) {
    var i = 0;
    for (var j = 0; j < n; j++) i = i * spec.controls[j].values.length + sel[j];
    return i;
  }
  function node(name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  }
  function ticks(lo, hi) {
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / 4)));
    var m = (hi - lo) / step;
    step *= m > 20 ? 5 : m > 8 ? 2 : 1;
    var out = [];
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(t);
    return out;
  }
  function fmt(v, panel) {
    if (panel.unit === "%") return (v > 0 && v < 1 ? v.toFixed(1) : v.toFixed(0)) + " %";
    var a = Math.abs(v);
    if (a < 5e-4) return "0";
    if (a >= 1e4) return v.toExponential(1);
    var text = a >= 100 ? v.toFixed(0) : v.toPrecision(2);
    return (panel.signed && v > 0 ? "+" : "") + text.replace("-", "\u2212");
  }
  function draw() {
    var sel = inputs.map(function (e) { return parseInt(e.value, 10); });
    sel.forEach(function (v, j) {
      var text = spec.controls[j].values[v];
      if (outputs[j]) outputs[j].textContent = text;
      if (inputs[j].type === "range") inputs[j].setAttribute("aria-valuetext", text);
    });
    var P = spec.panels.length, S = spec.series.length;
    var bars = spec.series.map(function (s) {
      var k = index(sel, s.depends) * 2 * P;
      return s.data.slice(k, k + 2 * P);
    });
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    // side by side in a wide column; on a narrow screen (a phone) one panel under the other,
    // in a viewBox about as wide as the screen, so that the text keeps its size
    var narrow = root.clientWidth < NARROW;
    var W = narrow ? 400 : 720, fs = 15;
    // the legend in one row if every name fits its share of the width, else one name a row
    var longest = Math.max.apply(null, spec.series.map(function (s) { return s.name.length; }));
    var stacked = narrow || longest * fs * 0.56 + 24 > W / S;
    var legend = stacked ? 22 * S + 6 : 30;
    var ph = narrow ? 250 : 320, pw = narrow ? W : W / P;
    var H = legend + (narrow ? P * ph : ph);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    root.setAttribute("data-layout", narrow ? "stacked" : "wide");
    spec.series.forEach(function (s, i) {  // the legend
      var x = stacked ? 8 : 8 + i * (W / S), ly = stacked ? 6 + 22 * i : 6;
      node("rect", { x: x, y: ly, width: 14, height: 14, fill: s.color });
      node("text", { x: x + 20, y: ly + 12, "font-size": fs }, s.name);
    });
    spec.panels.forEach(function (panel, p) {
      var left = narrow ? 0 : p * pw, oy = legend + (narrow ? p * ph : 0);
      var top = oy + 42, bottom = H - (oy + ph) + 42;
      var x0 = left + 66, x1 = left + pw - 8;
      var lo = 0, hi = 0;
      bars.forEach(function (b) {
        var v = b[2 * p], e = b[2 * p + 1] || 0;
        if (v === null) return;
        lo = Math.min(lo, v - e); hi = Math.max(hi, v + e);
      });
      if (hi - lo === 0) hi = panel.unit === "%" ? 100 : 1;
      var pad = 0.18 * (hi - lo); hi += pad; if (lo < 0) lo -= pad;
      var y = function (v) { return top + (hi - v) / (hi - lo) * (H - top - bottom); };
      node("text", { x: (x0 + x1) / 2, y: top - 22, "font-size": fs, "text-anchor": "middle",
        "font-weight": "bold" }, panel.title);
      node("text", { x: 0, y: 0, "font-size": fs, "text-anchor": "middle",
        transform: "translate(" + (x0 - 52) + "," + ((top + H - bottom) / 2) + ") rotate(-90)" },
        panel.axis + " [" + panel.unit + "]");
      ticks(lo, hi).forEach(function (t) {
        node("line", { x1: x0, x2: x1, y1: y(t), y2: y(t), stroke: "#e0e0e0" });
        node("text", { x: x0 - 4, y: y(t) + 5, "font-size": fs, "text-anchor": "end" },
          Math.abs(t) < 1e-12 ? "0" : +t.toPrecision(3) + "");
      });
      node("line", { x1: x0, x2: x1, y1: y(0), y2: y(0), stroke: "#555" });
      var slot = (x1 - x0) / S, bw = slot * 0.62;
      bars.forEach(function (b, s) {
        var v = b[2 * p], e = b[2 * p + 1] || 0, cx = x0 + slot * (s + 0.5);
        var label = { x: cx, "font-size": fs, "text-anchor": "middle",
          "class": "book-explorer-value", "data-series": spec.series[s].key, "data-panel": p };
        node("text", { x: cx, y: H - bottom + 18, "font-size": fs, "text-anchor": "middle" },
          spec.series[s].short);
        if (v === null) {
          label.y = y(0) - 6;
          node("text", label, "no finite output");
          return;
        }
        node("rect", { x: cx - bw / 2, y: Math.min(y(v), y(0)), width: bw,
          height: Math.max(1, Math.abs(y(v) - y(0))), fill: spec.series[s].color });
        if (e > 0) {
          node("line", { x1: cx, x2: cx, y1: y(v - e), y2: y(v + e), stroke: "#000" });
          [v - e, v + e].forEach(function (w) {
            node("line", { x1: cx - 6, x2: cx + 6, y1: y(w), y2: y(w), stroke: "#000" });
          });
        }
        label.y = v >= 0 ? y(v + e) - 5 : y(v - e) + 15;
        node("text", label, fmt(v, panel));
      });
    });
    reading.textContent = spec.readings[spec.reading[index(sel, spec.controls.length)]];
    root.setAttribute("data-state", sel.join(","));
  }
  inputs.forEach(function (e) {
    e.addEventListener("input", draw);
    e.addEventListener("change", draw);
  });
  var wasNarrow = root.clientWidth < NARROW;
  window.addEventListener("resize", function () {
    if ((root.clientWidth < NARROW) !== wasNarrow) { wasNarrow = !wasNarrow; draw(); }
  });
  // "Skip to the explorer": the page's first link, shown when it has the keyboard's focus; it
  // moves the focus to the first control (past the site's navigation)
  var skip = document.createElement("a");
  skip.href = "#" + root.id;
  skip.className = "book-explorer-skip";
  skip.textContent = "Skip to the explorer: " + spec.title;
  skip.addEventListener("click", function (ev) {
    ev.preventDefault();
    root.scrollIntoView();
    inputs[0].focus();
  });
  document.body.insertBefore(skip, document.body.firstChild);
  var start = performance.now();
  draw();
  root.setAttribute("data-draw-ms", (performance.now() - start).toFixed(1));
  root.setAttribute("data-first-paint-ms", performance.now().toFixed(0));
})
