// nanoqwen chat page: talks to this server's own OpenAI-compatible /v1/chat/completions (SSE over fetch).
// No library and no build step. The API key, when the server wants one, is typed by the user and kept in this
// tab's memory only; the page itself holds no secret.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { history: [], apiKey: null, controller: null, retryTimer: null, conversation: 0 };

// ------------------------------------------------------------------ messages and errors

function banner(text, kind) {
  const b = $("banner");
  b.textContent = text;
  b.className = kind || "";
  b.hidden = !text;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.dataset.role = role;
  render(div, text);
  $("messages").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function note(div, text) {
  const span = document.createElement("span");
  span.className = "note";
  span.textContent = text;
  div.appendChild(span);
}

function authHeaders() {
  const h = { "Content-Type": "application/json" };
  if (state.apiKey) h["Authorization"] = "Bearer " + state.apiKey;
  return h;
}

// The server answers every client mistake with an OpenAI-style body {"error": {"message", "code", ...}}.
async function errorText(resp) {
  let msg = resp.statusText || "error", code = null;
  try {
    const body = await resp.json();
    if (body && body.error) { msg = body.error.message || msg; code = body.error.code || null; }
  } catch (e) { /* not JSON: keep the status text */ }
  if (resp.status === 401) {
    $("key-form").hidden = false;
    $("api-key").focus();
    return state.apiKey ? "401 Unauthorized: the server refused this API key. Enter the right key above."
                        : "401 Unauthorized: this server needs an API key. Enter it above.";
  }
  if (resp.status === 400 && code === "context_length_exceeded")
    return "Context full: " + msg + ". Use /reset to start a new conversation, or lower max tokens.";
  return "Error " + resp.status + ": " + msg;
}

function unreachable(err) {
  return "Cannot reach the server at " + location.origin + " (" + (err && err.message || err) +
         "). Is `nanoqwen serve` still running?";
}

// ------------------------------------------------------------------ model info

async function loadModel() {
  let resp;
  try {
    resp = await fetch("v1/models", { headers: authHeaders() });
  } catch (e) {
    $("model-info").textContent = "server unreachable";
    banner(unreachable(e) + " Retrying in 5 s.");
    setTimeout(loadModel, 5000);
    return;
  }
  if (!resp.ok) {
    $("model-info").textContent = "not connected";
    banner(await errorText(resp));
    return;
  }
  const card = (await resp.json()).data[0];
  state.model = card.id;
  $("model-info").textContent = card.id + " · context " + card.context_length + " tokens";
  $("key-form").hidden = true;
  banner("");
}

// ------------------------------------------------------------------ chat

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

function resetConversation() {
  stop();
  state.conversation += 1;            // an answer still finishing belongs to the old one
  state.history = [];
  $("messages").replaceChildren();
  $("stats").textContent = "";
  banner("Conversation reset.", "info");
}

function stop() {
  if (state.retryTimer) {                       // waiting out a 429: the question is withdrawn, not answered
    clearTimeout(state.retryTimer);
    state.retryTimer = null;
    state.history.pop();
    const asked = document.querySelectorAll(".msg.user");
    if (asked.length) note(asked[asked.length - 1], "(not sent: stopped while the server was busy)");
    setBusy(false);
    banner("");
  }
  if (state.controller) state.controller.abort();
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...state.history);
  const body = { model: state.model, messages, stream: true, stream_options: { include_usage: true } };
  const t = parseFloat($("temperature").value);
  if (!Number.isNaN(t)) body.temperature = t;
  const n = parseInt($("max-tokens").value, 10);
  if (!Number.isNaN(n)) body.max_tokens = n;
  return body;
}

function showStats(s) {
  const parts = [];
  if (s.ttft != null) parts.push("TTFT " + s.ttft.toFixed(0) + " ms");
  if (s.tokens > 1 && s.last > s.first) parts.push(((s.tokens - 1) * 1000 / (s.last - s.first)).toFixed(1) + " tokens/s");
  parts.push(s.tokens + " tokens");
  $("stats").textContent = parts.join(" · ");
}

async function send(text) {
  state.history.push({ role: "user", content: text });
  addMessage("user", text);
  await ask();
}

// One assistant answer for the current history; retried after Retry-After seconds on 429.
async function ask() {
  setBusy(true);
  banner("");
  const controller = state.controller = new AbortController();
  const conversation = state.conversation;
  const div = addMessage("assistant", "");
  const s = { start: performance.now(), ttft: null, first: 0, last: 0, tokens: 0 };
  let answer = "", finish = null;
  try {
    const resp = await fetch("v1/chat/completions", {
      method: "POST", headers: authHeaders(), body: JSON.stringify(requestBody()), signal: controller.signal });
    if (resp.status === 429) {
      const wait = Math.max(1, parseInt(resp.headers.get("Retry-After") || "1", 10) || 1);
      div.remove();
      banner("The server is busy (429). Retrying in " + wait + " s, as it asked (Stop cancels).", "info");
      state.retryTimer = setTimeout(() => { state.retryTimer = null; ask(); }, wait * 1000);
      return;
    }
    if (!resp.ok) {
      div.remove();
      state.history.pop();
      addMessage("error", await errorText(resp));
      setBusy(false);
      return;
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      const events = buf.split(/\r?\n\r?\n/);
      buf = events.pop();
      for (const ev of events) {
        for (const line of ev.split(/\r?\n/)) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error("the server reported: " + chunk.error.message);
          if (chunk.usage) s.tokens = chunk.usage.completion_tokens;
          const choice = chunk.choices && chunk.choices[0];
          if (!choice) continue;
          if (choice.finish_reason) finish = choice.finish_reason;
          const piece = choice.delta && choice.delta.content;
          if (piece) {
            const now = performance.now();
            if (s.ttft === null) { s.ttft = now - s.start; s.first = now; }
            s.last = now;
            s.tokens += 1;                       // one chunk per token or so: replaced by usage at the end
            answer += piece;
            render(div, answer);
            showStats(s);
            div.scrollIntoView({ block: "end" });
          }
        }
      }
    }
    showStats(s);
    if (finish === "length") note(div, "(stopped at max tokens)");
  } catch (e) {
    if (e.name === "AbortError") {
      note(div, "(stopped)");
    } else if (e instanceof TypeError) {
      note(div, "(interrupted)");
      addMessage("error", unreachable(e));
    } else {
      addMessage("error", "Error: " + e.message);
    }
  } finally {
    if (state.controller === controller) state.controller = null;
    if (!state.retryTimer) setBusy(false);
  }
  if (answer && conversation === state.conversation) state.history.push({ role: "assistant", content: answer });
}

// ------------------------------------------------------------------ rendering: text and ``` code blocks

// Split an answer on ``` fences: text parts as plain text, code parts in a <pre> with a copy button. An unclosed
// fence (still streaming) runs to the end.
function render(div, text) {
  div.replaceChildren();
  const parts = text.split("```");
  parts.forEach((part, i) => {
    if (i % 2 === 0) {                          // the line breaks around a fence belong to the block
      if (i > 0) part = part.replace(/^\n/, "");
      if (i < parts.length - 1) part = part.replace(/\n$/, "");
      if (part) div.appendChild(document.createTextNode(part));
      return;
    }
    const nl = part.indexOf("\n");
    const lang = (nl >= 0 ? part.slice(0, nl) : "").trim().toLowerCase();
    const code = nl >= 0 ? part.slice(nl + 1) : part;
    div.appendChild(codeBlock(code.replace(/\n$/, ""), lang));
  });
}

function codeBlock(code, lang) {
  const box = document.createElement("div");
  box.className = "code";
  const pre = document.createElement("pre");
  pre.innerHTML = (lang === "" || lang === "python" || lang === "py") ? highlightPython(code) : escapeHtml(code);
  const copy = document.createElement("button");
  copy.className = "copy";
  copy.type = "button";
  copy.textContent = "Copy";
  copy.addEventListener("click", () => copyText(code, copy));
  box.append(copy, pre);
  return box;
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch (e) {
    button.textContent = "Copy failed";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

function escapeHtml(s) {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

const PY_KEYWORDS = new Set(("False None True and as assert async await break class continue def del elif else " +
  "except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield " +
  "match case self").split(" "));
// One pass over the code: comments, strings (triple-quoted first, then one-line with escapes), numbers, names.
const PY_TOKEN = /(#[^\n]*)|([rbfuRBFU]{0,2}(?:"""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?))|(\b\d[\d_]*(?:\.\d*)?(?:[eE][+-]?\d+)?j?\b)|([A-Za-z_]\w*)/g;

function highlightPython(code) {
  let out = "", last = 0, m;
  PY_TOKEN.lastIndex = 0;
  while ((m = PY_TOKEN.exec(code)) !== null) {
    if (m[0] === "") { PY_TOKEN.lastIndex++; continue; }
    out += escapeHtml(code.slice(last, m.index));
    const cls = m[1] ? "tok-com" : m[2] ? "tok-str" : m[3] ? "tok-num" : PY_KEYWORDS.has(m[4]) ? "tok-kw" : null;
    out += cls ? '<span class="' + cls + '">' + escapeHtml(m[0]) + "</span>" : escapeHtml(m[0]);
    last = m.index + m[0].length;
  }
  return out + escapeHtml(code.slice(last));
}

// ------------------------------------------------------------------ wiring

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  if ($("send").disabled) return;
  const text = $("input").value.trim();
  if (!text) return;
  $("input").value = "";
  if (text === "/reset") { resetConversation(); return; }
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", stop);
$("reset").addEventListener("click", resetConversation);
$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.apiKey = $("api-key").value.trim() || null;
  loadModel();
});
window.addEventListener("error", (ev) => banner("Page error: " + ev.message));

loadModel();
