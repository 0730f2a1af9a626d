/* The Login cell of a worker row on the operator page (cli workers: login
 * state, account, login URL, device code, and a box to paste a code).
 * Rendered only when the worker's JSON has these fields; updated in place,
 * so a poll never wipes a code being typed. Exposes window.WorkerLogin. */
"use strict";

window.WorkerLogin = (function () {
  const LOGGED_IN = new Set(["logged_in", "ok", "ready", "done"]);

  /** {state, url, code, error} from `login` (a string or an object) and
   * top-level login_url / device_code; null when the worker has no login. */
  function info(w) {
    const raw = w.login;
    if (raw == null && w.login_url == null && w.device_code == null) return null;
    const obj = raw && typeof raw === "object" ? raw : { state: raw };
    return {
      state: obj.state ?? obj.status ?? null,
      url: obj.url ?? obj.login_url ?? obj.verification_uri ?? w.login_url ?? null,
      code: obj.user_code ?? obj.device_code ?? obj.code ?? w.device_code ?? null,
      error: obj.error ?? obj.message ?? null,
    };
  }

  /** Only http(s) URLs become links (never javascript: or data:). */
  function safeUrl(url) {
    try {
      const u = new URL(String(url));
      return u.protocol === "https:" || u.protocol === "http:" ? u.href : null;
    } catch (_) { return null; }
  }

  function div(className) {
    const node = document.createElement("div");
    if (className) node.className = className;
    return node;
  }

  /** The cell's parts; `sendCode(code)` resolves to the line to show. */
  function build(cell, name, sendCode) {
    const state = div(), account = div("msg account"), error = div("msg"), result = div("msg");
    const link = document.createElement("a");
    link.target = "_blank";
    link.rel = "noopener noreferrer";
    link.className = "login-url";
    const code = div();
    const codeText = document.createElement("code");
    code.append("device code ", codeText);
    const form = document.createElement("form");
    form.className = "login-code";
    const input = document.createElement("input");
    input.type = "text";
    input.placeholder = "paste the code";
    input.autocomplete = "off";
    input.setAttribute("aria-label", `login code for ${name}`);
    const send = document.createElement("button");
    send.type = "submit";
    send.textContent = "Send code";
    form.append(input, send);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const value = input.value.trim();
      if (!value) { result.textContent = "Paste the code the login page showed first."; return; }
      send.disabled = true;
      const outcome = await sendCode(value);
      send.disabled = false;
      if (outcome.ok) input.value = "";  // a refused code stays for another try
      result.textContent = outcome.message;
    });
    cell.append(state, account, link, code, error, form, result);
    return { state, account, link, code, codeText, error, form };
  }

  /** Fill `cell` for worker `w`; `parts` is what the last call returned (or null). */
  function render(cell, parts, w, sendCode) {
    const login = info(w);
    if (!login) { cell.replaceChildren(); return null; }
    parts = parts || build(cell, w.name, sendCode);
    parts.state.textContent = login.state ? String(login.state).replaceAll("_", " ") : "";
    parts.account.textContent = w.account ? String(w.account) : "";
    const href = login.url ? safeUrl(login.url) : null;
    parts.link.hidden = !href;
    if (href && parts.link.href !== href) { parts.link.href = href; parts.link.textContent = href; }
    parts.code.hidden = !login.code;
    parts.codeText.textContent = login.code ? String(login.code) : "";
    parts.error.textContent = login.error ? String(login.error) : "";
    parts.form.hidden = LOGGED_IN.has(String(login.state));  // nothing to paste once logged in
    return parts;
  }

  return { info, render };
})();
