// The console page: renders the server's document (GET /events, server-sent events) and counts
// heartbeat ages and expiry countdowns down between documents. Text goes in with textContent
// only, and class names come from fixed lists, so nothing read from Redis can become markup.
"use strict";

(function () {
  const STATES = ["alive", "flapping", "expired", "removed"];
  const SEVERITIES = ["CRITICAL", "WARNING", "INFO"];
  let doc = null;
  let offset = 0; // server clock minus ours: the countdowns use the server's time

  function $(id) { return document.getElementById(id); }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
    return tr;
  }

  function now() { return Date.now() + offset; }

  function duration(ms) {
    const neg = ms < 0;
    let s = Math.abs(ms) / 1000;
    let out;
    if (s < 60) out = s.toFixed(1) + " s";
    else if (s < 3600) out = Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s";
    else if (s < 86400) out = Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    else out = Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
    return (neg ? "-" : "") + out;
  }

  function ago(t) { return t ? duration(now() - t) + " ago" : "–"; }

  function clock(t) { return t ? new Date(t).toISOString().replace("T", " ").replace("Z", "") : "–"; }

  function pick(value, allowed, fallback) { return allowed.indexOf(value) >= 0 ? value : fallback; }

  function fill(id, emptyId, rows) {
    const body = $(id).tBodies[0];
    body.replaceChildren(...rows);
    $(emptyId).hidden = rows.length > 0;
  }

  // cells that change every tick: a heartbeat age, or a countdown to a deadline
  function ageCell(t) {
    const td = el("td", ago(t), "age");
    td.dataset.since = String(t || 0);
    return td;
  }

  function countdownCell(b) {
    const td = el("td", "", "countdown");
    if (b.state === "alive" || b.state === "flapping") {
      if (b.deadline) td.dataset.deadline = String(b.deadline);
    } else {
      td.textContent = b.state + " " + ago(b.since);
      td.dataset.gone = String(b.since || 0);
      td.dataset.word = b.state;
    }
    return td;
  }

  function tick() {
    for (const td of document.querySelectorAll("td[data-since]")) {
      td.textContent = ago(Number(td.dataset.since));
    }
    for (const td of document.querySelectorAll("td[data-deadline]")) {
      const left = Number(td.dataset.deadline) - now();
      td.textContent = left >= 0 ? duration(left) : "due " + duration(-left) + " ago";
      td.className = "countdown" + (left < 0 ? " overdue" : left < 3000 ? " soon" : "");
    }
    for (const td of document.querySelectorAll("td[data-gone]")) {
      td.textContent = td.dataset.word + " " + ago(Number(td.dataset.gone));
    }
    for (const dd of document.querySelectorAll("dd[data-since]")) {
      dd.textContent = ago(Number(dd.dataset.since));
    }
  }

  function renderSummary() {
    const box = $("summary");
    const parts = [];
    const states = doc.brokerStates || {};
    for (const s of STATES) {
      const span = el("span");
      span.appendChild(el("b", states[s] || 0, "state-" + s));
      span.appendChild(document.createTextNode(" " + s));
      parts.push(span);
    }
    const open = (doc.alerts && doc.alerts.open) || [];
    const critical = open.filter((a) => a.severity === "CRITICAL").length;
    const alerts = el("span");
    alerts.appendChild(el("b", open.length, critical ? "bad" : ""));
    alerts.appendChild(document.createTextNode(" open alerts" + (critical ? " (" + critical + " critical)" : "")));
    parts.push(alerts);
    box.replaceChildren(...parts);
  }

  function renderBrokers() {
    const rows = [];
    for (const cluster of doc.clusters || []) {
      for (const group of cluster.groups) {
        group.members.forEach((b, i) => {
          const state = pick(b.state, STATES, "expired");
          const stateCell = el("td", state + (b.flapping && state !== "flapping" ? " (flapping)" : ""),
            "state state-" + state);
          const tr = row([
            el("td", i === 0 ? cluster.name : ""),
            el("td", i === 0 ? group.name + (group.hasMaster ? "" : " · no master") : "",
              i === 0 && !group.hasMaster ? "bad" : ""),
            el("td", b.id === null ? "?" : b.id, "num"),
            el("td", b.role),
            el("td", b.addr),
            stateCell,
            ageCell(b.lastHeartbeat),
            countdownCell(b),
            el("td", b.timeoutMillis ? duration(b.timeoutMillis) : "–", "num"),
          ]);
          tr.className = "broker" + (i === 0 ? " group-start" : "");
          tr.dataset.addr = b.addr;
          tr.dataset.cluster = b.cluster;
          tr.dataset.group = group.name;
          tr.dataset.state = state;
          rows.push(tr);
        });
      }
    }
    fill("brokers", "no-brokers", rows);
  }

  function renderNodes() {
    const rows = (doc.nodes || []).map((n) => {
      const scan = n.localScan === null ? "unknown" : n.localScan ? "on (monitor not heard)" : "off (monitor decides)";
      const skew = (n.clockOffsetMillis >= 0 ? "+" : "") + duration(n.clockOffsetMillis) +
        (n.clockAhead ? " · AHEAD: events refused" : "");
      const tr = row([
        el("td", n.node),
        el("td", n.silent ? "silent" : "ticking", n.silent ? "bad" : "good"),
        ageCell(n.lastTick),
        el("td", scan, n.localScan ? "bad" : ""),
        el("td", skew, n.clockAhead ? "bad num" : "num"),
      ]);
      tr.className = "node";
      tr.dataset.node = n.node;
      return tr;
    });
    fill("nodes", "no-nodes", rows);
  }

  function renderMonitor() {
    const m = doc.monitor;
    const meta = doc.meta || {};
    const facts = [];
    function fact(label, value, cls, since) {
      facts.push(el("dt", label));
      const dd = el("dd", value, cls);
      if (since) dd.dataset.since = String(since);
      facts.push(dd);
    }
    if (!m) {
      fact("state", "no batch written yet (is the streaming job running?)", "bad");
    } else {
      fact("monitor", m.monitor);
      fact("last batch", "#" + m.batchId);
      fact("written", ago(m.batchAt), "", m.batchAt);
      fact("lag (event time behind clock)", m.lagMillis === null ? "no watermark yet" : duration(m.lagMillis),
        m.lagMillis !== null && m.lagMillis > 60000 ? "bad" : "");
      fact("watermark", clock(m.watermark));
      fact("batch duration", m.batchMillis === null ? "–" : duration(m.batchMillis));
      fact("batches / events / bad", m.batches + " / " + m.events + " / " + m.badEvents);
    }
    if (meta.updatedAt) fact("routes written", ago(meta.updatedAt), "", meta.updatedAt);
    $("monitor").replaceChildren(...facts);
  }

  function renderAlerts() {
    const open = ((doc.alerts && doc.alerts.open) || []).map((a) => row([
      el("td", a.severity, "sev-" + pick(a.severity, SEVERITIES, "INFO")),
      el("td", a.kind),
      el("td", a.subject),
      ageCell(a.eventTime),
      el("td", a.message, "message"),
    ]));
    fill("open-alerts", "no-open", open);
    const more = (doc.notRead || {})[Object.keys(doc.notRead || {}).find((k) => k.endsWith(":alerts")) || ""];
    $("open-count").textContent = "(" + open.length + (more ? " shown, " + more + " more" : "") + ")";
    const resolved = ((doc.alerts && doc.alerts.resolved) || []).map((a) => row([
      el("td", a.kind),
      el("td", a.subject),
      ageCell(a.eventTime),
      el("td", a.message, "message"),
    ]));
    fill("resolved-alerts", "no-resolved", resolved);
  }

  function renderProblems() {
    const lines = [];
    if (doc.redis && !doc.redis.ok) lines.push("Redis: " + doc.redis.error + " (showing the last data read)");
    if (doc.skipped) lines.push(doc.skipped + " malformed entr" + (doc.skipped === 1 ? "y" : "ies") +
      " left out: " + (doc.problems || []).join("; "));
    for (const [key, n] of Object.entries(doc.notRead || {})) lines.push(key + ": " + n + " more entries not shown");
    $("problems").textContent = lines.join("\n");
    $("problems").hidden = lines.length === 0;
  }

  function render() {
    renderSummary();
    renderBrokers();
    renderNodes();
    renderMonitor();
    renderAlerts();
    renderProblems();
    tick();
  }

  function connect() {
    const source = new EventSource("/events");
    source.onopen = () => { $("link").textContent = "live"; $("link").className = "link up"; };
    source.onerror = () => { $("link").textContent = "disconnected, retrying…"; $("link").className = "link down"; };
    source.onmessage = (event) => {
      let next;
      try { next = JSON.parse(event.data); } catch (e) { return; }
      offset = Number(next.now) - Date.now() || 0;
      doc = next;
      render();
    };
  }

  async function lookUp(topic) {
    $("route-note").textContent = "looking up…";
    $("route").textContent = "";
    $("matches").replaceChildren();
    let answer;
    try {
      const response = await fetch("/api/route?topic=" + encodeURIComponent(topic));
      answer = await response.json();
    } catch (e) {
      $("route-note").textContent = "lookup failed: " + e;
      return;
    }
    if (answer.error) { $("route-note").textContent = answer.error; return; }
    $("route-note").textContent = answer.found
      ? "Route of " + answer.topic + " as Redis holds it (what GET_ROUTEINFO_BY_TOPIC answers)" +
        (answer.note ? ": " + answer.note : "")
      : "No route for " + answer.topic + " in Redis" + (answer.matches.length ? "; topics containing it:" : ".");
    if (answer.route !== null) $("route").textContent = JSON.stringify(answer.route, null, 2);
    $("matches").replaceChildren(...answer.matches.filter((m) => m !== answer.topic).map((m) => {
      const b = el("button", m);
      b.type = "button";
      b.addEventListener("click", () => { $("topic").value = m; lookUp(m); });
      return b;
    }));
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("search").addEventListener("submit", (event) => {
      event.preventDefault();
      const topic = $("topic").value.trim();
      if (topic) lookUp(topic);
    });
    connect();
    setInterval(tick, 250);
  });
})();
