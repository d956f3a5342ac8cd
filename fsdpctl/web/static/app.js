// fsdpctl's dashboard (and `report --html`): every run, one run live, a profile's hosts.
// Everything a run wrote (log lines, host names, command lines) is put on the page as text: the DOM is
// built with createElement and textContent only, never from HTML strings.
"use strict";
(function () {
  const state = { csrf: null, source: null, charts: {}, page: null };
  const report = document.getElementById("fsdpctl-report");

  // ---- small helpers ------------------------------------------------------------------------------
  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "data") Object.assign(node.dataset, value);
      else node.setAttribute(key, value);
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined || kid === false) continue;
      node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
  function fmt(value, digits) { return value === null || value === undefined ? "-" : Number(value).toFixed(digits); }
  function int(value) { return value === null || value === undefined ? "-" : Math.round(value).toLocaleString("en"); }
  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "-";
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d" + String(Math.floor(s % 86400 / 3600)).padStart(2, "0") + "h";
  }
  const STATE_CLASS = { running: "good", succeeded: "good", failed: "bad", lost: "bad", stopped: "warn",
                        interrupted: "warn", submitted: "dim", pending: "dim", starting: "dim", unknown: "dim" };
  function stateText(name) { return el("span", { class: STATE_CLASS[name] || "" }, name); }
  function section(id, title) { return el("div", { class: "panel", id }, el("h2", {}, title)); }
  function link(path, text) {
    return el("a", { href: path, onclick: (e) => { e.preventDefault(); go(path); } }, text);
  }
  function say(text, bad) { document.getElementById("connection").textContent = text;
                            document.getElementById("connection").className = bad ? "bad" : "dim"; }

  // ---- navigation and live data -------------------------------------------------------------------
  function go(path) { history.pushState(null, "", path); route(); }
  window.addEventListener("popstate", route);

  function stream(url, onUpdate) {
    if (state.source) state.source.close();
    const source = new EventSource(url);
    state.source = source;
    source.addEventListener("open", () => say("live"));
    source.addEventListener("error", () => say("reconnecting…", true));
    source.addEventListener("update", (event) => { say("live"); onUpdate(JSON.parse(event.data)); });
  }

  async function post(url) {
    if (!state.csrf) state.csrf = (await (await fetch("/api/session")).json()).csrf;
    const answer = await fetch(url, { method: "POST", headers: { "X-Fsdpctl-Csrf": state.csrf } });
    return [answer.status, await answer.json()];
  }

  function route() {
    for (const chart of Object.values(state.charts)) if (chart.destroy) chart.destroy();
    state.charts = {};
    const path = location.pathname;
    const main = clear(document.getElementById("main"));
    const crumbs = clear(document.getElementById("crumbs"));
    if (path.startsWith("/run/")) {
      const id = decodeURIComponent(path.slice(5));
      crumbs.append(link("/", "runs"), " / ", id);
      runSkeleton(main, id);
      stream("/api/events/run/" + encodeURIComponent(id), (data) => renderRun(data, false));
    } else if (path.startsWith("/hosts/")) {
      const profile = decodeURIComponent(path.slice(7));
      crumbs.append(link("/", "runs"), " / hosts of " + profile);
      if (state.source) state.source.close();
      showHosts(main, profile);
    } else {
      crumbs.append("runs");
      runsSkeleton(main);
      stream("/api/events/runs", renderRuns);
    }
  }

  // ---- the runs page ------------------------------------------------------------------------------
  function runsSkeleton(main) {
    const states = el("select", { id: "filter-state", onchange: () => renderRuns(state.page) }, el("option", { value: "" }, "every state"));
    const profiles = el("select", { id: "filter-profile", onchange: () => renderRuns(state.page) }, el("option", { value: "" }, "every profile"));
    main.append(el("div", { class: "row" }, el("label", {}, "state ", states), el("label", {}, "profile ", profiles),
                   el("span", { id: "runs-count", class: "dim" })),
                el("table", { id: "runs-table" }, el("thead", {}, el("tr", {}, ["run", "state", "profile", "backend", "nodes",
                  "started", "duration", "step", "loss", "tokens/s"].map((h) => el("th", {}, h)))), el("tbody")));
  }

  function fillSelect(select, values) {
    const chosen = select.value;
    const have = new Set([...select.options].map((o) => o.value));
    for (const value of values) if (!have.has(value)) select.append(el("option", { value }, value));
    select.value = chosen;
  }

  function renderRuns(data) {
    if (!data) return;
    state.page = data;
    const rows = data.runs;
    const stateSelect = document.getElementById("filter-state");
    const profileSelect = document.getElementById("filter-profile");
    if (!stateSelect) return;
    fillSelect(stateSelect, [...new Set(rows.map((r) => r.state))].sort());
    fillSelect(profileSelect, [...new Set(rows.map((r) => r.profile))].sort());
    const shown = rows.filter((r) => (!stateSelect.value || r.state === stateSelect.value) &&
                                     (!profileSelect.value || r.profile === profileSelect.value));
    document.getElementById("runs-count").textContent = shown.length + " of " + rows.length + " run(s)";
    const body = clear(document.querySelector("#runs-table tbody"));
    for (const r of shown) {
      const step = r.step === null ? "-" : r.total_steps ? r.step + "/" + r.total_steps : String(r.step);
      body.append(el("tr", { class: "link", data: { run: r.run_id }, onclick: () => go("/run/" + encodeURIComponent(r.run_id)) },
        el("td", {}, r.run_id), el("td", {}, stateText(r.state)), el("td", {}, link("/hosts/" + encodeURIComponent(r.profile), r.profile)),
        el("td", {}, r.backend), el("td", {}, r.nodes), el("td", {}, (r.started_at || "-").replace("T", " ").slice(0, 16)),
        el("td", {}, duration(r.duration_s)), el("td", {}, step), el("td", {}, fmt(r.loss, 4)), el("td", {}, int(r.tokens_per_s))));
    }
  }

  // ---- one run ------------------------------------------------------------------------------------
  function runSkeleton(main, id) {
    const actions = report ? null : el("div", { class: "row" },
      el("button", { id: "stop-button", class: "danger", onclick: () => act(id, "stop") }, "Stop the run"),
      el("button", { id: "stacks-button", onclick: () => act(id, "stacks") }, "Dump every rank's stack"),
      el("span", { id: "action-said", class: "dim" }));
    main.append(  // a report has no actions: append() would write a null as the text "null"
      el("div", { class: "panel", id: "summary" }),
      ...(actions ? [actions] : []),
      el("pre", { id: "action-output", hidden: "hidden" }),
      el("div", { class: "row" }, section("chart-loss", "loss"), section("chart-speed", "tokens/s and MFU")),
      section("nodes", "nodes and their GPUs now"),
      section("heat", "compute time of every rank by window (x the window's median)"),
      section("gpus", "each node's GPUs and its ranks' compute, on one time axis"),
      section("attempts", "attempts and replacements"),
      section("log-panel", "newest lines"),
      section("plan", "plan and scripts"));
  }

  async function act(id, what) {
    if (what === "stop" && !confirm("Stop run " + id + " on every node?")) return;
    const said = document.getElementById("action-said");
    said.textContent = what === "stop" ? "stopping…" : "reading every rank's stack…";
    const [status, answer] = await post("/api/runs/" + encodeURIComponent(id) + "/" + what);
    const out = document.getElementById("action-output");
    if (status !== 200) { said.textContent = answer.error + (answer.hint ? " (" + answer.hint + ")" : ""); return; }
    if (what === "stop") said.textContent = answer.stopped ? "stopped" : "processes remain: " + JSON.stringify(answer.remaining);
    else { said.textContent = "stacks:"; out.hidden = false; out.textContent = answer.lines.join("\n"); }
  }

  function renderRun(data, isReport, where) {
    const root = where || document;
    const snap = data.snapshot;
    const run = snap.run;
    const q = (sel) => root.querySelector(sel);
    const summary = clear(q("#summary"));
    const live = run.live ? el("span", { class: "good", id: "live" }, " live") :
      (["running", "submitted", "starting"].includes(run.state) ? el("span", { class: "bad", id: "live" }, " not live") : "");
    summary.append(el("h2", {}, run.run_id + "  ", el("span", { id: "run-state" }, stateText(run.state)), "  attempt " + run.attempt,
                      "  " + duration(run.elapsed_s), live));
    if (run.note) summary.append(el("p", { class: "notice" }, run.note));
    if (run.first_failure) summary.append(el("p", { class: "bad" }, "first failure: " + run.first_failure));
    if (run.step !== null) {
      const pct = run.total_steps ? Math.min(100, 100 * run.step / run.total_steps) : null;
      summary.append(el("div", {}, "step ", el("b", { id: "run-step" }, String(run.step)), run.total_steps ? " of " + run.total_steps : "",
                        run.eta_s !== null && run.eta_s !== undefined ? "  ETA " + duration(run.eta_s) : ""));
      if (pct !== null) summary.append(el("div", { class: "bar" }, el("div", { style: null, data: { pct } })));
      const bar = summary.querySelector(".bar > div");
      if (bar) bar.style.width = pct + "%";
      summary.append(el("div", {}, "loss " + fmt(run.loss, 4) + "   val " + fmt(run.val_loss, 4) + "   tokens/s " + int(run.tokens_per_s) +
                        (run.mfu !== null ? "   MFU " + fmt(100 * run.mfu, 1) + "%" : "")));
    } else {
      summary.append(el("div", { class: "dim" }, run.metrics ? "no step yet" : "no metrics from this program (nodes, GPUs and lines below)"));
    }
    summary.append(el("div", { class: "dim" }, "profile ", isReport ? run.profile : link("/hosts/" + encodeURIComponent(run.profile), run.profile),
                      " · backend " + run.backend + (run.started_at ? " · started " + run.started_at.replace("T", " ").slice(0, 19) : "")));
    for (const id of ["#stop-button", "#stacks-button"]) {  // nothing to stop or read in a run that ended
      const button = q(id);
      if (button) button.disabled = !["running", "starting", "submitted"].includes(run.state);
    }
    renderNodes(snap, q("#nodes"));
    renderAttempts(snap, q("#attempts"));
    renderLogs(snap, q("#log-panel"));
    renderPlan(data, q("#plan"), isReport);
    try {
      renderCharts(data.charts, snap, root);
    } catch (error) {  // a chart that cannot be drawn must not take the rest of the page with it
      say("a chart could not be drawn: " + error, true);
    }
  }

  function renderNodes(snap, panel) {
    clear(panel).append(el("h2", {}, "nodes and their GPUs now"));
    const strag = snap.straggler;
    if (strag) {
      panel.append(el("p", { class: "straggler", id: "straggler" }, strag.text.split(" every rank waits")[0]));
      if (strag.cause) panel.append(el("p", { class: "straggler" }, "cause: " + strag.cause));
    }
    else if (snap.ranks.length > 1) panel.append(el("p", { class: "good", id: "straggler" }, "no straggler"));
    const table = el("table", { id: "nodes-table" }, el("tr", {}, ["node", "host", "ranks", "state", "step", "GPU", "SM MHz", "util", "temp",
      "power", "memory", "now"].map((h) => el("th", {}, h))));
    for (const node of snap.nodes) {
      const gpus = node.gpus.length ? node.gpus : [null];
      gpus.forEach((gpu, i) => {
        const trouble = gpu ? [...gpu.reasons, ...gpu.faults] : [];
        const cells = i === 0 ? [node.node_rank, node.host, node.ranks || "-", stateText(node.state), node.step === null ? "-" : node.step]
                              : ["", "", "", "", ""];
        table.append(el("tr", { data: { node: node.node_rank, gpu: gpu ? gpu.index : "" } }, cells.map((c) => el("td", {}, c)),
          el("td", {}, gpu ? gpu.index : "no GPU samples"),
          el("td", {}, gpu ? int(gpu.sm_mhz) + " / " + int(gpu.sm_max_mhz) : ""),
          el("td", {}, gpu && gpu.util_pct !== null ? int(gpu.util_pct) + "%" : ""),
          el("td", {}, gpu && gpu.temp_c !== null ? int(gpu.temp_c) + " C" : ""),
          el("td", {}, gpu && gpu.power_w !== null ? int(gpu.power_w) + " W" : ""),
          el("td", {}, gpu && gpu.mem_mib !== null ? int(gpu.mem_mib) + (gpu.mem_total_mib ? " / " + int(gpu.mem_total_mib) : "") + " MiB" : ""),
          el("td", { class: trouble.length ? "gpu-trouble" : "dim" }, trouble.join(", "))));
      });
      for (const fault of node.faults) table.append(el("tr", {}, el("td", { colspan: "12", class: "gpu-trouble" }, "node " + node.node_rank + ": " + fault)));
    }
    panel.append(table);
  }

  function renderAttempts(snap, panel) {
    clear(panel).append(el("h2", {}, "attempts and replacements"));
    const list = el("ul", { id: "attempts-list" });
    for (const a of snap.attempts) {
      list.append(el("li", {}, "attempt " + a.attempt + " " + a.state + (a.from_step !== null && a.from_step !== undefined ? " from step " + a.from_step : "") +
        (a.ended_by ? ": " + a.ended_by : "") + (a.started_at ? " (" + a.started_at.slice(11, 19) + "–" + (a.finished_at || "").slice(11, 19) + ")" : "")));
      for (const r of a.replacements || []) list.append(el("li", { class: "warn" }, r.by + " in the place of " + r.host + " (" + r.why + ")"));
    }
    list.append(el("li", {}, "attempt " + snap.run.attempt + " " + snap.run.state + " (now)"));
    for (const r of snap.replacements) list.append(el("li", { class: "warn" }, r.by + " in the place of " + r.host + " (" + r.why + ")"));
    if (snap.recovery) list.append(el("li", {}, "stood still " + fmt(snap.recovery.stood_still_s, 1) + " s" +
      (snap.recovery.steps_redone !== null ? ", " + snap.recovery.steps_redone + " step(s) done again" : "")));
    panel.append(list);
    const hosts = snap.hosts;
    if (hosts.spares.length) panel.append(el("p", {}, "spares: " + hosts.spares.join(", ")));
    for (const x of hosts.excluded) panel.append(el("p", { class: "warn" }, "excluded: " + x.host + " (" + x.reason + ", since " + x.since + ")"));
  }

  function renderLogs(snap, panel) {
    if (!panel.querySelector("#logs")) {
      const f = panel.fsdpctlFilter = { rank: "", host: "", q: "" };
      const again = () => renderLogs(panel.fsdpctlSnap, panel);
      const rank = el("select", { id: "log-rank", onchange: (e) => { f.rank = e.target.value; again(); } }, el("option", { value: "" }, "every rank"));
      const host = el("select", { id: "log-host", onchange: (e) => { f.host = e.target.value; again(); } }, el("option", { value: "" }, "every host"));
      const search = el("input", { id: "log-search", placeholder: "search", oninput: (e) => { f.q = e.target.value; again(); } });
      panel.append(el("div", { class: "row" }, rank, host, search), el("pre", { id: "logs" }));
    }
    panel.fsdpctlSnap = snap;
    const f = panel.fsdpctlFilter;
    fillSelect(panel.querySelector("#log-rank"), [...new Set(snap.logs.filter((l) => l.rank !== null).map((l) => String(l.rank)))].sort((a, b) => a - b));
    fillSelect(panel.querySelector("#log-host"), [...new Set(snap.logs.map((l) => l.host))].sort());
    const lines = snap.logs.filter((l) => (!f.rank || String(l.rank) === f.rank) && (!f.host || l.host === f.host) &&
                                         (!f.q || l.text.toLowerCase().includes(f.q.toLowerCase())));
    const pre = panel.querySelector("#logs");
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = lines.map((l) => "[" + l.host + (l.rank !== null ? " r" + l.rank : "") + "] " + l.text).join("\n");
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  function renderPlan(data, panel, isReport) {
    if (panel.dataset.done) return;
    panel.dataset.done = "1";
    const plan = data.plan;
    panel.append(el("pre", { id: "plan-json" }, JSON.stringify(plan, null, 1)));
    if (isReport) return;
    const shown = el("pre", { id: "script-text", hidden: "hidden" });
    const buttons = data.scripts.map((name) => el("button", { data: { script: name }, onclick: async () => {
      const answer = await (await fetch("/api/runs/" + encodeURIComponent(plan.run_id) + "/scripts/" + encodeURIComponent(name))).json();
      shown.hidden = false; shown.textContent = answer.text || answer.error; } }, name));
    panel.append(el("div", { class: "row" }, buttons), shown);
  }

  // ---- charts -------------------------------------------------------------------------------------
  function chart(container, opts, data) {
    // one chart per container, kept (and its zoom) while its series stay the same
    container.dataset.points = String(data[0].length);
    const existing = container.fsdpctlChart;
    if (existing && existing.series.length === opts.series.length) { existing.setData(data); return; }
    if (existing) existing.destroy();
    opts.width = Math.max(320, container.clientWidth - 24);
    container.fsdpctlChart = new uPlot(opts, data, container);
    state.charts[Object.keys(state.charts).length] = container.fsdpctlChart;
  }

  function union(xs) { return [...new Set(xs.flat())].sort((a, b) => a - b); }
  function along(x, series) {
    const at = new Map(series.x.map((v, i) => [v, series.y[i]]));
    return x.map((v) => (at.has(v) ? at.get(v) : null));
  }

  function renderCharts(charts, snap, root) {
    if (!charts || typeof uPlot === "undefined") return;
    // a program of the user's writes its rows without node and host: the snapshot knows whose rank it is
    const owner = new Map(snap.ranks.map((r) => [r.rank, r]));
    for (const entry of [...charts.heat.ranks, ...charts.rank_time]) {
      const known = owner.get(entry.rank);
      if (known && (entry.node === null || entry.node === undefined)) { entry.node = known.node_rank; entry.host = known.host; }
    }
    const q = (sel) => root.querySelector(sel);
    const loss = charts.train.loss, val = charts.val;
    const lx = union([loss.x, val.x]);
    chart(q("#chart-loss"), { height: 220, scales: { x: { time: false } },
      series: [{ label: "step" }, { label: "loss", stroke: "#6ea8fe" }, { label: "val loss", stroke: "#d9a441", points: { show: true } }] },
      [lx, along(lx, loss), along(lx, val)]);
    const tps = charts.train.tokens_per_s, mfu = charts.train.mfu;
    chart(q("#chart-speed"), { height: 220, scales: { x: { time: false } },
      axes: [{}, { label: "tokens/s" }, { side: 1, scale: "mfu", label: "MFU" }],
      series: [{ label: "step" }, { label: "tokens/s", stroke: "#5fb36b" }, { label: "MFU", scale: "mfu", stroke: "#c678dd" }] },
      [tps.x, tps.y, along(tps.x, mfu)]);
    drawHeat(charts.heat, snap, q("#heat"));
    drawGpus(charts, snap, q("#gpus"));
  }

  function drawHeat(heat, snap, panel) {
    let canvas = panel.querySelector("canvas");
    if (!canvas) { canvas = el("canvas", { class: "heat", id: "heat-canvas" }); panel.append(el("div", { class: "legend", id: "heat-legend" }), canvas); }
    const ranks = heat.ranks.slice().sort((a, b) => (a.node - b.node) || (a.rank - b.rank));
    const cols = heat.steps.length;
    canvas.dataset.columns = String(cols);
    canvas.dataset.ranks = String(ranks.length);
    const strag = snap.straggler ? snap.straggler.rank : null;
    panel.querySelector("#heat-legend").textContent = ranks.length ? "rows: ranks by node (" + ranks.map((r) => "r" + r.rank + "@" + r.host).slice(0, 64).join(" ") +
      (ranks.length > 64 ? " …" : "") + "); columns: windows, " + heat.windows_per_column + " per column; green 1.0x, red 1.5x and more" +
      (strag !== null ? "; straggler: rank " + strag + " (outlined)" : "") : "no per-rank timings";
    if (!cols || !ranks.length) return;
    const cell = Math.max(1, Math.min(12, Math.floor(900 / cols)));
    const rowH = Math.max(2, Math.min(14, Math.floor(400 / ranks.length)));
    canvas.width = cols * cell; canvas.height = ranks.length * rowH;
    canvas.style.height = Math.max(24, Math.min(480, ranks.length * 16)) + "px";  // stretched across, rows kept readable
    const ctx = canvas.getContext("2d");
    for (let c = 0; c < cols; c++) {
      const column = ranks.map((r) => r.compute_s[c]).filter((v) => v !== null).sort((a, b) => a - b);
      const median = column.length ? column[Math.floor(column.length / 2)] : null;
      ranks.forEach((r, i) => {
        const v = r.compute_s[c];
        const ratio = v !== null && median ? v / median : null;
        const t = ratio === null ? 0 : Math.max(0, Math.min(1, (ratio - 1) / 0.5));
        ctx.fillStyle = ratio === null ? "#222" : "rgb(" + Math.round(60 + 180 * t) + "," + Math.round(170 - 110 * t) + ",80)";
        ctx.fillRect(c * cell, i * rowH, cell, rowH);
      });
    }
    const at = ranks.findIndex((r) => r.rank === strag);
    if (at >= 0) { ctx.strokeStyle = "#ff3040"; ctx.lineWidth = 2; ctx.strokeRect(1, at * rowH + 1, canvas.width - 2, rowH - 2); }
  }

  function drawGpus(charts, snap, panel) {
    const byNode = new Map();
    for (const g of charts.gpus) { const key = g.node + " " + g.host; if (!byNode.has(key)) byNode.set(key, []); byNode.get(key).push(g); }
    const ranksOf = new Map();
    for (const r of charts.rank_time) { const key = r.node + " " + r.host; if (!ranksOf.has(key)) ranksOf.set(key, []); ranksOf.get(key).push(r); }
    const keys = [...new Set([...byNode.keys(), ...ranksOf.keys()])].sort();
    if (!keys.length) { if (!panel.querySelector(".dim")) panel.append(el("p", { class: "dim" }, "no GPU samples and no per-rank timings yet")); return; }
    const sync = uPlot.sync("gpus");
    for (const key of keys) {
      const [node, ...host] = key.split(" ");
      let box = panel.querySelector('[data-node-key="' + CSS.escape(key) + '"]');
      if (!box) { box = el("div", { data: { nodeKey: key } }, el("h3", {}, "node " + node + " (" + host.join(" ") + ")"),
                           el("div", { class: "gpu-chart" }), el("div", { class: "compute-chart" })); panel.append(box); }
      const gpus = byNode.get(key) || [];
      if (gpus.length) {
        const x = gpus[0].sm_mhz.x;
        const slowed = gpus.map((g) => g.sm_mhz.y.map((v, i) => (g.slowed.y[i] > 0 ? v : null)));
        const series = [{}, ...gpus.map((g) => ({ label: "GPU " + g.gpu + " SM MHz", stroke: "#6ea8fe" })),
                        ...gpus.map((g) => ({ label: "GPU " + g.gpu + " slowed", stroke: "#e0555f", width: 0, points: { show: true, size: 7, fill: "#e0555f" } }))];
        box.querySelector(".gpu-chart").dataset.slowed = String(slowed.flat().filter((v) => v !== null).length);
        chart(box.querySelector(".gpu-chart"), { height: 160, cursor: { sync: { key: sync.key } }, series },
              [x, ...gpus.map((g) => g.sm_mhz.y), ...slowed]);
      }
      const ranks = ranksOf.get(key) || [];
      if (ranks.length) {
        const x = ranks[0].x;
        chart(box.querySelector(".compute-chart"), { height: 140, cursor: { sync: { key: sync.key } },
          series: [{}, ...ranks.map((r) => ({ label: "rank " + r.rank + " compute s", stroke: r.rank === (snap.straggler || {}).rank ? "#e0555f" : "#5fb36b" }))] },
          [x, ...ranks.map((r) => along(x, r))]);
      }
    }
  }

  // ---- a profile's hosts --------------------------------------------------------------------------
  async function showHosts(main, profile) {
    const answer = await fetch("/api/hosts/" + encodeURIComponent(profile));
    const data = await answer.json();
    say("as of " + new Date().toLocaleTimeString());
    if (answer.status !== 200) { main.append(el("p", { class: "bad" }, data.error)); return; }
    const table = el("table", { id: "hosts-table" }, el("tr", {}, ["host", "role", "node", "in the place of", "excluded: why", "since", "by run",
      "last check", "its findings", "straggler in runs"].map((h) => el("th", {}, h))));
    for (const h of data.hosts) {
      const doctor = h.doctor || {};
      table.append(el("tr", { data: { host: h.host } }, el("td", {}, h.host), el("td", { class: h.role === "excluded" ? "bad" : "" }, h.role),
        el("td", {}, h.node_rank ?? ""), el("td", {}, h.replaces || ""), el("td", {}, h.reason || ""), el("td", {}, h.since || ""),
        el("td", {}, h.run_id || ""), el("td", {}, doctor.at ? doctor.status + " (" + doctor.by + ", " + doctor.at.replace("T", " ").slice(0, 19) + ")" : "never"),
        el("td", { class: (doctor.checks || []).length ? "warn" : "" }, (doctor.checks || []).map((c) => c.name + ": " + c.detail).join("; ")),
        el("td", {}, String(h.stragglers))));
    }
    main.append(el("div", { class: "panel" }, el("h2", {}, "hosts of " + profile), table));
  }

  // ---- a report file: the same pages from data in the file, no server -------------------------------
  function showReport() {
    const runs = JSON.parse(report.textContent).runs;
    document.getElementById("connection").textContent = "report of " + runs.length + " run(s), written " + (JSON.parse(report.textContent).written || "");
    const main = document.getElementById("main");
    const sideBySide = el("div", { class: "row" });
    main.append(sideBySide);
    for (const data of runs) {
      const column = el("div", { class: "panel report-run", data: { run: data.snapshot.run.run_id } });
      sideBySide.append(column);
      runSkeleton(column, data.snapshot.run.run_id);
      for (const id of ["chart-loss", "chart-speed", "heat", "gpus", "nodes", "attempts", "log-panel", "plan", "summary"]) {
        const node = column.querySelector("#" + id);
        if (node) node.dataset.in = data.snapshot.run.run_id;
      }
      renderRun(data, true, column);
    }
  }

  if (report) showReport();
  else route();
})();
