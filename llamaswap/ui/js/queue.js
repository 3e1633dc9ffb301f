// Queue: depth and oldest wait per band; the waiting requests in the order the scheduler
// will serve them, with their scores and, where llamaswap estimates it, a bar of how far
// each is from starting; the requests loading or being served. Each has a Cancel button
// (POST /api/inflight/{id}/cancel: its client gets a 499). A request preempted for more
// urgent work (serial with preempt) waits again, marked paused: how often it was
// preempted and for how long it has been paused.

import * as api from "./api.js";
import { $, batched, h, setAttr, setText, syncList, toast } from "./dom.js";
import * as fmt from "./format.js";

const FINISHED = new Set(["done", "failed", "cancelled"]);

// Waiting for its turn: queued, or paused after a preemption (a "paused" event; a
// snapshot says "queued" with paused true).
const waits = (request) => request.state === "queued" || request.state === "paused";

export function mountQueue(store) {
  const bandsBody = $("#bands tbody");
  const waitingBody = $("#waiting tbody");
  const runningBody = $("#running tbody");
  const cancelling = new Set();

  async function cancel(id, button) {
    cancelling.add(id);
    button.disabled = true;
    try {
      await api.post(`api/inflight/${id}/cancel`);
      toast(`Request #${id} cancelled`);
    } catch (error) {
      toast(`Cancel of #${id} failed: ${error.message}`, { bad: true });
      cancelling.delete(id);
      button.disabled = false;
    }
  }

  // Time in the queue, counted on from the last event while it waits (and while the page
  // is live: a stale page's clock is stopped). A paused request's stays what it was at its
  // first dispatch: how long it has been paused is counted apart.
  const waited = (request) =>
    request.state === "queued" && !request.paused
      ? request.waited_ms + (store.monoNow() - request.at)
      : request.waited_ms;
  const pausedFor = (request) =>
    request.paused && request.paused_ms !== null && request.paused_ms !== undefined
      ? request.paused_ms + (store.monoNow() - request.at)
      : null;

  // Preempted: "paused" while it waits to go on, with how often and for how long; once
  // resumed, how often it was.
  const pausedBox = () =>
    h(
      "span",
      { class: "preempted", "data-role": "preempted", hidden: true },
      h("span", { class: "state", "data-state": "paused", "data-role": "paused" }),
      h("span", { class: "preempted-text", "data-role": "preempted-text" }),
    );

  // Its texts are empty while it is hidden: the request cell reads "#N model".
  function updatePaused(box, request) {
    const times = request.preemptions ?? 0;
    box.hidden = times === 0;
    if (times === 0) return;
    const paused = Boolean(request.paused);
    const badge = box.querySelector('[data-role="paused"]');
    badge.hidden = !paused;
    setText(badge, paused ? "paused" : "");
    const since = pausedFor(request);
    const count = `preempted ${fmt.plural(times, "time")}`;
    setText(
      box.querySelector('[data-role="preempted-text"]'),
      paused && since !== null ? `${count} · for ${fmt.duration(since)}` : count,
    );
    setAttr(
      box,
      "title",
      paused
        ? `${count} for more urgent work: it goes on where it stopped once served again`
        : `${count}, and resumed where it stopped`,
    );
  }

  // How far a request is from starting, under its wait: a bar filled to waited /
  // (waited + estimated time left), and "about N s". Nothing while llamaswap has no
  // estimate (eta_seconds null, or absent). One waiting for its load has waited since it
  // came, its time in the queue and since.
  const etaBox = () =>
    h(
      "span",
      { class: "eta", "data-role": "eta", hidden: true },
      h("span", { class: "eta-bar", "aria-hidden": "true" }, h("span", { class: "eta-fill" })),
      h("span", { class: "eta-text" }),
    );

  function updateEta(box, request) {
    const left = store.etaLeft(request.id);
    box.hidden = left === null;
    if (left === null) return;
    const spent = request.state === "loading" ? request.waited_ms + (store.monoNow() - request.at) : waited(request);
    box.querySelector(".eta-fill").style.width = `${(100 * spent) / Math.max(1, spent + left)}%`;
    setText(box.querySelector(".eta-text"), fmt.about(left));
    setAttr(box, "title", `estimated to start in ${fmt.duration(left)}, after ${fmt.duration(spent)} waiting`);
  }

  const cancelButton = (request) => {
    const button = h("button", { type: "button", class: "danger", "data-role": "cancel" }, "Cancel");
    button.setAttribute("aria-label", `Cancel request #${request.id}`);
    button.addEventListener("click", () => cancel(request.id, button));
    return button;
  };

  const requestCell = (request) =>
    h(
      "td",
      {},
      h("span", { class: "req-id" }, `#${request.id}`),
      " ",
      h("span", { class: "req-model", title: request.model }, request.model),
      pausedBox(),
    );

  const bandCell = (request) =>
    h(
      "td",
      { title: `priority ${fmt.priority(request.priority)}` },
      h("span", { class: "band", "data-band": request.band }, fmt.bandLabel(request.band)),
    );

  function createWaiting(request) {
    return h(
      "tr",
      {},
      h("td", { class: "num", "data-role": "pos" }),
      requestCell(request),
      bandCell(request),
      h("td", { class: "num", "data-role": "score" }),
      h("td", { class: "num" }, h("span", { "data-role": "waited" }), etaBox()),
      h("td", {}, cancelButton(request)),
    );
  }

  function updateWaiting(row, entry) {
    updatePaused(row.querySelector('[data-role="preempted"]'), entry.request);
    updateEta(row.querySelector('[data-role="eta"]'), entry.request);
    setText(row.querySelector('[data-role="pos"]'), entry.position);
    setText(row.querySelector('[data-role="score"]'), fmt.score(entry.score));
    setText(row.querySelector('[data-role="waited"]'), fmt.duration(waited(entry.request)));
    row.querySelector('[data-role="cancel"]').disabled = store.stale || cancelling.has(entry.request.id);
  }

  function createRunning(request) {
    return h(
      "tr",
      {},
      requestCell(request),
      h("td", {}, h("span", { class: "state", "data-role": "state" }), etaBox()),
      bandCell(request),
      h("td", { class: "num", "data-role": "score" }),
      h("td", { class: "num opt", "data-role": "waited" }),
      h("td", {}, cancelButton(request)),
    );
  }

  function updateRunning(row, request) {
    updatePaused(row.querySelector('[data-role="preempted"]'), request);
    const state = row.querySelector('[data-role="state"]');
    state.dataset.state = request.state;
    setText(state, request.state);
    // Waiting for its load: how far from being served. Serving: nothing to estimate.
    const eta = row.querySelector('[data-role="eta"]');
    if (request.state === "loading") updateEta(eta, request);
    else eta.hidden = true;
    setText(row.querySelector('[data-role="score"]'), fmt.score(request.score));
    setText(row.querySelector('[data-role="waited"]'), fmt.duration(waited(request)));
    row.querySelector('[data-role="cancel"]').disabled = store.stale || cancelling.has(request.id);
  }

  function createBand(band) {
    return h(
      "tr",
      {},
      h("td", {}, h("span", { class: "band", "data-band": band }, fmt.bandLabel(band))),
      h("td", { class: "num", "data-role": "depth" }),
      h("td", { class: "num", "data-role": "oldest" }),
      h("td", { class: "band", "data-band": band }, h("div", { class: "bar", "data-role": "bar" })),
    );
  }

  const render = batched(() => {
    const queue = store.queue;
    const since = store.monoNow() - queue.at;
    const depths = fmt.BANDS.map((band) => queue.bands?.[band]?.depth ?? 0);
    const most = Math.max(1, ...depths);
    syncList(bandsBody, fmt.BANDS, (band) => band, createBand, (row, band) => {
      const stats = queue.bands?.[band] ?? { depth: 0, oldest_wait_ms: 0 };
      setText(row.querySelector('[data-role="depth"]'), stats.depth);
      setText(
        row.querySelector('[data-role="oldest"]'),
        stats.depth ? fmt.duration(stats.oldest_wait_ms + since) : "—",
      );
      row.querySelector('[data-role="bar"]').style.width = `${(100 * stats.depth) / most}%`;
    });

    // The scheduler's order; requests queued since its last queue event go last.
    const waiting = [];
    const placed = new Set();
    queue.order.forEach((id, index) => {
      const request = store.requests.get(id);
      if (request === undefined || !waits(request)) return;
      placed.add(id);
      waiting.push({ request, score: queue.scores[index] ?? request.score });
    });
    for (const request of store.requests.values()) {
      if (waits(request) && !placed.has(request.id)) {
        waiting.push({ request, score: request.score });
      }
    }
    waiting.forEach((entry, index) => {
      entry.position = index + 1;
    });
    syncList(waitingBody, waiting, (entry) => entry.request.id, (entry) => createWaiting(entry.request), updateWaiting);
    $("#waiting").hidden = waiting.length === 0;
    $("#waiting-empty").hidden = waiting.length > 0;

    const running = [...store.requests.values()]
      .filter((request) => !waits(request))
      .sort((a, b) => a.id - b.id);
    syncList(runningBody, running, (request) => request.id, createRunning, updateRunning);
    $("#running").hidden = running.length === 0;
    $("#running-empty").hidden = running.length > 0;

    setText($("#queue-count"), `${waiting.length} waiting · ${running.length} in flight`);
    const hint =
      store.scheduler === "serial"
        ? "first served first: by score = priority + affinity + aging"
        : store.scheduler === "fifo"
          ? "first served first: by priority, then arrival, per model"
          : "";
    setText($("#order-hint"), hint);
  });

  store.on((what, detail) => {
    if (what === "requests" && FINISHED.has(detail.state)) cancelling.delete(detail.id);
    if (what === "snapshot") cancelling.clear(); // the snapshot says what is left (IDs may start again)
    if (["snapshot", "queue", "requests", "etas", "tick", "connection"].includes(what)) render();
  });
  render();
}
