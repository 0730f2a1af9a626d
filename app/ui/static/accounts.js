/* Accounts panel of the operator page: each cli account's state, a bar per
 * quota window (used percent, reset time) and the forecast of running out,
 * from GET /internal/accounts. Every value from the server goes in as text
 * or as a number it was checked to be, never as HTML. */
"use strict";

(function () {
  const STATE = /^[a-z_]{1,32}$/;  // a state is also a class name: only plain ones

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text != null) node.textContent = text;
    return node;
  }

  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

  /** "3h 20m", "45m", "20s" */
  function span(seconds) {
    const s = Math.max(0, Math.round(seconds));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    if (h >= 48) return `${Math.floor(h / 24)}d ${h % 24}h`;
    if (h) return `${h}h ${m}m`;
    return m ? `${m}m` : `${s}s`;
  }

  function when(ts, now) {
    const t = num(ts);
    if (t === null) return null;
    const at = new Date(t * 1000);
    const day = at.toDateString() === new Date(now * 1000).toDateString()
      ? "" : at.toLocaleDateString([], { month: "short", day: "numeric" }) + " ";
    return day + at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }

  function windowBar(w, now) {
    const box = el("div", "quota-window");
    box.dataset.window = String(w.window);
    const used = Math.min(100, Math.max(0, num(w.used_percent) ?? 0));
    const shown = w.current === false ? 0 : used;  // reset since it was seen
    const label = el("div", "quota-label");
    label.append(el("span", "quota-name", String(w.window)));
    if (w.source === "counted") label.append(el("span", "quota-source", "counted"));
    label.append(el("span", "quota-used", w.current === false
      ? "reset since seen" : `${Math.round(used * 10) / 10}% used`));
    const bar = el("div", "bar" + (shown >= 90 ? " over" : shown >= 75 ? " warn" : ""));
    bar.setAttribute("role", "progressbar");
    bar.setAttribute("aria-label", `${w.window} used`);
    bar.setAttribute("aria-valuemin", "0");
    bar.setAttribute("aria-valuemax", "100");
    bar.setAttribute("aria-valuenow", String(Math.round(shown)));
    const fill = el("span");
    fill.style.width = shown + "%";  // CSSOM, not an inline style attribute: CSP allows it
    bar.append(fill);
    const resets = when(w.resets_at, now);
    const reset = el("div", "quota-reset", resets === null ? "reset time unknown"
      : `resets ${resets} (in ${span(w.resets_at - now)})`);
    if (typeof w.resets_at_iso === "string") reset.title = w.resets_at_iso;
    box.append(label, bar, reset);
    return box;
  }

  function forecastText(a, now) {
    if (!a.windows || !a.windows.length) return "—";
    const t = num(a.forecast_empty_at);
    if (t === null) return "lasts until reset";
    return t <= now ? "out now" : `runs out in ${span(t - now)} (${when(t, now)})`;
  }

  function row(a, now) {
    const tr = el("tr");
    tr.dataset.account = String(a.name);
    const name = el("td", "account-name");
    name.append(el("div", null, String(a.name)));
    if (a.account) name.append(el("div", "account", String(a.account)));
    const state = String(a.state || "unknown");
    const badge = el("span", "state " + (STATE.test(state) ? state : "unknown"),
                     state.replaceAll("_", " "));
    const stateCell = el("td");
    stateCell.append(badge);
    const quota = el("td", "quota");
    if (!a.windows || !a.windows.length) {
      quota.append(el("span", "quota-none", "no quota reported yet"));
    } else {
      for (const w of a.windows) quota.append(windowBar(w, now));
    }
    const headroom = num(a.headroom_percent);
    const forecast = el("td", "forecast");
    forecast.append(el("div", null, forecastText(a, now)));
    if (headroom !== null) {
      forecast.append(el("div", "headroom", `${Math.round(headroom)}% left in ${a.tightest_window}`));
    }
    tr.append(name, el("td", null, String(a.cli || "")), stateCell, quota, forecast);
    return tr;
  }

  /** Draw the accounts (GET /internal/accounts's list) into the table's body. */
  function render(table, accounts, now) {
    table.tBodies[0].replaceChildren(...accounts.map((a) => row(a, now)));
  }

  window.AccountQuota = { render };
})();
