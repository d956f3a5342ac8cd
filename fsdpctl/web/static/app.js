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
  // The charts by time (GPUs, ranks' compute) have epoch seconds for x: labelled as local wall-clock time,
  // ticks on whole seconds (uPlot's own labels of sub-second ticks read as ":13.000", like negative numbers).
  function clock(seconds) {
    const at = new Date(seconds * 1000);
    return [at.getHours(), at.getMinutes(), at.getSeconds()].map((v) => String(v).padStart(2, "0")).join(":");
  }
  function timeAxis() {
    return { space: 70, incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400],
             values: (u, splits) => splits.map(clock) };
  }
  function timeSeries() { return { label: "time", value: (u, v) => (v === null || v === undefined ? "--" : clock(v)) }; }
  function wrapTable(table) { return el("div", { class: "table-wrap" }, table); }  // scrolls when too wide, never clips
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
    if (state.nodeObserver) { state.nodeObserver.disconnect(); state.nodeObserver = null; }
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
                wrapTable(el("table", { id: "runs-table" }, el("thead", {}, el("tr", {}, ["run", "state", "profile", "backend", "nodes",
                  "started", "duration", "step", "loss", "tokens/s"].map((h) => el("th", {}, h)))), el("tbody"))));
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
  function runSkeleton(main, id, compared) {  // compared: one of several runs of a report, its charts by step overlaid
    const actions = report ? null : el("div", { class: "row" },
      el("button", { id: "stop-button", class: "danger", onclick: () => act(id, "stop") }, "Stop the run"),
      el("button", { id: "stacks-button", onclick: () => act(id, "stacks") }, "Dump every rank's stack"),
      el("button", { id: "profile-button", onclick: () => act(id, "profile") }, "Profile 3 steps"),
      el("span", { id: "action-said", class: "dim" }));
    main.append(  // a report has no actions: append() would write a null as the text "null"
      el("div", { class: "panel", id: "summary" }),
      ...(actions ? [actions] : []),
      el("pre", { id: "action-output", hidden: "hidden" }),
      ...(compared ? [] : [el("div", { class: "row" }, section("chart-loss", "loss"), section("chart-speed", "tokens/s and MFU"))]),
      section("nodes", "nodes and their GPUs now"),
      section("heat", "compute time of every rank by window (x the window's median)"),
      section("gpus", "each node's GPUs and its ranks' compute, on one time axis"),
      section("attempts", "attempts and replacements"),
      section("goodput", "where the time went"),
      section("profiles", "profiles (torch.profiler)"),
      section("log-panel", "newest lines"),
      section("plan", "plan and scripts"));
  }

  async function act(id, what) {
    if (what === "stop" && !confirm("Stop run " + id + " on every node?")) return;
    const said = document.getElementById("action-said");
    said.textContent = what === "stop" ? "stopping…" : what === "profile" ? "profiling 3 steps of the chosen ranks…" :
      "reading every rank's stack…";
    const [status, answer] = await post("/api/runs/" + encodeURIComponent(id) + "/" + what);
    const out = document.getElementById("action-output");
    if (status !== 200) { said.textContent = answer.error + (answer.hint ? " (" + answer.hint + ")" : ""); return; }
    if (what === "stop") said.textContent = answer.stopped ? "stopped" : "processes remain: " + JSON.stringify(answer.remaining);
    else { said.textContent = what + ":"; out.hidden = false; out.textContent = answer.lines.join("\n"); }
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
    for (const id of ["#stop-button", "#stacks-button", "#profile-button"]) {  // nothing to act on in a run that ended
      const button = q(id);
      if (button) button.disabled = !["running", "starting", "submitted"].includes(run.state);
    }
    renderNodes(snap, q("#nodes"));
    renderAttempts(snap, q("#attempts"));
    renderGoodput(data.goodput, q("#goodput"));
    renderProfiles(data.profiles, q("#profiles"));
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
    panel.append(wrapTable(table));
  }

  function resizeText(r) {  // as Resize.describe() says it
    const grows = r.nodes > r.before;
    return (grows ? "grows back to " : "runs on ") + r.nodes + " of " + r.full + " nodes: " + r.hosts.join(", ") +
      (grows ? " back (" : " out (") + r.why + ")" + (r.batch ? "; " + r.batch : "");
  }

  function profileTimeline(p) {  // every profiled rank on the launcher's clock: compute and communication lanes, steps marked
    const ranks = (p.ranks || []).filter((r) => r.timeline);
    const label = 170, width = 1100, row = 34, top = 18;
    const canvas = el("canvas", { class: "profile-timeline", data: { ranks: ranks.length, profile: p.profile_id } });
    canvas.width = width; canvas.height = top + row * ranks.length + 6;
    const end = Math.max(1e-3, ...ranks.flatMap((r) => r.timeline.steps.map((s) => s[2])));
    const x = (ms) => label + (width - label - 10) * ms / end;
    const g = canvas.getContext("2d");
    const ink = getComputedStyle(document.body).color || "#888";  // the page's own text colour, dark or light
    g.font = "12px sans-serif";
    let drawn = 0;
    ranks.forEach((r, i) => {
      const y = top + i * row;
      g.fillStyle = r.rank === p.straggler ? "#e0566a" : ink;
      g.fillText("rank " + r.rank + " " + r.host, 4, y + 18, label - 8);  // text on a canvas: never markup
      for (const [lane, color, dy] of [["compute", "#3367d6", 2], ["comm", "#e8710a", 16]]) {
        g.fillStyle = color;
        for (const [a, b] of r.timeline[lane]) { g.fillRect(x(a), y + dy, Math.max(1, x(b) - x(a)), 12); drawn += 1; }
      }
      g.strokeStyle = "#888";
      for (const [n, a] of r.timeline.steps) {
        g.beginPath(); g.moveTo(x(a), y); g.lineTo(x(a), y + 30); g.stroke();
        if (i === 0) { g.fillStyle = ink; g.fillText("step " + n, x(a) + 3, 12); }
      }
    });
    canvas.dataset.drawn = drawn;
    return el("div", { class: "table-wrap" }, canvas,
      el("p", { class: "dim" }, "blue: compute, orange: communication, lines: each profiled step's start; " + fmt(end, 1) + " ms in all"));
  }

  function renderProfiles(profiles, panel) {  // fsdpctl profile: each rank's time per profiled step, the verdict
    if (!panel) return;
    clear(panel).append(el("h2", {}, "profiles (torch.profiler)"));
    if (!profiles || !profiles.length) { panel.append(el("p", { class: "dim" }, "none: fsdpctl profile RUN, or the button above")); return; }
    for (const p of profiles) {
      const steps = p.steps && p.steps.length ? "steps " + p.steps[0] + "-" + p.steps[p.steps.length - 1] : "no step";
      panel.append(el("h3", {}, "profile " + p.profile_id + " (" + steps + ")"),
                   el("p", { class: p.straggler === null || p.straggler === undefined ? "" : "bad", data: { profile: p.profile_id } }, p.verdict));
      const table = el("table", { class: "profile-table" }, el("tr", {}, ["rank", "host", "compute", "communication", "overlap", "idle", "step"]
        .map((h) => el("th", {}, h))));
      for (const r of p.ranks || []) {
        table.append(el("tr", { data: { rank: r.rank } }, el("td", {}, String(r.rank)), el("td", {}, r.host),
          ...["compute_ms", "comm_ms", "overlap_ms", "idle_ms", "step_ms"].map((k) => el("td", {}, fmt(r[k], 1) + " ms"))));
      }
      panel.append(profileTimeline(p), wrapTable(table), el("p", { class: "dim" }, "trace: " + p.trace));
      for (const note of p.notes || []) panel.append(el("p", { class: "notice" }, note));
    }
  }

  function renderGoodput(account, panel) {  // fsdpctl.goodput: every second of the run in one category
    clear(panel).append(el("h2", {}, "where the time went"));
    if (!account) { panel.append(el("p", { class: "dim" }, "no account yet")); return; }
    const pct = (v) => v === null || v === undefined ? "-" : fmt(100 * v, 1) + "%";
    panel.append(el("p", { id: "goodput-line" }, "ETTR " + pct(account.ettr) + ", strict goodput " + pct(account.goodput) +
      " of " + duration(account.wall_s) + " held; " + account.attempts + " attempt(s)" +
      (account.steps_redone ? ", " + account.steps_redone + " step(s) done again" : "")));
    const bar = el("div", { class: "goodput-bar", id: "goodput-bar" });
    const table = el("table", { id: "goodput-table" }, el("tr", {}, ["", "category", "seconds", "share", "GPU-h"].map((h) => el("th", {}, h))));
    for (const [name, label] of Object.entries(account.labels)) {
      const seconds = account.seconds[name] || 0, gpuh = account.gpu_hours[name] || 0;
      if (seconds <= 0 && gpuh <= 0) continue;
      const share = account.wall_s > 0 ? seconds / account.wall_s : 0;
      if (share > 0) {
        const part = el("span", { class: "gp-" + name, title: label + ": " + fmt(seconds, 1) + " s" });
        part.style.width = (100 * share) + "%";
        bar.append(part);
      }
      table.append(el("tr", { data: { category: name } }, el("td", {}, el("span", { class: "gp-key gp-" + name })), el("td", {}, label),
        el("td", {}, fmt(seconds, 1)), el("td", {}, pct(share)), el("td", {}, fmt(gpuh, 4))));
    }
    panel.append(bar, renderMinutes(account), wrapTable(table));
    if (account.straggler_s >= 0.1) panel.append(el("p", { class: "dim" }, "what-if: the other ranks waited " + fmt(account.straggler_s, 1) +
      " s for the slowest rank's compute (inside collective wait)"));
  }

  function renderMinutes(account) {  // over the run's time: one column per bucket, stacked by category
    const minutes = account.minutes;
    const strip = el("div", { class: "goodput-minutes", id: "goodput-minutes" });
    if (!minutes || !minutes.buckets.length) return strip;
    const size = minutes.bucket_s;
    const each = size >= 60 ? fmt(size / 60, 0) + " min" : fmt(size, 0) + " s";
    minutes.buckets.forEach((bucket, i) => {
      const column = el("div", { class: "gp-column", data: { bucket: i },
        title: "from " + duration(i * size) + ": " + Object.entries(bucket).map(([k, v]) => (account.labels[k] || k) + " " + fmt(v, 1) + " s").join(", ") });
      for (const name of Object.keys(account.labels)) {
        const seconds = bucket[name] || 0;
        if (seconds <= 0) continue;
        const part = el("span", { class: "gp-" + name, data: { category: name } });
        part.style.height = Math.min(100, 100 * seconds / size) + "%";
        column.append(part);
      }
      strip.append(column);
    });
    return el("div", {}, strip, el("p", { class: "dim" }, "over the run's time, a column every " + each + ", from its start"));
  }

  function renderAttempts(snap, panel) {
    clear(panel).append(el("h2", {}, "attempts and replacements"));
    const list = el("ul", { id: "attempts-list" });
    for (const a of snap.attempts) {
      list.append(el("li", {}, "attempt " + a.attempt + " " + a.state + (a.from_step !== null && a.from_step !== undefined ? " from step " + a.from_step : "") +
        (a.ended_by ? ": " + a.ended_by : "") + (a.started_at ? " (" + a.started_at.slice(11, 19) + "–" + (a.finished_at || "").slice(11, 19) + ")" : "")));
      if (a.resize) list.append(el("li", { class: "warn" }, resizeText(a.resize)));
      for (const r of a.replacements || []) list.append(el("li", { class: "warn" }, r.by + " in the place of " + r.host + " (" + r.why + ")"));
    }
    list.append(el("li", {}, "attempt " + snap.run.attempt + " " + snap.run.state + " (now)"));
    if (snap.resize) list.append(el("li", { class: "warn", id: "resize" }, resizeText(snap.resize)));
    for (const r of snap.replacements) list.append(el("li", { class: "warn" }, r.by + " in the place of " + r.host + " (" + r.why + ")"));
    if (snap.recovery) list.append(el("li", {}, "stood still " + fmt(snap.recovery.stood_still_s, 1) + " s" +
      (snap.recovery.steps_redone !== null ? ", " + snap.recovery.steps_redone + " step(s) done again" : "") +
      (snap.recovery.tok_s_before != null && snap.recovery.tok_s_after != null ?
        ", " + fmt(snap.recovery.tok_s_before, 0) + " -> " + fmt(snap.recovery.tok_s_after, 0) + " tok/s" : "")));
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
    const command = (plan.command || []).join(" ");
    const facts = [["world size", (plan.world_size ?? "set on the nodes") + " (" + plan.num_nodes + " node(s) × " + plan.nproc_per_node + " per node)"],
                   ["master", plan.master], ["command", command || "-"], ["run directory on the nodes", plan.run_dir_on_nodes]];
    if ((plan.secrets || []).length) facts.push(["secrets", plan.secrets.join(", ")]);
    panel.append(wrapTable(el("table", { id: "plan-run", class: "facts" },
      facts.map(([name, value]) => el("tr", {}, el("th", {}, name), el("td", { class: "long" }, value))))));
    // each node's global ranks, when every node's nproc is a number (else "gpu"/"auto": known on the node)
    const counts = plan.nodes.map((n) => Number(n.nproc));
    let first = 0;
    const ranks = counts.every((c) => Number.isInteger(c) && c > 0) ?
      counts.map((c) => { const text = c === 1 ? String(first) : first + "–" + (first + c - 1); first += c; return text; }) : null;
    panel.append(el("h3", {}, "nodes"), wrapTable(el("table", { id: "plan-nodes" },
      el("tr", {}, ["node", "host", "address", "ranks", "nproc"].map((h) => el("th", {}, h))),
      plan.nodes.map((n, i) => el("tr", { data: { node: n.node_rank } }, [n.node_rank, n.host, n.address, ranks ? ranks[i] : "-",
                                                                            n.nproc].map((c) => el("td", {}, c)))))));
    const env = Object.entries(plan.env || {});
    panel.append(el("h3", {}, "env"), env.length ? wrapTable(el("table", { id: "plan-env", class: "facts" },
      env.map(([name, value]) => el("tr", {}, el("th", {}, name), el("td", { class: "long" }, value))))) :
      el("p", { class: "dim", id: "plan-env" }, "no variables set by the profile"));
    panel.append(el("details", { id: "plan-raw" }, el("summary", {}, "the plan as JSON"),
                    el("pre", { id: "plan-json" }, JSON.stringify(plan, null, 1))));
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
    if (q("#chart-loss")) {  // a report of several runs has no charts by step per run: they are overlaid above
      drawSpeed(charts.train, q("#chart-speed"), q("#chart-loss"));  // first: the loss chart takes the row when alone
      const loss = charts.train.loss, val = charts.val;
      const lx = union([loss.x, val.x]);
      chart(q("#chart-loss"), { height: 220, scales: { x: { time: false } },
        series: [{ label: "step" }, { label: "loss", stroke: "#6ea8fe" }, { label: "val loss", stroke: "#d9a441", points: { show: true } }] },
        [lx, along(lx, loss), along(lx, val)]);
    }
    drawHeat(charts.heat, snap, q("#heat"));
    drawGpus(charts, snap, q("#gpus"));
  }

  function drawSpeed(train, panel, lossPanel) {
    // tokens/s and MFU, or (a program that logs neither) no empty chart: one line under the loss's title says so
    const tps = train.tokens_per_s, mfu = train.mfu;
    const logged = [...tps.y, ...mfu.y].some((v) => v !== null);
    const wasHidden = panel.hidden;
    panel.hidden = !logged;
    const why = lossPanel.querySelector("#no-speed");
    if (!logged && tps.x.length && !why) lossPanel.querySelector("h2").after(el("p", { class: "dim", id: "no-speed" }, "this program logs no tokens/s or MFU"));
    if (logged && why) why.remove();
    const lossChart = lossPanel.fsdpctlChart;  // the row's width changed hands: the loss chart follows it
    if (lossChart && wasHidden !== panel.hidden) lossChart.setSize({ width: Math.max(320, lossPanel.clientWidth - 24), height: 220 });
    if (!logged) return;
    chart(panel, { height: 220, scales: { x: { time: false } },
      axes: [{}, { label: "tokens/s" }, { side: 1, scale: "mfu", label: "MFU" }],
      series: [{ label: "step" }, { label: "tokens/s", stroke: "#5fb36b" }, { label: "MFU", scale: "mfu", stroke: "#c678dd" }] },
      [tps.x, tps.y, along(tps.x, mfu)]);
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
    canvas.hidden = !cols || !ranks.length;  // an empty canvas is a blank box 150/300 of the panel's width high
    if (canvas.hidden) return;
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

  // A run's page brings the curves by time of its first nodes and the straggler's; every other node's come
  // from /api/runs/<id>/nodes/<n> once its box scrolls into view (and again with each update while in view).
  function drawGpus(charts, snap, panel) {
    const byNode = new Map(), ranksOf = new Map(), hostOf = new Map();
    const add = (map, node, item) => { if (!map.has(node)) map.set(node, []); map.get(node).push(item); };
    for (const g of charts.gpus) { add(byNode, g.node, g); hostOf.set(g.node, g.host); }
    for (const r of charts.rank_time) { add(ranksOf, r.node, r); if (!hostOf.has(r.node)) hostOf.set(r.node, r.host); }
    for (const n of charts.nodes || []) if (!hostOf.has(n.node)) hostOf.set(n.node, n.host);
    const keys = [...hostOf.keys()].sort((a, b) => (a ?? -1) - (b ?? -1));
    if (!keys.length) { if (!panel.querySelector(".dim")) panel.append(el("p", { class: "dim" }, "no GPU samples and no per-rank timings yet")); return; }
    const sync = uPlot.sync("gpus");
    for (const node of keys) {
      const key = node + " " + hostOf.get(node);
      let box = panel.querySelector('[data-node-key="' + CSS.escape(key) + '"]');
      if (!box) { box = el("div", { class: "node-charts", data: { nodeKey: key, node: String(node) } }, el("h3", {}, "node " + node + " (" + (hostOf.get(node) ?? "") + ")"),
                           el("div", { class: "gpu-chart" }), el("div", { class: "compute-chart" })); panel.append(box); }
      if (byNode.has(node) || ranksOf.has(node)) { box.dataset.loaded = "page"; drawNode(box, byNode.get(node) || [], ranksOf.get(node) || [], snap, sync); }
      else if (!report) laterNode(box, node, snap, sync);
    }
  }

  function laterNode(box, node, snap, sync) {
    box.fsdpctlDraw = async () => {
      const answer = await fetch("/api/runs/" + encodeURIComponent(snap.run.run_id) + "/nodes/" + node);
      if (answer.status !== 200) return;
      const data = await answer.json();
      const owner = new Map(snap.ranks.map((r) => [r.rank, r]));
      for (const entry of data.rank_time) {
        const known = owner.get(entry.rank);
        if (known && (entry.node === null || entry.node === undefined)) { entry.node = known.node_rank; entry.host = known.host; }
      }
      box.dataset.loaded = "asked";
      drawNode(box, data.gpus, data.rank_time, snap, sync);
    };
    if (!state.nodeObserver) {
      state.nodeObserver = new IntersectionObserver((entries) => {
        for (const entry of entries) {
          entry.target.dataset.inView = entry.isIntersecting ? "1" : "";
          if (entry.isIntersecting && !entry.target.dataset.loaded && entry.target.fsdpctlDraw) entry.target.fsdpctlDraw();
        }
      }, { rootMargin: "200px" });
    }
    if (!box.dataset.observed) { box.dataset.observed = "1"; state.nodeObserver.observe(box); }
    else if (box.dataset.inView && box.dataset.loaded === "asked") box.fsdpctlDraw();  // an update: its curves again
  }

  function drawNode(box, gpus, ranks, snap, sync) {
    if (gpus.length) {
      const x = gpus[0].sm_mhz.x;
      const slowed = gpus.map((g) => g.sm_mhz.y.map((v, i) => (g.slowed.y[i] > 0 ? v : null)));
      const series = [timeSeries(), ...gpus.map((g) => ({ label: "GPU " + g.gpu + " SM MHz", stroke: "#6ea8fe" })),
                      ...gpus.map((g) => ({ label: "GPU " + g.gpu + " slowed", stroke: "#e0555f", width: 0, points: { show: true, size: 7, fill: "#e0555f" } }))];
      box.querySelector(".gpu-chart").dataset.slowed = String(slowed.flat().filter((v) => v !== null).length);
      chart(box.querySelector(".gpu-chart"), { height: 160, cursor: { sync: { key: sync.key } }, axes: [timeAxis(), {}], series },
            [x, ...gpus.map((g) => g.sm_mhz.y), ...slowed]);
    }
    if (ranks.length) {
      const x = ranks[0].x;
      chart(box.querySelector(".compute-chart"), { height: 140, cursor: { sync: { key: sync.key } }, axes: [timeAxis(), {}],
        series: [timeSeries(), ...ranks.map((r) => ({ label: "rank " + r.rank + " compute s", stroke: r.rank === (snap.straggler || {}).rank ? "#e0555f" : "#5fb36b" }))] },
        [x, ...ranks.map((r) => along(x, r))]);
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
    main.append(el("div", { class: "panel" }, el("h2", {}, "hosts of " + profile), wrapTable(table)));
  }

  // ---- a report file: the same pages from data in the file, no server -------------------------------
  function showReport() {
    const parsed = JSON.parse(report.textContent);
    const runs = parsed.runs;
    document.getElementById("connection").textContent = "report of " + runs.length + " run(s), written " + (parsed.written || "");
    const main = document.getElementById("main");
    const compared = runs.length > 1;
    if (compared) compareRuns(runs, main);
    for (const data of runs) {  // one under another, each the width of the page: its tables are not squeezed
      const part = el("div", { class: "panel report-run", data: { run: data.snapshot.run.run_id } });
      main.append(part);
      runSkeleton(part, data.snapshot.run.run_id, compared);
      for (const id of ["chart-loss", "chart-speed", "heat", "gpus", "nodes", "attempts", "goodput", "log-panel", "plan", "summary"]) {
        const node = part.querySelector("#" + id);
        if (node) node.dataset.in = data.snapshot.run.run_id;
      }
      renderRun(data, true, part);
      // its table of ranks, written into the file as escaped HTML, under its summary
      const ranks = [...document.querySelectorAll("#ranks-tables > .ranks-panel")].find((p) => p.dataset.run === data.snapshot.run.run_id);
      if (ranks) part.querySelector("#summary").after(ranks);
    }
  }

  // ---- several runs of a report compared: their figures in a table, their curves overlaid on one chart each
  const RUN_COLOURS = ["#6ea8fe", "#d9a441", "#5fb36b", "#c678dd", "#e0555f", "#56b6c2", "#e5c07b", "#b0b8c4"];

  function compareRuns(runs, main) {
    const panel = el("div", { class: "panel", id: "compare" }, el("h2", {}, "the runs compared"));
    main.append(panel);
    const table = el("table", { id: "compare-table" }, el("tr", {}, ["run", "state", "nodes", "world size", "duration", "step",
      "loss", "val loss", "tokens/s", "MFU", "command"].map((h) => el("th", {}, h))));
    runs.forEach((data, i) => {
      const run = data.snapshot.run, plan = data.plan;
      const name = el("td", {}, run.run_id);
      name.style.color = RUN_COLOURS[i % RUN_COLOURS.length];  // the colour of its curves
      table.append(el("tr", { data: { run: run.run_id } }, name, el("td", {}, stateText(run.state)),
        [plan.num_nodes, plan.world_size ?? "-", duration(run.elapsed_s), run.step ?? "-", fmt(run.loss, 4), fmt(run.val_loss, 4),
         int(run.tokens_per_s), run.mfu !== null && run.mfu !== undefined ? fmt(100 * run.mfu, 1) + "%" : "-"].map((c) => el("td", {}, c)),
        el("td", { class: "long" }, (plan.command || []).join(" "))));
    });
    panel.append(wrapTable(table));
    if (typeof uPlot === "undefined") return;
    const logs = (key) => runs.some((d) => d.charts.train[key].y.some((v) => v !== null));
    const figures = [["compare-loss", "loss of every run", (c) => c.train.loss, true]];
    if (logs("tokens_per_s")) figures.push(["compare-tokens", "tokens/s of every run", (c) => c.train.tokens_per_s, false]);
    if (logs("mfu")) figures.push(["compare-mfu", "MFU of every run", (c) => c.train.mfu, false]);
    const row = el("div", { class: "row" }, figures.map(([id, title]) => section(id, title)));
    panel.append(row);
    if (figures.length === 1) row.firstChild.append(el("p", { class: "dim", id: "no-speed" }, "no run here logs tokens/s or MFU"));
    for (const [id, , pick, withVal] of figures) overlay(panel.querySelector("#" + id), runs, pick, withVal);
  }

  function overlay(container, runs, pick, withVal) {
    // one series per run (and its validation loss, dashed, where it has one), on the steps of them all
    const curves = [];
    runs.forEach((data, i) => {
      const colour = RUN_COLOURS[i % RUN_COLOURS.length], id = data.snapshot.run.run_id;
      curves.push([{ label: id, stroke: colour, spanGaps: true }, pick(data.charts)]);
      if (withVal && data.charts.val.y.some((v) => v !== null))
        curves.push([{ label: id + " val", stroke: colour, dash: [6, 4], spanGaps: true, points: { show: true } }, data.charts.val]);
    });
    const x = union(curves.map(([, points]) => points.x));
    container.dataset.series = String(curves.length);
    chart(container, { height: 260, scales: { x: { time: false } }, series: [{ label: "step" }, ...curves.map(([series]) => series)] },
          [x, ...curves.map(([, points]) => along(x, points))]);
  }

  if (report) showReport();
  else route();
})();
