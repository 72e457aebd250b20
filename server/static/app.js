// The chat page: a multi-turn chat streamed through /v1/chat/completions, with speculation shown.
//
// Plain browser JavaScript, no build step and no network but this server. Model output is only
// ever set as textContent (markdown.js builds the formatted answer the same way), never as HTML.
// What the page asks the server for beyond the OpenAI API is the `dspark` request extension:
// `token_origins` (each chunk then lists its tokens as accepted drafts or target tokens) and
// `baseline` (the side-by-side mode's plain decoding); the final chunk's `dspark_stats` feeds the
// stats panel.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  // The API key lives in this tab's sessionStorage only: gone when the tab closes, never sent elsewhere.
  const KEY_STORE = "dspark-api-key";
  const RETRY_MS = 1000; // while the model loads (/v1/models answers 503)

  const state = {
    model: null, // the served model's id, from /v1/models
    history: [], // the conversation as OpenAI messages (finished answers only)
    controller: null, // aborts the running request (Stop); aborting closes the connection, which cancels it
    lastTurn: null, // the last answer's element, replaced by Regenerate
  };

  // ------------------------------------------------------------------ connection and key

  function authHeaders() {
    const headers = { "Content-Type": "application/json" };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = "Bearer " + key;
    return headers;
  }

  // Ask /v1/models what is served; a 401 means the server wants a key: ask for it.
  async function connect() {
    let response;
    try {
      response = await fetch("/v1/models", { headers: authHeaders() });
    } catch (err) {
      setServed("cannot reach the server; retrying…");
      setTimeout(connect, RETRY_MS);
      return;
    }
    if (response.status === 401) {
      const hadKey = sessionStorage.getItem(KEY_STORE) !== null;
      sessionStorage.removeItem(KEY_STORE);
      askKey(hadKey ? "That key was refused. Try again." : "");
      return;
    }
    if (response.status === 503) {
      setServed("the model is loading…");
      setTimeout(connect, RETRY_MS);
      return;
    }
    if (!response.ok) {
      showError(await errorText(response));
      return;
    }
    const card = (await response.json()).data[0];
    const d = card.dspark || {};
    state.model = card.id;
    const drafter = d.drafter_kind ? `${d.drafter_kind}${d.drafter ? " " + d.drafter : ""}` : "none";
    setServed(`${card.id} · mode ${d.mode} · drafter ${drafter} · cap ${d.cap ?? "–"}`);
    document.body.dataset.ready = "true";
    $("send").disabled = false;
  }

  function askKey(message) {
    const dialog = $("key-dialog");
    $("key-error").hidden = !message;
    $("key-error").textContent = message;
    setServed("waiting for the API key");
    if (!dialog.open) dialog.showModal();
    $("key").focus();
  }

  function setServed(text) {
    $("served").textContent = text;
  }

  // ------------------------------------------------------------------ conversation

  function requestBody(extension) {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    const body = {
      model: state.model,
      messages: messages.concat(state.history),
      stream: true,
      stream_options: { include_usage: true },
      temperature: Number($("temperature").value || 0),
      top_p: Number($("top-p").value || 1),
      max_tokens: Math.max(1, parseInt($("max-tokens").value, 10) || 256),
    };
    if ($("seed").value !== "") body.seed = parseInt($("seed").value, 10);
    const tools = $("tools").value.trim();
    if (tools) {
      // Tool calls the model makes are shown; the page runs no tools (answers keep only their text).
      try {
        body.tools = JSON.parse(tools);
      } catch (err) {
        throw new Error("Tools: not valid JSON (" + err.message + ")");
      }
      body.tool_choice = $("tool-choice").value;
    }
    // The extension object only when something is asked of it: off costs the server nothing.
    if (Object.keys(extension).length) body.dspark = extension;
    return body;
  }

  function addUserMessage(text) {
    const msg = document.createElement("article");
    msg.className = "msg user";
    msg.setAttribute("aria-label", "You");
    const body = msg.appendChild(document.createElement("div"));
    body.className = "text";
    body.textContent = text;
    $("log").appendChild(msg);
    msg.scrollIntoView({ block: "end" });
  }

  // An assistant turn: one pane, or two (baseline, speculative) side by side.
  function addTurn(labels) {
    const turn = document.createElement("article");
    turn.className = "msg assistant" + (labels.length > 1 ? " compare" : "");
    turn.setAttribute("aria-label", "Assistant");
    const panes = labels.map((label) => {
      const pane = turn.appendChild(document.createElement("section"));
      pane.className = "pane";
      pane.dataset.kind = label;
      if (labels.length > 1) {
        const h = pane.appendChild(document.createElement("h3"));
        h.textContent = label;
      }
      const answer = pane.appendChild(document.createElement("div"));
      answer.className = "answer";
      const meta = pane.appendChild(document.createElement("p"));
      meta.className = "meta";
      return { pane, answer, meta, content: "", reasoning: "", calls: [], tokens: 0, drafted: 0 };
    });
    $("log").appendChild(turn);
    state.lastTurn = turn;
    return { turn, panes };
  }

  async function answer() {
    const compare = $("compare").checked;
    const origins = $("origins").checked;
    const { turn, panes } = addTurn(compare ? ["baseline", "speculative"] : ["answer"]);
    const extension = origins ? { token_origins: true } : {};
    setBusy(true);
    try {
      let results;
      if (compare) {
        // One after the other: the server decodes one request at a time, so each speed is its own.
        const base = await stream(panes[0], { ...extension, baseline: true });
        const spec = base && (await stream(panes[1], extension));
        results = base && spec ? [base, spec] : null;
        if (results) showSpeedup(turn, base.stats, spec.stats);
      } else {
        const only = await stream(panes[0], extension);
        results = only && [only];
      }
      if (results) {
        const last = results[results.length - 1];
        state.history.push({ role: "assistant", content: last.content });
        turn.dataset.done = "true";
      }
    } finally {
      setBusy(false);
    }
  }

  async function send() {
    const text = $("prompt").value;
    if (!text.trim() || state.controller || !state.model) return;
    $("prompt").value = "";
    hideError();
    state.history.push({ role: "user", content: text });
    addUserMessage(text);
    await answer();
  }

  async function regenerate() {
    if (state.controller || !state.lastTurn) return;
    if (state.lastTurn.dataset.done === "true") state.history.pop(); // that answer leaves the history
    state.lastTurn.remove();
    state.lastTurn = null;
    hideError();
    await answer();
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  function setBusy(busy) {
    $("send").disabled = busy || !state.model;
    $("stop").disabled = !busy;
    $("regenerate").disabled = busy || !state.lastTurn;
    document.body.dataset.busy = String(busy);
  }

  // ------------------------------------------------------------------ streaming

  // Stream one request into `view`. Resolves {content, stats} when it finished, null when stopped or failed.
  async function stream(view, extension) {
    const controller = new AbortController();
    state.controller = controller;
    view.pane.dataset.state = "streaming";
    const started = performance.now();
    let firstToken = null;
    let stats = null;
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST", headers: authHeaders(), body: JSON.stringify(requestBody(extension)), signal: controller.signal,
      });
      if (!response.ok) throw new Error(await errorText(response));
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          for (const line of frame.split("\n")) {
            if (!line.startsWith("data:")) continue; // SSE comments are keep-alives
            const data = line.slice(5).trim();
            if (data === "[DONE]") continue;
            const chunk = JSON.parse(data);
            if (chunk.error) throw new Error(chunk.error.message);
            if (firstToken === null && chunk.dspark_tokens) firstToken = performance.now();
            apply(view, chunk);
            if (chunk.dspark_stats) stats = chunk.dspark_stats;
          }
        }
        showLive(view, firstToken);
      }
      renderAnswer(view); // now, not at the next frame: the answer is complete once the turn says so
      if (!stats) throw new Error("the stream ended without its final chunk");
      view.pane.dataset.state = "done";
      view.meta.textContent = `${stats.generated_tokens} tokens · ${fmt(stats.tokens_per_s, 1)} tokens/s · ` +
        `mode ${stats.mode} · ${((performance.now() - started) / 1000).toFixed(2)} s in all`;
      showStats(stats);
      return { content: view.content, stats };
    } catch (err) {
      if (err.name === "AbortError") {
        view.pane.dataset.state = "stopped";
        view.meta.textContent = "stopped";
      } else {
        view.pane.dataset.state = "failed";
        showError(err.message);
      }
      return null;
    } finally {
      state.controller = null;
    }
  }

  // One chunk: its text into the answer, its reasoning and tool calls, its tokens coloured by origin.
  function apply(view, chunk) {
    const delta = (chunk.choices[0] || {}).delta || {};
    if (delta.content) view.content += delta.content;
    if (delta.reasoning_content) view.reasoning += delta.reasoning_content;
    for (const call of delta.tool_calls || []) {
      const known = view.calls[call.index] || (view.calls[call.index] = { name: "", arguments: "" });
      if (call.function && call.function.name) known.name = call.function.name;
      if (call.function && call.function.arguments) known.arguments += call.function.arguments;
    }
    if (chunk.dspark_tokens) addTokens(view, chunk.dspark_tokens);
    scheduleRender(view);
  }

  // The answer is re-rendered at most once per frame, however many chunks arrive.
  function scheduleRender(view) {
    if (view.pending) return;
    view.pending = true;
    requestAnimationFrame(() => {
      view.pending = false;
      renderAnswer(view);
    });
  }

  function renderAnswer(view) {
    const parts = document.createDocumentFragment();
    if (view.reasoning) {
      // Reasoning collapsed: the answer is what matters, the thinking is one click away.
      const details = parts.appendChild(document.createElement("details"));
      details.className = "reasoning";
      details.open = view.reasoningOpen || false;
      details.addEventListener("toggle", () => { view.reasoningOpen = details.open; });
      details.appendChild(document.createElement("summary")).textContent = "Reasoning";
      details.appendChild(window.DsparkMarkdown.render(view.reasoning));
    }
    parts.appendChild(window.DsparkMarkdown.render(view.content));
    for (const call of view.calls.filter(Boolean)) {
      const box = parts.appendChild(document.createElement("div"));
      box.className = "tool-call";
      box.appendChild(document.createElement("strong")).textContent = "Tool call: " + call.name;
      box.appendChild(document.createElement("pre")).textContent = call.arguments;
    }
    view.answer.replaceChildren(parts);
  }

  // Each generated token as a span coloured by origin; the EOS token has text too (special tokens kept).
  function addTokens(view, tokens) {
    if (!view.tokenBox) {
      const details = document.createElement("details");
      details.className = "token-view";
      details.open = true;
      view.tokenSummary = details.appendChild(document.createElement("summary"));
      view.tokenBox = details.appendChild(document.createElement("div"));
      view.tokenBox.className = "tokens";
      view.pane.insertBefore(details, view.meta);
    }
    for (const t of tokens) {
      const span = view.tokenBox.appendChild(document.createElement("span"));
      span.className = "tok tok-" + t.origin;
      span.textContent = t.text;
      span.dataset.id = t.id;
      span.title = `${t.origin === "draft" ? "accepted draft" : "target"} · id ${t.id}`;
      view.tokens += 1;
      view.drafted += t.origin === "draft" ? 1 : 0;
    }
    view.tokenSummary.textContent = `Tokens by origin: ${view.tokens} (${view.drafted} accepted drafts, ` +
      `${view.tokens - view.drafted} target)`;
  }

  // While streaming, the rate seen by the page (from the token count; the server's own figure follows).
  function showLive(view, firstToken) {
    if (firstToken === null || view.tokens < 2) return;
    const seconds = (performance.now() - firstToken) / 1000;
    if (seconds > 0) $("stat-tps").textContent = `${fmt(view.tokens / seconds, 1)} (live)`;
    $("stat-tokens").textContent = String(view.tokens);
    $("stat-accepted").textContent = `${view.drafted} (live)`;
  }

  // ------------------------------------------------------------------ stats panel

  function fmt(x, digits) {
    return Number(x).toFixed(digits);
  }

  function ms(seconds) {
    return `${fmt(seconds * 1000, 1)} ms`;
  }

  // Each panel number shows dspark_stats' value formatted; data-value holds the value itself.
  function setStat(id, value, text) {
    const node = $(id);
    node.dataset.value = value === null || value === undefined ? "" : String(value);
    node.textContent = text;
  }

  function showStats(s) {
    setStat("stat-tps", s.tokens_per_s, fmt(s.tokens_per_s, 1));
    setStat("stat-tau", s.mean_accepted_length, fmt(s.mean_accepted_length, 2));
    setStat("stat-cap", s.cap, s.cap === null ? "none" : String(s.cap));
    setStat("stat-mode", s.mode, s.mode);
    setStat("stat-tokens", s.generated_tokens, String(s.generated_tokens));
    setStat("stat-accepted", s.accepted_tokens, `${s.accepted_tokens} of ${s.drafted_tokens}`);
    setStat("stat-rounds", s.rounds, String(s.rounds));
    const other = s.time_accept_s + s.time_other_s;
    setStat("stat-prefill", s.time_prefill_s, ms(s.time_prefill_s));
    setStat("stat-draft", s.time_draft_s, ms(s.time_draft_s));
    setStat("stat-verify", s.time_verify_s, ms(s.time_verify_s));
    setStat("stat-other", other, ms(other));
    drawAcceptance(s.acceptance_by_position || []);
    drawSplit([["t-prefill", s.time_prefill_s], ["t-draft", s.time_draft_s], ["t-verify", s.time_verify_s],
      ["t-other", other]]);
    $("raw-stats").textContent = JSON.stringify(s, null, 2);
  }

  // A bar per draft slot: the share of verified drafts at that slot the target accepted.
  function drawAcceptance(rates) {
    const chart = $("accept-chart");
    chart.replaceChildren();
    if (!rates.length) {
      chart.appendChild(document.createElement("p")).textContent = "no drafts verified";
    }
    rates.forEach((rate, i) => {
      const col = chart.appendChild(document.createElement("div"));
      col.className = "col";
      const bar = col.appendChild(document.createElement("div"));
      bar.className = "bar";
      bar.style.height = `${Math.round(rate * 100)}%`;
      bar.dataset.rate = String(rate);
      col.title = `slot ${i + 1}: ${fmt(rate * 100, 0)}% accepted`;
      col.appendChild(document.createElement("span")).textContent = String(i + 1);
    });
    $("accept-text").textContent = rates.length
      ? rates.map((r, i) => `slot ${i + 1}: ${fmt(r * 100, 0)} percent`).join(", ") : "no drafts verified";
  }

  function drawSplit(parts) {
    const total = parts.reduce((sum, [, s]) => sum + s, 0);
    const bar = $("time-split");
    bar.replaceChildren();
    for (const [cls, seconds] of parts) {
      const piece = bar.appendChild(document.createElement("div"));
      piece.className = cls;
      piece.style.width = total > 0 ? `${(100 * seconds) / total}%` : "0";
    }
  }

  function showSpeedup(turn, base, spec) {
    const line = turn.appendChild(document.createElement("p"));
    line.className = "speedup";
    const ratio = base.tokens_per_s > 0 ? spec.tokens_per_s / base.tokens_per_s : 0;
    line.textContent = `baseline ${fmt(base.tokens_per_s, 1)} tokens/s · speculative ${fmt(spec.tokens_per_s, 1)} ` +
      `tokens/s · ${fmt(ratio, 2)}×`;
  }

  // ------------------------------------------------------------------ errors

  async function errorText(response) {
    try {
      const body = await response.json();
      return `${response.status}: ${body.error.message}`;
    } catch (err) {
      return `HTTP ${response.status}`;
    }
  }

  function showError(text) {
    $("error").textContent = text;
    $("error").hidden = false;
  }

  function hideError() {
    $("error").hidden = true;
  }

  // ------------------------------------------------------------------ wiring

  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.controller) stop();
  });
  $("stop").addEventListener("click", stop);
  $("regenerate").addEventListener("click", regenerate);
  $("clear").addEventListener("click", () => {
    stop();
    state.history = [];
    state.lastTurn = null;
    $("log").replaceChildren();
    setBusy(false);
    $("prompt").focus();
  });
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY_STORE, $("key").value.trim());
    $("key").value = "";
    $("key-dialog").close();
    connect();
  });
  // The key dialog cannot be dismissed without a key: the API needs one.
  $("key-dialog").addEventListener("cancel", (e) => e.preventDefault());

  $("send").disabled = true;
  connect();
})();
