// streamnet UI: three pages that poll the server's JSON (/api/...) and draw plain SVG.
// No build step and no library: what the browser has is enough for tables and curves.

const POLL_MS = 1000;
const PALETTE = ["#3b6fd1", "#d17a22", "#2e9e5b", "#a63ad1", "#c23b4a", "#1f9bb0", "#8a6d1f", "#5b6474"];

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
  '"': "&quot;", "'": "&#39;"}[c]));
const num = (v, digits = 0) => v == null ? "–" : Number(v).toLocaleString("en", {maximumFractionDigits: digits,
  minimumFractionDigits: digits});
const pct = (v) => v == null ? "–" : (100 * v).toFixed(1) + " %";
const secs = (v) => v == null ? "–" : v < 1e-3 ? (v * 1e6).toFixed(0) + " µs" : v < 1 ? (v * 1e3).toFixed(1) + " ms"
  : v.toFixed(1) + " s";
function duration(s) {
  if (s == null) return "–";
  s = Math.floor(s);
  const h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
  return h ? `${h} h ${m} min` : m ? `${m} min ${s % 60} s` : `${s} s`;
}
function bytes(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return `${b.toFixed(i ? 1 : 0)} ${u[i]}`;
}

// -- pages ---------------------------------------------------------------------------
const PAGES = {
  cluster: {url: "/api/cluster", render: renderCluster},
  topologies: {url: "/api/topologies", render: renderTopologies},
  training: {url: "/api/training", render: renderTraining},
};
let current = null, timer = null;

function page() {
  const name = location.hash.slice(1);
  return name in PAGES ? name : "cluster";
}

function show() {
  current = page();
  for (const s of document.querySelectorAll(".page")) s.classList.toggle("shown", s.id === `page-${current}`);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === current);
  clearTimeout(timer);
  poll();
}

async function poll() {
  const name = current;
  try {
    const r = await fetch(PAGES[name].url, {cache: "no-store"});
    if (!r.ok) throw new Error(`${PAGES[name].url}: HTTP ${r.status}`);
    const data = await r.json();
    if (name === current) {
      PAGES[name].render(data);
      document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    }
  } catch (e) {
    document.getElementById("updated").textContent = `cannot reach the UI server (${e.message}); retrying`;
  }
  if (name === current) timer = setTimeout(poll, POLL_MS);
}

// -- cluster ---------------------------------------------------------------------------
function renderCluster(d) {
  document.getElementById("leader").textContent = d.leader ?? "none elected";
  document.getElementById("coordinator").textContent = d.coordinator_error ?
    `coordinator: ${d.coordinator_error}` : "coordinator: connected";
  document.querySelector("#workers tbody").innerHTML = d.workers.map((w) => `
    <tr data-worker="${esc(w.id)}">
      <td>${esc(w.id)} ${w.leader ? '<span class="badge">leader</span>' : ""}</td>
      <td>${esc(w.host)}</td><td>${esc(w.port)}</td><td>${num(w.threads)}</td>
      <td>${pct(w.busy_ratio)}</td><td>${num(w.tasks)}</td><td>${duration(w.uptime_s)}</td>
      <td class="error">${w.error ? "unreachable: " + esc(w.error) : ""}</td>
    </tr>`).join("") || '<tr><td colspan="8" class="muted">no worker registered</td></tr>';
  document.getElementById("decisions").innerHTML = d.decisions.map((e) => `<li>
    <span class="muted">${new Date(e.time * 1000).toLocaleTimeString()} ${esc(e.topology)}</span>
    ${esc(e.decision)}</li>`).join("") || '<li class="muted">none yet (load balancing decides with --balance load)</li>';
}

// -- topologies ------------------------------------------------------------------------
function renderTopologies(d) {
  const list = document.getElementById("topology-list");
  if (!d.topologies.length) {
    list.innerHTML = '<p class="muted">no topology is running</p>';
    return;
  }
  list.innerHTML = d.topologies.map((t) => {
    const rows = t.graph.nodes.map((n) => {
      const c = t.components[n.id] || {};
      return `<tr data-component="${esc(n.id)}"><td>${esc(n.id)}</td><td>${esc(n.kind)}</td>
        <td>${num(n.parallelism)}</td><td>${num(c.executed)}</td><td>${num(c.emitted)}</td><td>${num(c.acked)}</td>
        <td>${num(c.failed)}</td><td>${secs(c.execute_avg_s)}</td><td>${secs(c.execute_p99_s)}</td><td>${pct(c.capacity)}</td>
        <td>${esc(Object.entries(c.workers || {}).map(([task, w]) => `${task}@${w}`).join(" "))}</td></tr>`;
    }).join("");
    return `<div class="card" data-topology="${esc(t.name)}">
      <h2>${esc(t.name)} <span class="badge">${esc(t.status)}</span>
        ${t.failures.length ? '<span class="badge failed">failed</span>' : ""}</h2>
      ${failureList(t.failures)}
      ${graphSvg(t)}
      <table><thead><tr><th>component</th><th>kind</th><th>parallelism</th><th>executed</th><th>emitted</th>
        <th>acked</th><th>failed</th><th>execute (avg)</th><th>execute (p99)</th><th title="fraction of the last poll interval its busiest task spent executing (Storm's capacity)">capacity</th><th>tasks@worker</th></tr></thead>
        <tbody>${rows}</tbody></table></div>`;
  }).join("");
}

// a task whose prepare()/open() raised, a worker that refused the spec: why it cannot run
function failureList(failures) {
  if (!failures.length) return "";
  return `<ul class="failures" data-failures="${failures.length}">${failures.map((f) =>
    `<li><b>${esc(f.kind)}</b> (${esc(f.where)}): <span class="error">${esc(f.error)}</span></li>`).join("")}</ul>`;
}

function graphSvg(t) {
  const W = 150, H = 54, DX = 230, DY = 90, PAD = 30;
  const layers = {};
  const pos = {};
  for (const n of t.graph.nodes) {
    const i = (layers[n.layer] = (layers[n.layer] || 0) + 1) - 1;
    pos[n.id] = {x: PAD + n.layer * DX, y: PAD + i * DY, layer: n.layer};
  }
  const width = PAD * 2 + Math.max(0, ...Object.values(pos).map((p) => p.x)) + W;
  const height = PAD * 2 + Math.max(0, ...Object.values(pos).map((p) => p.y)) + H + 70;
  const pairs = {};
  for (const e of t.graph.edges) (pairs[`${e.from}\u0000${e.to}`] ||= {from: e.from, to: e.to, labels: []}).labels.push(e.label);
  const workerColour = (w) => PALETTE[Math.max(0, t.workers.indexOf(w)) % PALETTE.length];
  let edges = "", nodes = "";
  for (const e of Object.values(pairs)) {
    const a = pos[e.from], b = pos[e.to];
    if (!a || !b) continue;
    let path, lx, ly;
    if (b.layer > a.layer) {              // forward: right side to left side
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
      path = `M${x1},${y1} C${x1 + 60},${y1} ${x2 - 60},${y2} ${x2},${y2}`;
      lx = (x1 + x2) / 2; ly = (y1 + y2) / 2 - 6 - 12 * (e.labels.length - 1);
    } else {                              // back (training's sync -> compute): under the nodes
      const x1 = a.x + W / 2, y1 = a.y + H, x2 = b.x + W / 2, y2 = b.y + H;
      const low = Math.max(y1, y2) + 55;
      path = `M${x1},${y1} C${x1},${low} ${x2},${low} ${x2},${y2}`;
      lx = (x1 + x2) / 2; ly = low - 12 * e.labels.length + 4;
    }
    edges += `<path class="edge" d="${path}" marker-end="url(#arrow)"/>` + e.labels.map((l, i) =>
      `<text class="edge-label" text-anchor="middle" x="${lx}" y="${ly + 12 * i}">${esc(l)}</text>`).join("");
  }
  for (const n of t.graph.nodes) {
    const p = pos[n.id];
    const c = t.components[n.id] || {};
    const dots = Object.entries(c.workers || {}).map(([task, w], i) =>
      `<circle cx="${p.x + 12 + i * 12}" cy="${p.y + H - 9}" r="4" fill="${workerColour(w)}"><title>task ${esc(task)} on ${esc(w)}</title></circle>`).join("");
    nodes += `<g class="node ${esc(n.kind)}" data-id="${esc(n.id)}">
      <rect x="${p.x}" y="${p.y}" width="${W}" height="${H}"/>
      <text x="${p.x + 10}" y="${p.y + 17}" font-weight="600">${esc(n.id)} ×${num(n.parallelism)}</text>
      <text x="${p.x + 10}" y="${p.y + 31}" class="muted" fill="#7a8394">${esc(n.class)}</text>${dots}</g>`;
  }
  const legend = t.workers.map((w, i) => `<circle cx="${PAD + i * 70}" cy="${height - 12}" r="5" fill="${workerColour(w)}"/>
    <text x="${PAD + 9 + i * 70}" y="${height - 8}">${esc(w)}</text>`).join("");
  return `<svg class="graph" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">
    <defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
      <path d="M0,0 L10,5 L0,10 z" fill="#8a93a3"/></marker></defs>${edges}${nodes}${legend}</svg>`;
}

// -- training ----------------------------------------------------------------------------
function renderTraining(d) {
  const list = document.getElementById("training-list");
  if (!d.runs.length) {
    list.innerHTML = '<p class="muted">no training topology is running</p>';
    return;
  }
  list.innerHTML = d.runs.map((r) => `<div class="card" data-run="${esc(r.name)}">
    <h2>${esc(r.name)} <span class="badge">${esc(r.status)}</span></h2>
    <p class="figures"><span>epoch <b>${num(r.epoch)}</b></span><span><b>${num(r.samples_per_s)}</b> samples/s</span>
      <span>sync rounds <b>${num(r.sync_rounds)}</b></span><span>samples <b>${num(r.samples)}</b></span>
      <span>moved <b>${bytes(r.bytes_moved || 0)}</b></span><span>replayed samples <b>${num(r.replayed_samples)}</b></span>
      <span>recoveries <b>${num(r.recoveries)}</b></span></p>
    <div class="charts">
      ${lineChart("loss", "training loss per round", r.loss, {xLabel: "round"})}
      ${lineChart("accuracy", "test accuracy per epoch", r.accuracy, {xLabel: "epoch", percent: true, yMin: 0, yMax: 1})}
      ${unitBars(r.per_unit)}
    </div>
    ${stragglers(r.stragglers)}</div>`).join("");
}

function lineChart(id, title, points, opt) {
  const W = 420, H = 230, L = 52, R = 14, T = 26, B = 36;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs, opt.xLabel === "epoch" ? 1 : 0), x1 = Math.max(...xs, x0 + 1);
  let y0 = opt.yMin ?? Math.min(...ys, 0), y1 = opt.yMax ?? Math.max(...ys, y0 + 1e-9);
  if (!points.length && opt.yMax == null) { y0 = 0; y1 = 1; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => H - B - (y - y0) / (y1 - y0 || 1) * (H - T - B);
  const fmt = (v) => opt.percent ? (100 * v).toFixed(0) + "%" : Number(v.toPrecision(3)).toString();
  let grid = "";
  for (let i = 0; i <= 4; i++) {
    const v = y0 + (y1 - y0) * i / 4, y = sy(v);
    grid += `<line class="grid" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/>
      <text x="${L - 6}" y="${y + 4}" text-anchor="end">${fmt(v)}</text>`;
  }
  const line = points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
  const dots = points.length <= 60 ? points.map((p) =>
    `<circle class="point" cx="${sx(p[0])}" cy="${sy(p[1])}" r="3" fill="#3b6fd1"><title>${esc(opt.xLabel)} ${Number(p[0])}: ${fmt(p[1])}</title></circle>`).join("") : "";
  const last = points.length ? fmt(points[points.length - 1][1]) : "no point yet";
  return `<svg class="chart" data-chart="${id}" data-points="${points.length}" width="${W}" height="${H}">
    <text x="${L}" y="16" font-weight="600">${esc(title)}: ${esc(last)}</text>${grid}
    <line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/>
    <text x="${L}" y="${H - B + 16}">${num(x0)}</text><text x="${W - R}" y="${H - B + 16}" text-anchor="end">${num(x1)}</text>
    <text x="${(L + W - R) / 2}" y="${H - 6}" text-anchor="middle">${esc(opt.xLabel)}</text>
    <path class="line" d="${line}" stroke="#3b6fd1"/>${dots}</svg>`;
}

function stragglers(s) {
  if (!s || !s.top || !s.top.length) return '<p class="muted" data-stragglers="none">no straggler yet</p>';
  const rows = s.top.map((t) => `<tr><td>unit ${num(t.unit)}</td><td>${esc(t.worker)}</td><td>${num(t.rounds)}</td>
    <td>${secs(t.held_s)}</td><td>${Object.entries(t.reasons).filter(([, n]) => n).map(([r, n]) => `${esc(r)} ${num(n)}`).join(", ")}</td></tr>`);
  return `<table class="stragglers" data-stragglers="${s.top.length}"><caption>stragglers over ${num(s.rounds_judged)} rounds
    (the unit that arrived last, and why)</caption>
    <thead><tr><th>unit</th><th>worker</th><th>rounds held</th><th>others waited</th><th>why</th></tr></thead>
    <tbody>${rows.join("")}</tbody></table>`;
}

function unitBars(units) {
  const parts = [["compute_s", "compute", "#3b6fd1"], ["communication_s", "communication", "#d17a22"],
    ["wait_s", "barrier wait", "#9aa3b2"]];
  const W = 420, L = 110, R = 14, row = 26, T = 26;
  const H = T + Math.max(1, units.length) * row + 30;
  const total = Math.max(1e-9, ...units.map((u) => parts.reduce((s, [k]) => s + u[k], 0)));
  const bars = units.map((u, i) => {
    let x = L;
    const y = T + i * row;
    const segs = parts.map(([k, name, colour]) => {
      const w = u[k] / total * (W - L - R);
      const s = `<rect x="${x}" y="${y}" width="${w}" height="${row - 8}" fill="${colour}"><title>${name}: ${secs(u[k])}</title></rect>`;
      x += w;
      return s;
    }).join("");
    return `<text x="${L - 6}" y="${y + 13}" text-anchor="end">unit ${u.unit} (${esc(u.worker ?? "?")})</text>${segs}`;
  }).join("");
  const legend = parts.map(([, name, colour], i) => `<rect x="${L + i * 105}" y="${H - 18}" width="10" height="10" fill="${colour}"/>
    <text x="${L + 14 + i * 105}" y="${H - 9}">${name}</text>`).join("");
  return `<svg class="chart" data-chart="units" width="${W}" height="${H}">
    <text x="${L}" y="16" font-weight="600">per unit: seconds of compute, communication, wait</text>
    ${bars || `<text x="${L}" y="${T + 14}" class="muted">no round yet</text>`}${legend}</svg>`;
}

window.addEventListener("hashchange", show);
show();
