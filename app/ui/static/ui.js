/* poolgate operator page. The page itself carries no data: everything comes
 * from /internal/* with the admin token the operator typed, kept in this
 * tab's sessionStorage. Every value from the server goes in as text, never
 * as HTML. */
"use strict";

(function () {
  const TOKEN_KEY = "poolgate.adminToken";
  const WORKERS_EVERY_MS = 3000, SLOW_EVERY_MS = 15000, DAY_S = 86400;
  const HISTORY_EVERY_MS = 10 * 60 * 1000;
  // The page lives at <prefix>/internal/ui: the JSON is next to it.
  const ROOT = location.pathname.replace(/\/ui\/?$/, "");
  const $ = (id) => document.getElementById(id);

  let session = 0;          // bumped on sign-out: late answers of an old session are dropped
  let timers = [];
  let lastUsageRows = null;
  let pastUsage = null;       // usage rows before today: {today, at, rows}
  const workerRows = new Map();

  class Unauthorized extends Error {}

  function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

  function status(text) { $("status").textContent = text; }

  function show(node, text) {
    node.textContent = text || "";
    node.hidden = !text;
  }

  function errorText(answer, what) {
    const e = answer.body && answer.body.error;
    const message = e && (e.message || (typeof e === "string" ? e : ""));
    return `${what} failed (HTTP ${answer.status})` + (message ? `: ${message}` : ".");
  }

  /** fetch a /internal path with the token; a 401 signs out and throws. */
  async function api(path, options) {
    const mine = session;
    const opts = Object.assign({ cache: "no-store" }, options || {});
    opts.headers = Object.assign({ Authorization: "Bearer " + token() }, opts.headers || {});
    const resp = await fetch(ROOT + path, opts);
    let body = null;
    try { body = await resp.json(); } catch (_) { body = null; }
    if (mine !== session) throw new Unauthorized("stale");
    if (resp.status === 401) {
      signOut("The gateway refused this admin token (HTTP 401). Enter the token again.");
      throw new Unauthorized("refused");
    }
    return { status: resp.status, ok: resp.ok, body };
  }

  // ---- sign-in ---------------------------------------------------------

  function signOut(message) {
    session += 1;
    timers.forEach(clearInterval);
    timers = [];
    sessionStorage.removeItem(TOKEN_KEY);
    workerRows.clear();
    pastUsage = lastUsageRows = null;
    $("workers").tBodies[0].replaceChildren();
    $("accounts").tBodies[0].replaceChildren();
    $("accounts-panel").hidden = true;
    $("panels").hidden = true;
    $("sign-out").hidden = true;
    $("sign-in").hidden = false;
    show($("token-error"), message);
    status("");
    $("token").value = "";
    $("token").focus();
  }

  async function signIn() {
    $("sign-in").hidden = true;
    status("Connecting…");
    let answer;
    try {
      answer = await api("/workers");
    } catch (err) {
      if (!(err instanceof Unauthorized)) signOut("The gateway did not answer: " + err.message);
      return;
    }
    if (!answer.ok) {
      signOut(errorText(answer, "Reading /internal/workers"));
      return;
    }
    $("panels").hidden = false;
    $("sign-out").hidden = false;
    renderWorkers(answer.body.workers || []);
    refreshAccounts();
    refreshSlow();
    // a tab nobody looks at asks nothing; it catches up when shown again
    timers.push(setInterval(() => { if (!document.hidden) refreshWorkers(); },
                            WORKERS_EVERY_MS));
    timers.push(setInterval(() => { if (!document.hidden) refreshSlow(); }, SLOW_EVERY_MS));
  }

  /** Run a refresh; network trouble goes to the status line, 401 already signed out. */
  async function guarded(what, job) {
    try {
      await job();
    } catch (err) {
      if (!(err instanceof Unauthorized)) status(`${what}: ${err.message}`);
    }
  }

  // ---- workers ---------------------------------------------------------

  function refreshWorkers() {
    return guarded("Workers", async () => {
      const answer = await api("/workers");
      if (!answer.ok) { show($("workers-note"), errorText(answer, "Reading workers")); return; }
      show($("workers-note"), "");
      renderWorkers(answer.body.workers || []);
      await refreshAccounts();
    });
  }

  /** cli accounts and their quota; the panel shows only when there are some
   * (a gateway without cli workers, or without the endpoint, has none). */
  function refreshAccounts() {
    return guarded("Accounts", async () => {
      const answer = await api("/accounts");
      const accounts = answer.ok ? answer.body.accounts || [] : [];
      $("accounts-panel").hidden = answer.status === 404 || (answer.ok && !accounts.length);
      if (!answer.ok) { show($("accounts-note"), errorText(answer, "Reading accounts")); return; }
      show($("accounts-note"), "");
      window.AccountQuota.render($("accounts"), accounts, Date.now() / 1000);
    });
  }

  function cell(tr, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    tr.append(td);
    return td;
  }

  function button(label, className, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    b.className = className;
    b.addEventListener("click", onClick);
    return b;
  }

  /** One row per worker, built once and then updated in place, so a poll
   * never wipes a code the operator is typing or a button they are pressing. */
  function workerRow(name) {
    if (workerRows.has(name)) return workerRows.get(name);
    const tr = document.createElement("tr");
    tr.dataset.worker = name;
    const row = { tr, name };
    const classes = { models: "models", inFlight: "num", restarts: "num", login: "login" };
    const names = ["title", "kind", "models", "state", "inFlight", "restarts", "login", "actions"];
    for (const k of names) {
      row[k] = cell(tr, classes[k]);
    }
    row.title.textContent = name;
    row.badge = document.createElement("span");
    row.state.append(row.badge);
    const box = document.createElement("div");
    box.className = "actions";
    row.drain = button("Drain", "secondary", () => act(row, "drain"));
    row.resume = button("Resume", "secondary", () => act(row, "resume"));
    row.restart = button("Restart", "danger", () => armRestart(row));
    for (const b of [row.drain, row.resume, row.restart]) {
      b.dataset.action = b.textContent.toLowerCase();
    }
    box.append(row.drain, row.resume, row.restart);
    row.message = document.createElement("span");
    row.message.className = "row-msg";
    row.actions.append(box, row.message);
    workerRows.set(name, row);
    return row;
  }

  function renderWorkers(workers) {
    const body = $("workers").tBodies[0];
    for (const tr of [...body.rows]) if (!tr.dataset.worker) tr.remove();  // "no workers" line
    const seen = new Set();
    for (const w of workers) {
      const row = workerRow(w.name);
      seen.add(w.name);
      const flavour = w.engine || w.cli;  // a local worker's engine, a cli worker's CLI
      row.kind.textContent = w.kind + (flavour ? ` (${flavour})` : "");
      row.models.textContent = (w.models || []).join(", ");
      const state = w.crash_looping ? "crash_looping" : w.state;
      row.badge.className = "state " + state;
      row.badge.textContent = state.replaceAll("_", " ");
      row.tr.dataset.state = w.state;
      row.inFlight.textContent = w.in_flight + (w.capacity != null ? " / " + w.capacity : "");
      row.restarts.textContent = w.restarts ?? 0;
      row.loginParts = window.WorkerLogin.render(row.login, row.loginParts, w,
                                                 (code) => sendCode(w.name, code));
      if (!row.busy) {
        row.drain.disabled = w.state === "draining" || w.state === "stopped";
        row.resume.disabled = w.state !== "draining";
      }
      body.append(row.tr);  // keeps the server's order; moving a node keeps its state
    }
    const anyLogin = workers.some((w) => window.WorkerLogin.info(w) !== null);
    $("workers").classList.toggle("no-login", !anyLogin);
    for (const [name, row] of workerRows) {
      if (!seen.has(name)) { row.tr.remove(); workerRows.delete(name); }
    }
    if (!workers.length) {
      const tr = document.createElement("tr");
      const td = cell(tr, "empty");
      td.colSpan = 8;
      td.textContent = "No workers configured.";
      body.replaceChildren(tr);
    }
    status("Updated " + new Date().toLocaleTimeString());
  }

  async function act(row, action) {
    row.busy = true;
    for (const b of [row.drain, row.resume, row.restart]) b.disabled = true;
    row.message.textContent = "";
    await guarded("Worker " + action, async () => {
      const answer = await api(`/workers/${encodeURIComponent(row.name)}/${action}`,
                               { method: "POST" });
      if (!answer.ok) row.message.textContent = errorText(answer, action);
    });
    row.busy = false;
    row.restart.disabled = false;
    await refreshWorkers();
  }

  /** Restart interrupts the requests in flight: the first click arms, the second acts. */
  function armRestart(row) {
    if (row.restart.classList.contains("armed")) {
      row.restart.classList.remove("armed");
      row.restart.textContent = "Restart";
      act(row, "restart");
      return;
    }
    row.restart.classList.add("armed");
    row.restart.textContent = "Confirm restart";
    setTimeout(() => {
      row.restart.classList.remove("armed");
      row.restart.textContent = "Restart";
    }, 4000);
  }

  // ---- login (cli workers; drawn by login.js) ---------------------------

  /** POST a pasted login code; the line to show under the box. */
  async function sendCode(name, code) {
    let outcome = { ok: false, message: "" };
    await guarded("Login code", async () => {
      const answer = await api(`/workers/${encodeURIComponent(name)}/login/code`, {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ code }) });
      outcome = { ok: answer.ok,
                  message: answer.ok ? "Code sent." : errorText(answer, "Sending the code") };
    });
    refreshWorkers();
    return outcome;
  }

  // ---- usage and keys --------------------------------------------------

  function unavailable(note, path, answer) {
    const text = answer.status === 404
      ? `${path} is not available on this gateway (HTTP 404): this panel needs a poolgate `
        + "with the usage ledger and keys API."
      : errorText(answer, "Reading " + path);
    show(note, text);
  }

  const fmt = (n) => (n == null ? "—" : Number(n).toLocaleString());

  function fillTable(table, rows, columns, emptyText) {
    const body = table.tBodies[0];
    const trs = rows.map((r) => {
      const tr = document.createElement("tr");
      for (const [get, cls] of columns) cell(tr, cls).textContent = get(r);
      return tr;
    });
    if (!trs.length) {
      const tr = document.createElement("tr");
      const td = cell(tr, "empty");
      td.colSpan = columns.length;
      td.textContent = emptyText;
      trs.push(tr);
    }
    body.replaceChildren(...trs);
  }

  /** The 30 days before today change only when the day does: they are read
   * at sign-in and every HISTORY_EVERY_MS (a scan of a month of ledger rows),
   * and each poll reads today's rows alone. */
  function refreshUsage() {
    return guarded("Usage", async () => {
      const todayStart = Math.floor(Date.now() / 1000 / DAY_S) * DAY_S;
      const today = window.UsageChart.isoDay(new Date(todayStart * 1000));
      const whole = !pastUsage || pastUsage.today !== today
        || Date.now() - pastUsage.at > HISTORY_EVERY_MS;
      const since = whole ? todayStart - 29 * DAY_S : todayStart;
      const answer = await api(`/usage?since=${since}&group_by=key,model,day`);
      $("usage-body").hidden = !answer.ok;
      $("usage-metric").parentElement.hidden = !answer.ok;
      if (!answer.ok) { unavailable($("usage-note"), "/internal/usage", answer); return; }
      show($("usage-note"), "");
      const rows = answer.body.rows || [];
      if (whole) pastUsage = { today, at: Date.now(), rows: rows.filter((r) => r.day !== today) };
      lastUsageRows = pastUsage.rows.concat(rows.filter((r) => r.day === today));
      drawUsage();
    });
  }

  function drawUsage() {
    if (!lastUsageRows) return;
    const now = new Date();
    window.UsageChart.draw($("usage-chart"), $("usage-legend"), lastUsageRows,
                           { metric: $("usage-metric").value, days: 30, now });
    const today = window.UsageChart.isoDay(now);
    const rows = lastUsageRows.filter((r) => r.day === today)
      .sort((a, b) => a.key.localeCompare(b.key) || a.model.localeCompare(b.model));
    fillTable($("usage-today"), rows, [
      [(r) => r.key], [(r) => r.model], [(r) => fmt(r.requests), "num"],
      [(r) => fmt(r.input_tokens), "num"], [(r) => fmt(r.output_tokens), "num"],
      [(r) => fmt(r.cached_tokens), "num"], [(r) => fmt(r.errors), "num"],
    ], "No requests today.");
  }

  function refreshSlow() {
    refreshUsage();
    refreshKeys();
  }

  function refreshKeys() {
    return guarded("Keys", async () => {
      const answer = await api("/keys");
      $("keys").hidden = !answer.ok;
      if (!answer.ok) { unavailable($("keys-note"), "/internal/keys", answer); return; }
      show($("keys-note"), "");
      const budget = (k, period) => (k.budget_tokens && k.budget_tokens[period] != null
        ? fmt(k.budget_tokens[period]) : "—");
      const tokens = (k) => {
        const u = k.usage_today || {};
        return fmt((u.input_tokens || 0) + (u.output_tokens || 0));
      };
      fillTable($("keys"), answer.body.keys || [], [
        [(k) => k.name], [(k) => k.source],
        [(k) => (k.models && k.models.length ? k.models.join(", ") : "all"), "models"],
        [(k) => fmt(k.max_in_flight), "num"], [(k) => fmt(k.rpm), "num"],
        [(k) => fmt(k.tpm), "num"], [(k) => budget(k, "day"), "num"],
        [(k) => budget(k, "month"), "num"],
        [(k) => fmt((k.usage_today || {}).requests ?? 0), "num"], [tokens, "num"],
      ], "No keys configured.");
    });
  }

  // ---- start -------------------------------------------------------------

  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    show($("token-error"), "");
    signIn();
  });
  $("sign-out").addEventListener("click", () => signOut(""));
  $("usage-metric").addEventListener("change", drawUsage);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timers.length) { refreshWorkers(); refreshSlow(); }
  });

  if (token()) signIn(); else signOut("");
})();
