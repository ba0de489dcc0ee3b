"use strict";
// The tracer report: pan/zoom the diagram, select a tensor by clicking, searching or #ID, and
// show its record. User text only ever reaches the page through textContent, never as markup.
(() => {
  const data = JSON.parse(document.getElementById("trace-data").textContent);
  const byId = new Map(data.tensors.map((t) => [t.id, t]));
  const hidden = new Map(); // 'layers/5' -> its repeated block (report.py's copies): drawn once, folded copies rebuilt here
  for (const block of data.copies) for (const copy of block.hidden) hidden.set(copy, block);
  const viewport = document.getElementById("viewport");
  const canvas = document.getElementById("canvas");
  const svg = canvas.querySelector("svg");
  const panel = document.getElementById("panel");
  const HIGH = [8, 81, 156], NAN = "#f4a6a6"; // as tracer/heatmap.py: white -> dark blue, NaN red
  const LEVELS = 254, NAN_LEVEL = 255; // a heatmap cell is a byte (tracer/report.py)

  // ------------------------------------------------------------ small DOM helpers

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    for (const child of children) node.append(child instanceof Node ? child : String(child));
    return node;
  }

  function hrefOf(target) {
    return "#" + encodeURIComponent(target).replace(/%2F/g, "/").replace(/%3D/g, "=");
  }

  function link(id) {
    return el("a", { href: hrefOf(id) }, id);
  }

  function links(ids) {
    if (!ids.length) return el("span", { class: "muted" }, "none");
    const list = el("ul");
    for (const id of ids) list.append(el("li", {}, link(id)));
    return list;
  }

  function table(rows) {
    const body = el("table");
    for (const [name, value] of rows) {
      if (value === undefined || value === null) continue;
      body.append(el("tr", {}, el("th", {}, name), el("td", {}, value)));
    }
    return body;
  }

  // ------------------------------------------------------------ folded copies of repeated blocks

  // ids under `from` ('layers/0') moved under `to` ('layers/5'), as report.py's moved()
  function moved(t, from, to) {
    const move = (s) => (typeof s === "string" && (s === from || s.startsWith(from + "/")) ? to + s.slice(from.length) : s);
    const out = Object.assign({}, t);
    for (const key of ["id", "inputs", "users", "view_of", "group"]) {
      if (key in out) out[key] = Array.isArray(out[key]) ? out[key].map(move) : move(out[key]);
    }
    return out;
  }

  // the copy of a repeated block a record id is in: [copy prefix, block], the outermost first
  function copyOf(id) {
    const parts = id.split("/");
    for (let n = 1; n < parts.length; n++) {
      const prefix = parts.slice(0, n).join("/");
      if (hidden.has(prefix)) return [prefix, hidden.get(prefix)];
    }
    return null;
  }

  // a record, drawn or in a folded copy: copy 0's record moved to that copy, plus what differs
  function record(id) {
    if (byId.has(id)) return byId.get(id);
    const found = copyOf(id);
    if (!found) return undefined;
    const [copy, block] = found;
    const template = record(block.shown + id.slice(copy.length));
    if (!template) return undefined;
    const changes = block.changes[id] || {};
    const t = Object.assign(moved(template, block.shown, copy), changes);
    for (const key of changes["-"] || []) delete t[key];
    delete t["-"];
    return t;
  }

  // every id, the folded copies' included (for the search box)
  function allIds() {
    const ids = data.tensors.map((t) => t.id);
    for (const block of data.copies) {
      const inside = ids.filter((id) => id.startsWith(block.shown + "/"));
      for (const copy of block.hidden) for (const id of inside) ids.push(copy + id.slice(block.shown.length));
    }
    return ids;
  }

  // the repeated block a record is in (drawn or folded), its copies and which one it is
  function copiesOf(t) {
    const folded = copyOf(t.id);
    if (folded) return { block: folded[1], copy: folded[0] };
    const block = data.copies.find((b) => t.id.startsWith(b.shown + "/"));
    return block ? { block, copy: block.shown } : null;
  }

  function copySelector(t) {
    const { block, copy } = copiesOf(t);
    const select = el("select", { id: "copy", "aria-label": "copy of the repeated block" });
    for (const name of [block.shown, ...block.hidden]) {
      const option = el("option", { value: name }, name);
      if (name === copy) option.selected = true;
      select.append(option);
    }
    select.addEventListener("change", () => go(select.value + t.id.slice(copy.length)));
    return el("p", {}, `copy ${[block.shown, ...block.hidden].indexOf(copy) + 1} of ${block.hidden.length + 1}: `, select);
  }

  const list = (xs) => "[" + xs.join(", ") + "]";
  const tuple = (xs) => "(" + xs.join(", ") + (xs.length === 1 ? ",)" : ")");

  // ------------------------------------------------------------ header and search

  document.getElementById("title").textContent = data.name;
  document.getElementById("dims").textContent = Object.entries(data.dims).map(([k, v]) => `${k}=${v}`).join(", ");
  const options = document.getElementById("ids");
  const everyId = allIds();
  for (const id of everyId) options.append(el("option", { value: id }));
  document.getElementById("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = document.getElementById("search").value.trim();
    const found = record(text) ? text : everyId.find((id) => id.includes(text));
    go(found === undefined ? text : found);
  });

  // ------------------------------------------------------------ pan and zoom

  const view = { x: 0, y: 0, scale: 1 };
  const apply = () => (canvas.style.transform = `translate(${view.x}px, ${view.y}px) scale(${view.scale})`);

  function zoomAt(factor, px, py) {
    const next = Math.min(8, Math.max(0.05, view.scale * factor));
    view.x = px - ((px - view.x) * next) / view.scale;
    view.y = py - ((py - view.y) * next) / view.scale;
    view.scale = next;
    apply();
  }

  // the diagram at `scale`, centred across, and down too when it fits (else from its top)
  function place(scale) {
    const box = viewport.getBoundingClientRect();
    const width = svg.width.baseVal.value, height = svg.height.baseVal.value;
    view.scale = scale;
    view.x = (box.width - width * scale) / 2;
    view.y = Math.max(4, (box.height - height * scale) / 2);
    apply();
  }

  function fit() {
    const box = viewport.getBoundingClientRect();
    place(Math.min(1, box.width / svg.width.baseVal.value, box.height / svg.height.baseVal.value) * 0.97);
  }

  // the page opens on the whole diagram, centred, when it is legible that small (Graphviz's 11 pt
  // text at 8 px or more); else on its whole width from the top, down to a smaller zoom (text at
  // 6 px): the leftmost cluster and the legend both in view, none of it under the side panel, the
  // inputs first; else, a diagram too wide even for that, at a legible zoom with the inputs in view
  const LEGIBLE = 0.75, ACROSS = 0.55;
  function start() {
    fit();
    if (view.scale >= LEGIBLE) return;
    const across = Math.min(1, viewport.getBoundingClientRect().width / svg.width.baseVal.value) * 0.97;
    if (across >= ACROSS) return place(across);
    const inputs = data.tensors.filter((t) => t.op === "input").flatMap((t) => shownBy(t.id));
    if (!inputs.length) return;
    view.scale = LEGIBLE;
    apply();
    const box = viewport.getBoundingClientRect();
    const rects = inputs.map((n) => n.getBoundingClientRect());
    const left = Math.min(...rects.map((r) => r.left)), right = Math.max(...rects.map((r) => r.right));
    const top = Math.min(...rects.map((r) => r.top));
    view.x += box.left + box.width / 2 - (left + right) / 2;
    view.y += box.top + Math.min(box.height / 4, 80) - top;
    apply();
  }

  function center(node) {
    const box = viewport.getBoundingClientRect(), item = node.getBoundingClientRect();
    view.x += box.left + box.width / 2 - (item.left + item.width / 2);
    view.y += box.top + box.height / 2 - (item.top + item.height / 2);
    apply();
  }

  viewport.addEventListener("wheel", (event) => {
    event.preventDefault();
    const box = viewport.getBoundingClientRect();
    zoomAt(Math.exp(-event.deltaY * 0.0015), event.clientX - box.left, event.clientY - box.top);
  }, { passive: false });

  let drag = null;
  viewport.addEventListener("pointerdown", (event) => {
    drag = { x: event.clientX, y: event.clientY, vx: view.x, vy: view.y, moved: false };
  });
  window.addEventListener("pointermove", (event) => {
    if (!drag) return;
    const dx = event.clientX - drag.x, dy = event.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    if (!drag.moved) return;
    viewport.classList.add("dragging");
    view.x = drag.vx + dx;
    view.y = drag.vy + dy;
    apply();
  });
  window.addEventListener("pointerup", () => {
    viewport.classList.remove("dragging");
    setTimeout(() => (drag = null)); // the click that ends a drag still sees it
  });
  const buttons = { "zoom-in": 1.25, "zoom-out": 0.8 };
  for (const [id, factor] of Object.entries(buttons)) {
    document.getElementById(id).addEventListener("click", () => {
      const box = viewport.getBoundingClientRect();
      zoomAt(factor, box.width / 2, box.height / 2);
    });
  }
  document.getElementById("zoom-fit").addEventListener("click", fit);

  // ------------------------------------------------------------ what the diagram's links point at

  const drawn = new Map(); // "#ID" target -> the node and edge <g> elements that show it
  for (const node of svg.querySelectorAll("g.node")) {
    const outline = node.querySelector("path, polygon, ellipse"); // the node's own shape, not a heatmap cell
    if (outline) outline.classList.add("outline");
  }
  let clicked = false; // a click selects in place; a search or a #ID link also brings the node into view
  for (const anchor of svg.querySelectorAll("a")) {
    const href = anchor.getAttribute("href") || anchor.getAttribute("xlink:href") || "";
    const item = anchor.closest("g.node, g.edge");
    if (!href.startsWith("#") || !item) continue;
    const target = fragment(href.slice(1));
    if (target === null) continue;
    if (!drawn.has(target)) drawn.set(target, new Set());
    drawn.get(target).add(item);
    anchor.addEventListener("click", (event) => {
      event.preventDefault();
      if (drag && drag.moved) return;
      clicked = true;
      go(target);
    });
  }

  function shownBy(target) {
    if (drawn.has(target)) return [...drawn.get(target)];
    const folded = copyOf(target);
    if (folded) return shownBy(folded[1].shown + target.slice(folded[0].length)); // drawn once: copy 0's node
    const t = byId.get(target);
    if (!t) return [];
    // folded into a collapsed group: the outermost collapsed group that holds its step
    const groups = [...drawn.keys()].filter((k) => k.startsWith("group=")).map((k) => k.slice(6));
    const home = groups.filter((g) => t.group && (t.group === g || t.group.startsWith(g + "/"))).sort((a, b) => a.length - b.length)[0];
    if (home !== undefined) return [...drawn.get("group=" + home)];
    return t.users.flatMap((u) => shownBy(u)).filter((n) => n.classList.contains("node"));
  }

  // ------------------------------------------------------------ selection

  // the target a #fragment names; a malformed one (#%E0%A4%A) names none, rather than throwing a URIError
  function fragment(text) {
    try {
      return decodeURIComponent(text);
    } catch {
      return null;
    }
  }

  function go(target) {
    if (fragment(location.hash.slice(1)) === target) select(target);
    else location.hash = hrefOf(target);
  }

  function select(target) {
    for (const node of svg.querySelectorAll(".selected")) node.classList.remove("selected");
    panel.replaceChildren();
    if (target === null) {
      panel.append(el("h2", {}, data.name), summary());
      return;
    }
    if (target.startsWith("group=")) groupPanel(target.slice(6));
    else if (record(target)) tensorPanel(record(target));
    else panel.append(el("h2", {}, "not found"), el("p", {}, `no tensor '${target}' in this trace`), summary());
    const shown = shownBy(target);
    for (const node of shown) node.classList.add("selected");
    const first = shown.find((n) => n.classList.contains("node")) || shown[0];
    if (first && !clicked) {
      if (view.scale < 1) zoomAt(1 / view.scale, 0, 0);
      center(first);
    }
    clicked = false;
  }

  function summary() {
    const weights = everyId.filter((id) => record(id).heatmap);
    return el(
      "div",
      {},
      table([
        ["pipeline", data.name],
        ["file", data.file],
        ["dims", Object.entries(data.dims).map(([k, v]) => `${k}=${v}`).join(", ") || "none"],
        ["seed", data.seed === null ? "none" : String(data.seed)],
        ["tensors", String(data.count)],
        ["estimated peak", data.peak],
        ...(data.mesh ? meshRows(data.mesh) : []),
      ]),
      el("p", { class: "muted" }, "Click a node or an edge, search an id, or link to report.html#ID."),
      el("h3", {}, "attention"),
      data.attention.length ? links(data.attention.map((s) => s.context || s.product)) : el("p", { class: "muted" }, "no attention found"),
      data.values ? el("h3", {}, "attention weights") : el("p", { class: "muted" }, "Rendered without --values: no statistics or heatmaps."),
      data.values ? attentionGrid() : "",
      data.values ? links(weights) : "",
      el("h3", {}, "checks"),
      data.checks.length ? checksList(data.checks) : el("p", { class: "muted" }, "tracer check: clean")
    );
  }

  function meshRows(mesh) {
    // a parallel: pipeline: its device mesh, and what each rank sends in one forward
    const degrees = Object.entries(mesh.degrees).map(([k, v]) => `${k}=${v}`).join(", ");
    return [
      ["mesh", `${degrees} (${mesh.ranks} ranks)`],
      ...mesh.collectives.map((c, i) => [i === 0 ? "collectives" : "", c]),
      ["communication", mesh.communication],
    ];
  }

  function checksList(checks) {
    // allowed findings stay visible with their reasons: an allow is reviewed, never silent
    return el(
      "ul",
      {},
      ...checks.map((c) =>
        el(
          "li",
          { class: c.severity === "allowed" ? "muted" : "warn" },
          `${c.severity}[${c.code}]`,
          c.step ? " " : "",
          c.step ? link(c.step) : "",
          `: ${c.message}`
        )
      )
    );
  }

  function groupPanel(name) {
    const members = data.groups[name] || [];
    panel.append(el("h2", {}, name), el("p", { class: "muted" }, `collapsed group: ${members.length} tensors`), links(members));
  }

  function tensorPanel(t) {
    panel.append(
      el("h2", { id: "record-id" }, t.id),
      table([
        ["op", t.op],
        ["shape", t.symbolic],
        ["axes", t.axes.some((a) => a) ? `(${t.axes.map((a) => a || "?").join(", ")})` : undefined],
        ["tokens", t.tokens],
        ["rows", t.rows],
        ["concrete", list(t.shape)],
        ["dtype", t.dtype],
        ["stride", tuple(t.stride)],
        ["storage offset", String(t.offset)],
        ["contiguous", t.contiguous ? "yes" : "no"],
        ["view of", t.view_of ? link(t.view_of) : "— (owns its storage)"],
        ["size", `${t.size} (${t.bytes} bytes)`],
        ["FLOPs", t.flops === undefined ? undefined : Number(t.flops).toLocaleString("en")],
        ["device", t.device],
        ["defined at", t.where],
        ["group", t.group || undefined],
      ])
    );
    if (t.note) panel.append(el("p", { class: "note" }, t.note));
    if (copiesOf(t)) panel.append(copySelector(t));
    panel.append(el("h3", {}, "inputs"), links(t.inputs), el("h3", {}, "used by"), links(t.users));
    if (t.stats) panel.append(el("h3", {}, "values"), statsTable(t.stats));
    if (t.heatmap) heatmapSection(t);
    for (const [n, role] of t.attention || []) attentionSection(data.attention[n], role);
  }

  // a fused kernel's weights, recomputed for the page from its q, k, mask and scale (report.py)
  function recomputed(site) {
    const t = site.recomputed && record(site.recomputed);
    return t && t.heatmap ? t : undefined;
  }

  function attentionSection(site, role) {
    const ref = (id) => (id ? link(id) : undefined);
    const again = recomputed(site);
    panel.append(
      el("h3", {}, `attention: the ${role}`),
      table([
        ["computed by", site.fused ? `${site.product} (fused: no scores stored)` : site.product],
        ["queries", ref(site.query)],
        ["keys", ref(site.keys)],
        ["values", ref(site.values)],
        ["scores", ref(site.scores)],
        ["weights", again ? el("span", {}, link(again.id), ` (${again.heatmap.recomputed})`) : ref(site.weights)],
        ["context", ref(site.context)],
        ["scale", `${site.scale} = ${site.multiplier}`],
        ["masks", site.masks.map((m) => `${m.step}: ${m.pattern}`).join("; ") || "none"],
      ])
    );
  }

  function statsTable(s) {
    const bad = s.nan + s.posinf + s.neginf;
    const counts = `${s.nan} NaN, ${s.posinf} +inf, ${s.neginf} -inf`;
    return table([
      ["min", s.min === undefined ? "—" : String(s.min)],
      ["max", s.max === undefined ? "—" : String(s.max)],
      ["mean", s.mean === undefined ? "—" : String(s.mean)],
      ["std", s.std === undefined ? "—" : String(s.std)],
      ["non-finite", bad ? el("span", { class: "warn" }, counts) : counts],
      ["elements", String(s.count)],
    ]);
  }

  // ------------------------------------------------------------ heatmaps

  function heatmapSection(t) {
    const h = t.heatmap;
    const section = el("div", { id: "heatmap" });
    section.append(el("h3", {}, `attention weights (${h.axes[0]} queries × ${h.axes[1]} keys)`));
    if (h.recomputed) section.append(el("p", { class: "muted" }, h.recomputed));
    if (!h.maps.length) {
      panel.append(section, el("p", { class: "muted" }, `not embedded: the page's ${data.caps.cells} heatmap cells are spent`));
      return;
    }
    const controls = el("div", { class: "heat-controls" });
    const selects = h.lead_dims.map((name, axis) => {
      const values = [...new Set(h.lead.map((index) => index[axis]))];
      const select = el("select", { "aria-label": name, "data-dim": name });
      for (const v of values) select.append(el("option", { value: String(v) }, `${name} ${v}`));
      controls.append(select);
      return select;
    });
    const drawing = el("canvas", { class: "heatmap" });
    const readout = el("div", { id: "heat-value" });
    section.append(controls, el("div", { class: "heat-scroll" }, drawing), readout);
    const [rows, cols] = h.side;
    if (rows < h.rows || cols < h.cols) section.append(el("p", { class: "muted" }, `${h.rows}×${h.cols} mean-pooled to ${rows}×${cols} (cap ${data.caps.side})`));
    if (h.total > h.maps.length) section.append(el("p", { class: "muted" }, `the first ${h.maps.length} of ${h.total} maps are embedded`));
    section.append(el("p", { class: "muted" }, "Colours scale to each map's largest weight; red marks NaN; values are to 1/254 of that weight."));
    panel.append(section);
    const redraw = () => {
      const wanted = selects.map((s) => Number(s.value));
      const index = h.lead.findIndex((lead) => lead.every((v, i) => v === wanted[i]));
      drawMap(drawing, readout, h, h.maps[index < 0 ? 0 : index]);
    };
    for (const s of selects) s.addEventListener("change", redraw);
    redraw();
  }

  // bertviz's overview: one row per attention site (a layer), one thumbnail per head of the first
  // batch item, every map on one colour scale; a click opens that site's weights
  function attentionGrid() {
    const rows = data.attention.map((s) => (s.weights && record(s.weights)) || recomputed(s)).filter((t) => t && t.heatmap && t.heatmap.maps.length);
    if (!rows.length) return "";
    const grid = el("div", { id: "attention-grid" });
    for (const t of rows) {
      const h = t.heatmap;
      const row = el("div", { class: "grid-row" }, el("span", { class: "grid-label" }, link(t.id)));
      h.lead.forEach((lead, i) => {
        if (lead.slice(0, -1).some((v) => v !== 0)) return; // batch item 0 only
        const where = h.lead_dims.map((name, axis) => `${name} ${lead[axis]}`).join(", ");
        const thumb = el("canvas", { class: "thumb", title: `${t.id}: ${where}` });
        drawThumb(thumb, h, h.maps[i]);
        thumb.addEventListener("click", () => go(t.id));
        row.append(thumb);
      });
      grid.append(row);
    }
    const words = data.tokens ? el("p", { class: "muted" }, `tokens: ${data.tokens.join(" ")}`) : "";
    return el("div", {}, colourScale(), words, grid);
  }

  function drawThumb(canvas, h, map) {
    const [rows, cols] = h.side, size = 48, cell = size / Math.max(rows, cols);
    const levels = Uint8Array.from(atob(map.cells), (c) => c.charCodeAt(0));
    canvas.width = canvas.height = size;
    const ctx = canvas.getContext("2d");
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        ctx.fillStyle = colour(levels[i * cols + j]);
        ctx.fillRect(j * cell, i * cell, Math.ceil(cell), Math.ceil(cell));
      }
    }
  }

  function colourScale() {
    const bar = el("canvas", { id: "colour-scale", width: "160", height: "10" });
    const ctx = bar.getContext("2d");
    for (let x = 0; x < 160; x++) {
      ctx.fillStyle = colour(Math.round((x / 159) * LEVELS));
      ctx.fillRect(x, 0, 1, 10);
    }
    const nan = el("span", { class: "nan-swatch" });
    return el("div", { class: "scale" }, "0 ", bar, " each map's largest weight · ", nan, " NaN");
  }

  function colour(level) {
    if (level === NAN_LEVEL) return NAN;
    const share = level / LEVELS;
    return `rgb(${HIGH.map((hi) => Math.round(255 + (hi - 255) * share)).join(",")})`;
  }

  function drawMap(drawing, readout, h, map) {
    const [rows, cols] = h.side;
    const levels = Uint8Array.from(atob(map.cells), (c) => c.charCodeAt(0));
    // as wide as the panel allows (the last key column and its slanted word included); past the
    // smallest legible cell the map scrolls sideways inside .heat-scroll
    const left = h.row_labels ? 64 : 4, top = h.col_labels ? 64 : 4, right = h.col_labels ? 36 : 4;
    const room = drawing.parentElement.clientWidth - left - right;
    const cell = Math.max(3, Math.min(36, Math.floor(room / cols), Math.floor(320 / rows)));
    const ratio = window.devicePixelRatio || 1;
    drawing.width = (left + cols * cell + right) * ratio;
    drawing.height = (top + rows * cell + 4) * ratio;
    drawing.style.width = `${left + cols * cell + right}px`;
    drawing.style.height = `${top + rows * cell + 4}px`;
    const ctx = drawing.getContext("2d");
    ctx.scale(ratio, ratio);
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        ctx.fillStyle = colour(levels[i * cols + j]);
        ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
      }
    }
    ctx.strokeStyle = "#bbb";
    ctx.strokeRect(left - 0.5, top - 0.5, cols * cell + 1, rows * cell + 1);
    ctx.fillStyle = "#333";
    ctx.font = "11px Helvetica, Arial, sans-serif";
    ctx.textBaseline = "middle";
    (h.row_labels || []).forEach((word, i) => {
      ctx.textAlign = "right";
      ctx.fillText(word, left - 4, top + (i + 0.5) * cell, left - 6);
    });
    (h.col_labels || []).forEach((word, j) => {
      ctx.save();
      ctx.translate(left + (j + 0.5) * cell, top - 4);
      ctx.rotate(-Math.PI / 3);
      ctx.textAlign = "left";
      ctx.fillText(word, 0, 0, top);
      ctx.restore();
    });
    drawing.onmousemove = (event) => {
      const box = drawing.getBoundingClientRect();
      const j = Math.floor((event.clientX - box.left - left) / cell), i = Math.floor((event.clientY - box.top - top) / cell);
      if (i < 0 || j < 0 || i >= rows || j >= cols) return (readout.textContent = "");
      const q = h.row_labels ? `${i} '${h.row_labels[i]}'` : String(i), k = h.col_labels ? `${j} '${h.col_labels[j]}'` : String(j);
      const level = levels[i * cols + j];
      const value = level === NAN_LEVEL ? "NaN" : `≈ ${((level / LEVELS) * map.max).toPrecision(3)}`;
      readout.textContent = `query ${q} → key ${k}: ${value}`;
    };
  }

  // ------------------------------------------------------------ start

  window.addEventListener("hashchange", () => select(fragment(location.hash.slice(1))));
  start();
  select(location.hash.length > 1 ? fragment(location.hash.slice(1)) : null);
  document.documentElement.dataset.ready = "true";
})();
