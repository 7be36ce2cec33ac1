// gatehouse operator console. Plain script, no library, no build step.
// Every value from the gateway is put in the page with textContent (never parsed as HTML),
// so a label or a tool name of `<script>` shows as text. The admin token lives in
// sessionStorage (this tab only) and travels as a bearer header: no cookie, so no CSRF.
"use strict";

(function () {
  const TOKEN_KEY = "gatehouse.admin_token";
  const POLL_MS = 2000;
  const AUDIT_LIMIT = 50;
  const AUDIT_MAX_BYTES = 262144;
  const COLORS = ["#1f6feb", "#e36209", "#1a7f37", "#8250df", "#cf222e", "#0598bc", "#bf8700", "#57606a"];

  const $ = (id) => document.getElementById(id);
  let timer = null;
  let polling = false;
  let pendingRelease = null; // the registration id whose release awaits confirmation
  let lastStats = null;

  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  // The plots: canvas id, title, what it covers, and its legend's id (if it has one).
  const PLOTS = [
    ["plot-agents-calls", "Calls per second, per agent", "last 15 min", "legend-agents"],
    ["plot-agents-errors", "Error rate, per agent", "% of calls, 10 s window", null],
    ["plot-upstreams-calls", "Calls per second, per upstream", "last 15 min", "legend-upstreams"],
    ["plot-upstreams-errors", "Error rate, per upstream", "% of calls, 10 s window", null],
    ["plot-refusals", "Refused requests per second, per reason", "last 15 min, both listeners", "legend-refusals"],
  ];
  for (const [id, title, covers, legendId] of PLOTS) {
    const heading = el("h2", title + " ");
    heading.append(el("span", covers, "muted"));
    const canvas = el("canvas", null, "plot");
    Object.assign(canvas, { id, width: 560, height: 150 });
    canvas.dataset.total = "0";
    const card = el("div", null, "card");
    card.append(heading, canvas);
    if (legendId) {
      const legend = el("ul", null, "legend");
      legend.id = legendId;
      card.append(legend);
    }
    $("plots").append(card);
  }

  function setStatus(text) {
    $("status").textContent = text;
  }

  function showLogin(message) {
    if (timer) clearTimeout(timer);
    timer = null;
    $("console").classList.add("hidden");
    $("signout").classList.add("hidden");
    $("login").classList.remove("hidden");
    // Nothing of the last session stays in the page.
    for (const id of ["approvals", "registrations", "tools", "upstreams", "audit"]) {
      $(id).tBodies[0].replaceChildren();
    }
    for (const id of ["legend-agents", "legend-upstreams"]) $(id).replaceChildren();
    for (const c of document.querySelectorAll("canvas.plot")) {
      c.getContext("2d").clearRect(0, 0, c.width, c.height);
      c.dataset.total = "0";
    }
    $("verify").textContent = "…";
    $("verify-detail").textContent = "";
    const err = $("login-error");
    if (message) {
      err.textContent = message;
      err.classList.remove("hidden");
    } else {
      err.textContent = "";
      err.classList.add("hidden");
    }
    setStatus("signed out");
    $("token").focus();
  }

  function showConsole() {
    $("login").classList.add("hidden");
    $("console").classList.remove("hidden");
    $("signout").classList.remove("hidden");
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    lastStats = null;
    showLogin(message);
  }

  class Refused extends Error {}

  async function api(path, method, body) {
    const t = token();
    if (!t) throw new Refused("no token");
    const headers = { Authorization: "Bearer " + t, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const resp = await fetch(path, {
      method: method || "GET",
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
    if (resp.status === 401) throw new Refused("the admin token was refused");
    return resp;
  }

  async function json(path) {
    const resp = await api(path);
    const body = await resp.json();
    if (!resp.ok) throw new Error(path + ": " + (body && body.error ? body.error : resp.status));
    return body;
  }

  function auditQuery() {
    const p = new URLSearchParams();
    const agent = $("f-agent").value.trim();
    const tool = $("f-tool").value.trim();
    const outcome = $("f-outcome").value;
    const trace = $("f-trace").value.trim();
    if (agent) p.set("agent_id", agent);
    if (trace) p.set("trace_id", trace);
    if (tool) p.set("tool", tool);
    if (outcome) p.set("outcome", outcome);
    p.set("limit", String(AUDIT_LIMIT));
    p.set("max_bytes", String(AUDIT_MAX_BYTES));
    return "/v1/audit?" + p.toString();
  }

  async function poll() {
    if (polling || !token()) return;
    polling = true;
    try {
      const [stats, audit, approvals] = await Promise.all([
        json("/v1/console/stats"),
        json(auditQuery()),
        json("/v1/approvals"),
      ]);
      showConsole();
      lastStats = stats;
      render(stats, audit);
      renderApprovals(approvals.approvals || []);
      setStatus("live · updated " + new Date().toLocaleTimeString());
    } catch (e) {
      if (e instanceof Refused) {
        polling = false;
        signOut(e.message === "no token" ? "" : "The admin token was refused.");
        return;
      }
      setStatus("error: " + e.message);
    } finally {
      polling = false;
    }
    if (timer) clearTimeout(timer);
    timer = setTimeout(poll, POLL_MS);
  }

  function fmtTtl(s) {
    if (s === null || s === undefined) return "none";
    if (s >= 3600) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    if (s >= 60) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return s + " s";
  }

  function fmtMs(v) {
    if (v === null || v === undefined) return "—";
    return v < 1 ? v.toFixed(3) : v < 100 ? v.toFixed(2) : v.toFixed(0);
  }

  function cell(tr, text, cls) {
    const td = el("td", text, cls);
    if (text !== undefined && text !== null) td.title = String(text);
    tr.appendChild(td);
    return td;
  }

  function render(stats, audit) {
    renderRegistrations(stats);
    const series = stats.series || { agents: [], upstreams: [], tools: [], window_s: 900 };
    plot($("plot-agents-calls"), series.agents, "calls");
    plot($("plot-agents-errors"), series.agents, "errors");
    plot($("plot-upstreams-calls"), series.upstreams, "calls");
    plot($("plot-upstreams-errors"), series.upstreams, "errors");
    legend($("legend-agents"), series.agents);
    legend($("legend-upstreams"), series.upstreams);
    // Refusals (wrong or missing tokens, released ids, bad requests…) beside the call rates.
    const refusals = stats.refusals || [];
    plot($("plot-refusals"), refusals, "calls");
    $("legend-refusals").replaceChildren(
      ...refusals.slice(0, COLORS.length).map((k, i) => {
        const li = el("li", k.key + " — " + k.calls_total + " refused", "c" + i);
        li.dataset.key = k.key;
        return li;
      }),
    );
    renderTools(series.tools || []);
    renderUpstreams(stats.upstreams || []);
    renderAudit(audit);
  }

  // Registrations as a tree: each child right under its parent, indented by its depth (a
  // child whose parent is not among the rows shown stands at the top level).
  function asTree(regs) {
    const byParent = new Map();
    const ids = new Set(regs.map((r) => r.id));
    for (const r of regs) {
      const p = r.parent && ids.has(r.parent) ? r.parent : null;
      if (!byParent.has(p)) byParent.set(p, []);
      byParent.get(p).push(r);
    }
    const out = [];
    const walk = (p, depth) => {
      for (const r of byParent.get(p) || []) {
        out.push([r, depth]);
        if (depth < 16) walk(r.id, depth + 1);
      }
    };
    walk(null, 0);
    return out;
  }

  function renderRegistrations(stats) {
    const body = $("registrations").tBodies[0];
    const rows = [];
    for (const [r, depth] of asTree(stats.registrations)) {
      const tr = el("tr");
      tr.dataset.id = r.id;
      if (r.parent) tr.dataset.parent = r.parent;
      tr.dataset.depth = String(depth);
      cell(tr, (depth ? "\u00a0\u00a0".repeat(depth) + "\u21b3 " : "") + r.id, "mono reg-id");
      cell(tr, r.agent_id, "agent");
      cell(tr, r.label === null ? "" : r.label, "label");
      cell(tr, fmtTtl(r.ttl_left_s), "num");
      cell(tr, r.sessions, "num");
      cell(tr, r.calls_in_flight, "num");
      cell(tr, r.calls_started, "num");
      const actions = el("td");
      if (pendingRelease === r.id) {
        const yes = el("button", "Confirm release", "confirm");
        yes.type = "button";
        yes.dataset.action = "confirm-release";
        yes.addEventListener("click", () => release(r.id));
        const no = el("button", "Cancel");
        no.type = "button";
        no.dataset.action = "cancel-release";
        no.addEventListener("click", () => {
          pendingRelease = null;
          if (lastStats) renderRegistrations(lastStats);
        });
        actions.append(yes, " ", no);
      } else {
        const b = el("button", "Release", "danger");
        b.type = "button";
        b.dataset.action = "release";
        b.addEventListener("click", () => {
          pendingRelease = r.id;
          if (lastStats) renderRegistrations(lastStats);
        });
        actions.appendChild(b);
      }
      tr.appendChild(actions);
      rows.push(tr);
    }
    body.replaceChildren(...rows);
    const shown = stats.registrations.length;
    $("reg-count").textContent =
      shown < stats.registrations_total ? shown + " newest of " + stats.registrations_total : String(stats.registrations_total);
  }

  async function release(id) {
    try {
      const resp = await api("/v1/registrations/" + encodeURIComponent(id), "DELETE");
      if (resp.status !== 204 && resp.status !== 404) throw new Error("release: " + resp.status);
      pendingRelease = null;
      if (lastStats) {
        lastStats.registrations = lastStats.registrations.filter((r) => r.id !== id);
        lastStats.registrations_total = Math.max(0, lastStats.registrations_total - 1);
        renderRegistrations(lastStats);
      }
      setStatus("released " + id);
    } catch (e) {
      if (e instanceof Refused) return signOut("The admin token was refused.");
      setStatus("error: " + e.message);
    }
  }

  // Calls held for approval (issue 49): their arguments as the daemon shows them
  // (`redact_keys` applied), as text; a decision is one POST, by "admin".
  // A row stays as it is while its approval waits (no re-render under the operator's click).
  function renderApprovals(list) {
    const body = $("approvals").tBodies[0];
    const kept = new Map([...body.rows].map((tr) => [tr.dataset.approval, tr]));
    const rows = list.map((a) => {
      if (kept.has(a.id)) return kept.get(a.id);
      const tr = el("tr");
      tr.dataset.approval = a.id;
      cell(tr, a.id, "mono approval-id");
      cell(tr, a.agent_id, "agent");
      cell(tr, a.tool, "mono tool");
      cell(tr, a.rule + (a.approver === "client" ? " (the client's user decides)" : ""), "rule");
      cell(tr, JSON.stringify(a.arguments), "mono arguments");
      cell(tr, a.expires_at, "expires");
      const actions = el("td");
      if (a.approver !== "client") {
        for (const [label, decision, cls] of [["Approve", "approve", "approve"], ["Deny", "deny", "danger"]]) {
          const b = el("button", label, cls);
          b.type = "button";
          b.dataset.action = decision;
          b.addEventListener("click", () => decide(a.id, decision, tr));
          actions.append(b, " ");
        }
      }
      tr.appendChild(actions);
      return tr;
    });
    if (rows.length !== body.rows.length || rows.some((tr, i) => body.rows[i] !== tr)) {
      body.replaceChildren(...rows);
    }
    $("approval-count").textContent = String(list.length);
  }

  async function decide(id, decision, tr) {
    try {
      const resp = await api("/v1/approvals/" + encodeURIComponent(id), "POST", { decision, by: "admin" });
      const body = await resp.json().catch(() => null);
      if (!resp.ok) throw new Error(decision + ": " + (body && body.error ? body.error : resp.status));
      tr.remove();
      setStatus((decision === "approve" ? "approved " : "denied ") + id);
    } catch (e) {
      if (e instanceof Refused) return signOut("The admin token was refused.");
      setStatus("error: " + e.message);
    }
  }

  // Error rate over a trailing 10 s: errors / calls, in percent (null where no call).
  function errorRate(s) {
    const out = new Array(s.calls.length).fill(null);
    let c = 0;
    let e = 0;
    for (let i = 0; i < s.calls.length; i++) {
      c += s.calls[i];
      e += s.errors[i];
      if (i >= 10) {
        c -= s.calls[i - 10];
        e -= s.errors[i - 10];
      }
      out[i] = c > 0 ? (100 * e) / c : null;
    }
    return out;
  }

  function plot(canvas, keys, what) {
    const dpr = window.devicePixelRatio || 1;
    const cssW = canvas.clientWidth || canvas.width;
    const cssH = canvas.clientHeight || canvas.height;
    if (canvas.width !== Math.round(cssW * dpr)) canvas.width = Math.round(cssW * dpr);
    if (canvas.height !== Math.round(cssH * dpr)) canvas.height = Math.round(cssH * dpr);
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, cssW, cssH);
    const shown = keys.slice(0, COLORS.length);
    const lines = shown.map((k) => (what === "calls" ? k.calls : errorRate(k)));
    let max = what === "calls" ? 1 : 100;
    if (what === "calls") for (const l of lines) for (const v of l) if (v > max) max = v;
    const left = 34;
    const bottom = 16;
    const w = cssW - left - 4;
    const h = cssH - bottom - 6;
    // Axes and labels.
    g.strokeStyle = "#d0d7de";
    g.fillStyle = "#656d76";
    g.font = "10px system-ui, sans-serif";
    g.lineWidth = 1;
    for (const f of [0, 0.5, 1]) {
      const y = 6 + h - f * h;
      g.beginPath();
      g.moveTo(left, y + 0.5);
      g.lineTo(left + w, y + 0.5);
      g.stroke();
      const v = f * max;
      g.fillText(what === "calls" ? (v >= 10 ? v.toFixed(0) : v.toFixed(1)) : v.toFixed(0) + "%", 2, y + 3);
    }
    g.fillText("−15 min", left, cssH - 3);
    g.fillText("now", left + w - 18, cssH - 3);
    let total = 0;
    lines.forEach((l, i) => {
      g.strokeStyle = COLORS[i];
      g.lineWidth = 1.5;
      g.beginPath();
      let pen = false;
      const n = l.length;
      for (let j = 0; j < n; j++) {
        const v = l[j];
        if (v === null) {
          pen = false;
          continue;
        }
        const x = left + (w * j) / Math.max(1, n - 1);
        const y = 6 + h - (Math.min(v, max) / max) * h;
        if (pen) g.lineTo(x, y);
        else g.moveTo(x, y);
        pen = true;
      }
      g.stroke();
    });
    for (const k of keys) total += what === "calls" ? k.calls_total : k.errors_total;
    canvas.dataset.total = String(total);
    canvas.dataset.keys = String(keys.length);
  }

  function legend(ul, keys) {
    const items = keys.slice(0, COLORS.length).map((k, i) => {
      const li = el("li", k.key + " — " + k.calls_total + " calls, " + k.errors_total + " errors", "c" + i);
      li.dataset.key = k.key;
      return li;
    });
    ul.replaceChildren(...items);
  }

  function renderTools(tools) {
    const rows = tools.map((t) => {
      const tr = el("tr");
      tr.dataset.tool = t.tool;
      cell(tr, t.tool, "mono");
      cell(tr, t.calls, "num");
      cell(tr, fmtMs(t.p50_ms), "num");
      cell(tr, fmtMs(t.p99_ms), "num");
      return tr;
    });
    $("tools").tBodies[0].replaceChildren(...rows);
  }

  function renderUpstreams(ups) {
    const rows = ups.map((u) => {
      const tr = el("tr");
      tr.dataset.upstream = u.id;
      const conns = u.connections || [];
      cell(tr, u.id, "mono");
      cell(tr, u.sharing);
      cell(tr, conns.length, "num");
      cell(tr, conns.map((c) => c.epoch).join(", ") || "—");
      cell(tr, conns.reduce((a, c) => a + c.in_flight, 0), "num");
      cell(tr, u.restarts, "num");
      const last = u.last_error;
      cell(tr, last ? last.at + " " + last.what + (last.reason ? ": " + last.reason : "") : "—", last ? "error" : "");
      return tr;
    });
    $("upstreams").tBodies[0].replaceChildren(...rows);
  }

  function renderAudit(audit) {
    const v = audit.verify;
    const badge = $("verify");
    badge.className = "badge " + v.state;
    badge.textContent =
      v.state === "ok" ? "chain verified" : v.state === "broken" ? "chain broken" : "no records";
    let detail = "";
    if (v.records > 0) {
      detail = "window seq " + v.first_seq + "–" + v.last_seq + " (" + v.records + " records, " +
        Math.ceil(v.bytes / 1024) + " KiB" + (v.from_start ? ", from the chain's start" : "") + ")";
      if (v.head_seq !== null && v.head_seq !== undefined) {
        detail += "; head seq " + v.head_seq +
          (v.head_matches === true ? " matches" : v.head_matches === false ? " does not match" : " is older than the window");
      }
    }
    if (v.problem) detail += (detail ? "; " : "") + v.problem;
    $("verify-detail").textContent = detail;
    const rows = audit.records.map((r) => {
      const tr = el("tr");
      const bad = r.outcome && r.outcome !== "ok";
      tr.className = r.outcome ? (bad ? "outcome-bad" : "outcome-ok") : "";
      tr.dataset.seq = String(r.seq);
      cell(tr, r.seq, "num");
      cell(tr, r.ts);
      cell(tr, r.event);
      cell(tr, r.agent_id === undefined ? "" : r.agent_id, "agent");
      cell(tr, r.label === undefined ? "" : r.label, "label");
      cell(tr, r.tool === undefined ? "" : r.tool, "mono tool");
      cell(tr, r.outcome === undefined ? "" : r.outcome, "outcome");
      cell(tr, r.duration_ms === undefined ? "" : fmtMs(r.duration_ms), "num");
      cell(tr, r.reason === undefined ? "" : r.reason, "reason");
      cell(tr, r.trace_id === undefined ? "" : r.trace_id, "mono trace");
      return tr;
    });
    $("audit").tBodies[0].replaceChildren(...rows);
  }

  function start() {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const t = $("token").value.trim();
      $("token").value = "";
      if (!t) return;
      sessionStorage.setItem(TOKEN_KEY, t);
      setStatus("signing in…");
      poll();
    });
    $("signout").addEventListener("click", () => signOut(""));
    $("audit-filters").addEventListener("submit", (ev) => {
      ev.preventDefault();
      poll();
    });
    if (token()) {
      setStatus("connecting…");
      poll();
    } else {
      showLogin("");
    }
  }

  start();
})();
