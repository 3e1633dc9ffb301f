// Playground: send a chat message to a model with a priority, and watch it queue, load
// and stream. Each message is a card that follows its request through the events.
//
// The answer carries no request ID until it is served, so a card recognises its request
// as the first new "queued" request event for its model (and priority) after it was
// sent. Another client sending to the same model at the same moment could be mistaken
// for it; for a playground that is good enough, and the text itself is always this
// card's own.

import * as api from "./api.js";
import { $, h, setText } from "./dom.js";
import * as fmt from "./format.js";

const PRIORITIES = { interactive: 100, normal: 0, batch: -100 };
const STEPS = ["sent", "queued", "loading", "streaming", "done"];
const KEPT = 20;

export function mountPlayground(store) {
  const form = $("#play-form");
  const modelSelect = $("#play-model");
  const list = $("#runs");
  const runs = [];
  let newest = -1; // the highest request ID seen: IDs only grow (until a restart), so a card's is above it

  function renderModels() {
    const local = store.visibleModels().map((model) => model.id).sort();
    const wanted = [...local, ...store.peers];
    const have = [...modelSelect.options].map((option) => option.value);
    if (wanted.join("\n") === have.join("\n")) return;
    const chosen = modelSelect.value;
    modelSelect.replaceChildren(...wanted.map((model) => h("option", { value: model }, model)));
    if (wanted.includes(chosen)) modelSelect.value = chosen;
  }

  function card(run) {
    const steps = h("ol", { class: "steps", "aria-label": "Progress" }, STEPS.map((step) => h("li", { "data-step": step }, step)));
    const stop = h("button", { type: "button", class: "danger" }, "Stop");
    stop.setAttribute("aria-label", "Stop this message");
    stop.addEventListener("click", () => run.controller.abort());
    run.el = {
      root: h(
        "li",
        { class: "run" },
        h(
          "div",
          { class: "run-head" },
          h("strong", { "data-role": "id" }, "request"),
          h("span", {}, run.model),
          h("span", { class: "band", "data-band": run.band }, `${fmt.bandLabel(run.band)} (${fmt.priority(run.priority)})`),
          steps,
          stop,
        ),
        h("p", { class: "run-note", "data-role": "note" }),
        h("pre", { class: "run-out", "data-role": "out" }),
      ),
      steps,
      stop,
    };
    return run.el.root;
  }

  function part(run, role) {
    return run.el.root.querySelector(`[data-role="${role}"]`);
  }

  function paint(run) {
    const at = STEPS.indexOf(run.step);
    for (const li of run.el.steps.children) {
      const step = li.dataset.step;
      const index = STEPS.indexOf(step);
      if (index === at) li.className = run.failed ? "bad" : run.finished ? "done" : "now";
      else if (run.visited.has(step)) li.className = "done";
      else li.className = index < at ? "skipped" : "";
    }
    setText(part(run, "id"), run.id === null ? "request" : `#${run.id}`);
    setText(part(run, "note"), note(run));
    run.el.stop.hidden = run.finished;
    part(run, "out").classList.toggle("error", run.failed);
  }

  function note(run) {
    const now = performance.now();
    if (run.error) return run.error;
    if (run.step === "sent") return "waiting for llamaswap to admit it…";
    if (run.step === "queued") {
      const position = store.queue.order.indexOf(run.id);
      const ahead = position === -1 ? "" : `position ${position + 1} of ${store.queue.order.length}, `;
      return `waiting for its turn: ${ahead}queued ${fmt.duration(now - run.queuedAt)}`;
    }
    if (run.step === "loading") {
      return `${run.model} is loading for it (${fmt.duration(now - run.loadingAt)})${run.loadNote ? ` — ${run.loadNote}` : ""}`;
    }
    const tokens = run.tokens;
    const firstAfter = run.firstTokenAt === null ? null : run.firstTokenAt - run.sentAt;
    const rate = run.firstTokenAt !== null && tokens > 1 ? ((tokens - 1) * 1000) / ((run.lastTokenAt ?? now) - run.firstTokenAt) : null;
    const parts = [];
    if (firstAfter !== null) parts.push(`first token after ${fmt.duration(firstAfter)}`);
    parts.push(fmt.plural(tokens, "chunk"));
    if (rate !== null && Number.isFinite(rate)) parts.push(`${fmt.number(rate, 1)} tok/s`);
    if (run.waitedMs !== null) parts.push(`queue wait ${fmt.duration(run.waitedMs)}`);
    if (run.score !== null) parts.push(`score at its pick ${fmt.score(run.score)}`);
    if (run.doneAt !== null) parts.push(`total ${fmt.duration(run.doneAt - run.sentAt)}`);
    if (!run.finished && tokens === 0) return "being served: waiting for the first token…";
    return parts.join(" · ");
  }

  function advance(run, step) {
    if (run.finished) return;
    run.visited.add(step);
    if (STEPS.indexOf(step) > STEPS.indexOf(run.step)) {
      run.step = step;
      if (step === "queued") run.queuedAt = performance.now();
      if (step === "loading") run.loadingAt = performance.now();
    }
    paint(run);
  }

  function finish(run, error) {
    if (run.finished) return;
    run.finished = true;
    run.doneAt = performance.now();
    if (error) {
      run.failed = true;
      run.error = error;
    } else {
      run.step = "done";
      run.visited.add("done");
    }
    paint(run);
  }

  async function send(model, priorityName, message, maxTokens) {
    const run = {
      model,
      band: priorityName === "interactive" || priorityName === "batch" ? priorityName : "normal",
      priority: PRIORITIES[priorityName],
      id: null,
      after: -1,
      step: "sent",
      visited: new Set(["sent"]),
      sentAt: performance.now(),
      queuedAt: null,
      loadingAt: null,
      firstTokenAt: null,
      lastTokenAt: null,
      tokens: 0,
      waitedMs: null,
      score: null,
      doneAt: null,
      loadNote: "",
      error: "",
      failed: false,
      finished: false,
      controller: new AbortController(),
      el: null,
    };
    for (const id of store.requests.keys()) newest = Math.max(newest, id);
    run.after = newest;
    runs.unshift(run);
    list.prepend(card(run));
    while (runs.length > KEPT) runs.pop().el.root.remove();
    paint(run);
    const out = part(run, "out");
    const body = {
      model,
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: maxTokens,
      messages: [{ role: "user", content: message }],
    };
    try {
      const response = await api.request("v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-LlamaSwap-Priority": priorityName },
        body: JSON.stringify(body),
        signal: run.controller.signal,
      });
      if (!response.ok) {
        const text = await response.text();
        let detail = text;
        try {
          detail = JSON.parse(text).error?.message ?? text;
        } catch {
          // not JSON: the text as it is
        }
        return finish(run, `HTTP ${response.status}: ${detail}`);
      }
      for await (const message of api.events(response, run.controller.signal)) {
        if (message.data === "[DONE]") break;
        let chunk;
        try {
          chunk = JSON.parse(message.data);
        } catch {
          continue;
        }
        if (chunk.error) return finish(run, chunk.error.message ?? JSON.stringify(chunk.error));
        const delta = chunk.choices?.[0]?.delta ?? {};
        if (delta.reasoning_content && chunk.id === "llamaswap-loading") {
          run.loadNote = delta.reasoning_content.trim();
          paint(run);
          continue;
        }
        const text = delta.content ?? delta.reasoning_content ?? "";
        if (text) {
          const now = performance.now();
          run.firstTokenAt ??= now;
          run.lastTokenAt = now;
          run.tokens += 1;
          out.append(text);
          advance(run, "streaming");
        }
      }
      finish(run, null);
    } catch (error) {
      finish(run, run.controller.signal.aborted ? "stopped: the request was cancelled when its connection closed" : error.message);
    }
  }

  // Follow the cards' requests through the event stream.
  function onRequest(event) {
    let run = runs.find((r) => r.id === event.id);
    if (run === undefined && event.state === "queued") {
      const candidates = runs
        .filter((r) => r.id === null && r.model === event.model && !r.finished && event.id > r.after)
        .reverse(); // oldest card first
      run = candidates.find((r) => r.priority === event.priority) ?? candidates[0];
      if (run) run.id = event.id;
    }
    newest = Math.max(newest, event.id);
    if (run === undefined) return;
    if (event.state === "queued") advance(run, "queued");
    else if (event.state === "loading") advance(run, "loading");
    else if (event.state === "serving") {
      run.waitedMs = event.waited_ms; // fixed at dispatch: its whole time in the queue
      run.score = event.score;
      advance(run, "streaming");
    }
    else if (event.state === "failed" && event.error) finish(run, event.error);
    paint(run);
  }

  store.on((what, detail) => {
    if (what === "connection") {
      // Not connected: a message would only fail.
      for (const button of form.querySelectorAll("button")) button.disabled = store.stale;
    }
    if (what === "requests" && detail) onRequest(detail);
    else if (what === "tick" || what === "queue") {
      for (const run of runs) if (!run.finished) paint(run);
    } else if (what === "snapshot" || what === "models") {
      if (what === "snapshot") {
        // A restarted llamaswap numbers its requests from 0 again: count from the snapshot.
        newest = Math.max(-1, ...store.requests.keys());
        for (const run of runs) if (run.id === null) run.after = Math.min(run.after, newest);
      }
      renderModels();
    }
  });

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    send(data.get("model"), data.get("priority"), data.get("message"), Number(data.get("max_tokens")) || 48);
  });
  $("#play-each").addEventListener("click", () => {
    const data = new FormData(form);
    for (const band of ["batch", "normal", "interactive"]) {
      send(data.get("model"), band, data.get("message"), Number(data.get("max_tokens")) || 48);
    }
  });
  renderModels();
}
