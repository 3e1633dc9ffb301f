// Models: each model's state, live, with its load time, TTL, requests, its memory (from
// GET /api/resources, read by resources.js), and the buttons to load it, unload it, or
// cancel its load. Its colour swatch is its colour on the memory bars. A model whose
// start failed says why (its exit status and last lines) until its next start.

import * as api from "./api.js";
import { $, batched, h, setAttr, setText, syncList, toast } from "./dom.js";
import * as fmt from "./format.js";

export function mountModels(store) {
  const grid = $("#models");
  const loading = new Set(); // models this page asked to load and is waiting for
  const cancelled = new Set(); // ... and whose load this page's Cancel load ended

  async function load(id) {
    loading.add(id);
    render();
    try {
      await api.post(`api/models/load/${encodeURIComponent(id)}`);
      toast(`${id} is ready`);
    } catch (error) {
      // Cancel load says so itself: one toast for one click.
      if (!(error.code === "request_cancelled" && cancelled.has(id))) {
        toast(`Load of ${id} ended: ${error.message}`, { bad: error.code !== "request_cancelled" });
      }
    } finally {
      loading.delete(id);
      cancelled.delete(id);
      render();
    }
  }

  async function unload(id) {
    try {
      await api.post(`api/models/unload/${encodeURIComponent(id)}`);
      toast(`${id} unloaded`);
    } catch (error) {
      toast(`Unload of ${id} failed: ${error.message}`, { bad: true });
    }
  }

  // A load is a swap that requests wait for; it stops when none waits any more. So
  // cancelling it cancels the requests waiting for it (their clients get a 499).
  async function cancelLoad(id) {
    const waiting = [...store.requests.values()].filter(
      (request) => request.model === id && request.state === "loading",
    );
    if (loading.has(id)) cancelled.add(id); // its request is among them
    const results = await Promise.allSettled(
      waiting.map((request) => api.post(`api/inflight/${request.id}/cancel`)),
    );
    const failed = results.filter((result) => result.status === "rejected");
    if (failed.length) cancelled.delete(id); // its load may still end: say so then
    if (failed.length) toast(`Cancel failed: ${failed[0].reason.message}`, { bad: true });
    else toast(`Cancelled the load of ${id} (${fmt.plural(waiting.length, "request")})`);
  }

  function create(model) {
    const id = model.id;
    const el = h(
      "article",
      { class: "model", "aria-label": `Model ${id}` },
      h(
        "div",
        { class: "model-head" },
        h("span", { class: "model-name" }, h("span", { class: "swatch", "data-role": "swatch", "aria-hidden": "true" }), id),
        h("span", { class: "state", "data-role": "state" }),
      ),
      h("div", { class: "model-title", "data-role": "title" }),
      h(
        "div",
        { class: "failure", "data-role": "failure", hidden: true },
        h("div", { class: "failure-reason", "data-role": "reason" }),
        h("pre", { class: "failure-output", "data-role": "output", "aria-label": `Last output of ${id}` }),
      ),
      h(
        "dl",
        { class: "facts" },
        h("dt", {}, "Loaded"),
        h("dd", { "data-role": "since" }),
        h("dt", {}, "In flight"),
        h("dd", { "data-role": "inflight" }),
        h("dt", {}, "Load took"),
        h("dd", { "data-role": "took" }),
        h("dt", {}, "Waiting"),
        h("dd", { "data-role": "waiting" }),
        h("dt", {}, "TTL left"),
        h("dd", { "data-role": "ttl" }),
        h("dt", {}, "PID"),
        h("dd", { "data-role": "pid" }),
        h(
          "div",
          { class: "facts-row", "data-role": "memory-facts" },
          h("dt", {}, "Memory"),
          h("dd", { class: "wide" }, h("span", { "data-role": "memory" }), h("span", { "data-role": "held" })),
        ),
      ),
      h(
        "div",
        { class: "actions" },
        h("button", { type: "button", "data-role": "load", "aria-label": `Load ${id}`, onclick: () => load(id) }, "Load"),
        h("button", { type: "button", "data-role": "unload", "aria-label": `Unload ${id}`, onclick: () => unload(id) }, "Unload"),
        h(
          "button",
          { type: "button", class: "danger", "data-role": "cancel", "aria-label": `Cancel load of ${id}`, onclick: () => cancelLoad(id) },
          "Cancel load",
        ),
      ),
    );
    return el;
  }

  const part = (el, role) => el.querySelector(`[data-role="${role}"]`);

  // Its need (declared in the config, or learned from the GPU) and what it holds now,
  // summed over its devices; the titles have them device by device.
  function updateMemory(el, entry) {
    // Nothing to say where llamaswap knows of no device (no GPU probe, none declared).
    part(el, "memory-facts").hidden = !store.resources?.devices?.length;
    const total = (sizes) => Object.values(sizes).reduce((a, b) => a + b, 0);
    const byDevice = (sizes) => Object.entries(sizes).map(([device, bytes]) => `${fmt.size(bytes)} on ${device}`).join(", ");
    const need = entry?.memory ?? null;
    const held = entry?.memory_held ?? {};
    const memory = part(el, "memory");
    let text = "—";
    if (entry !== undefined) text = need === null ? "needs: unknown" : `needs ${fmt.size(total(need))} (${entry.memory_source})`;
    setText(memory, text);
    setAttr(memory, "title", need === null ? (entry ? "not declared, and not learned yet" : null) : `needs ${byDevice(need)} (${entry.memory_source})`);
    const holds = part(el, "held");
    const holding = Object.keys(held).length > 0;
    setText(holds, holding ? ` · holds ${fmt.size(total(held))}` : "");
    setAttr(holds, "title", holding ? `holds ${byDevice(held)}, measured` : null);
  }

  // Why its last start failed: the reason (the whole error in its title), and its last
  // lines of output, if it printed any.
  function updateFailure(el, failure) {
    part(el, "failure").hidden = !failure;
    if (!failure) return;
    const reason = part(el, "reason");
    setText(reason, `Start failed: ${failure.reason}`);
    setAttr(reason, "title", failure.message);
    const output = part(el, "output");
    output.hidden = failure.output.length === 0;
    setText(output, failure.output.join("\n"));
  }

  function update(el, model) {
    const now = store.now(); // stopped while the page is stale
    const info = store.listed.get(model.id);
    el.dataset.state = model.state;
    const state = part(el, "state");
    state.dataset.state = model.state;
    setText(state, model.state);
    setText(part(el, "title"), info && info.name !== model.id ? info.name : info ? "" : "unlisted");
    setAttr(part(el, "title"), "title", info?.description || null);
    setText(part(el, "pid"), model.pid ?? "—");
    updateFailure(el, model.failure);
    part(el, "swatch").dataset.colour = store.colour(model.id);
    updateMemory(el, store.resources?.models?.[model.id]);
    const since = part(el, "since");
    setText(since, model.loadedSince === null ? "—" : `${fmt.ago(now - model.loadedSince)} ago`);
    setAttr(since, "title", model.loadedSince === null ? null : `ready since ${fmt.clock(model.loadedSince)}`);
    let took = model.lastLoadMs === null ? "—" : fmt.duration(model.lastLoadMs);
    if (model.state === "starting" && model.loadStarted !== null) {
      took = `${fmt.duration(now - model.loadStarted)}…`;
    }
    setText(part(el, "took"), took);
    // What the last model event said: its countdown runs on here between events.
    let ttl = "—";
    let ttlTitle = null;
    if (model.ttl === null) {
      ttl = "none";
      ttlTitle = "no ttl: it stays loaded until evicted or unloaded";
    } else if (model.ttlPaused) {
      ttl = "paused";
      ttlTitle = `the ${fmt.duration(model.ttl * 1000)} countdown starts again when the requests for it finish`;
    } else if (model.ttlDeadline !== null) {
      ttl = fmt.duration(Math.max(0, model.ttlDeadline - now));
      ttlTitle = `unloaded at ${fmt.clock(model.ttlDeadline)} if no request comes`;
    }
    setText(part(el, "ttl"), ttl);
    setAttr(part(el, "ttl"), "title", ttlTitle);
    setText(part(el, "inflight"), model.inFlight);
    setText(part(el, "waiting"), model.waiting);
    const waitingForLoad = [...store.requests.values()].some(
      (request) => request.model === model.id && request.state === "loading",
    );
    // Stale (not connected): the state shown may be gone, and any click would fail.
    const stopped = model.state === "stopped" || model.state === "failed"; // nothing runs
    part(el, "load").disabled = store.stale || !stopped || loading.has(model.id);
    part(el, "unload").disabled = store.stale || stopped;
    part(el, "cancel").hidden = !(model.state === "starting" || waitingForLoad);
    part(el, "cancel").disabled = store.stale || !waitingForLoad;
  }

  const render = batched(() => {
    const models = store.visibleModels().sort((a, b) => a.id.localeCompare(b.id));
    syncList(grid, models, (model) => model.id, create, update);
    $("#models-empty").hidden = models.length > 0;
    const ready = models.filter((model) => model.state === "ready").length;
    setText($("#models-count"), models.length ? `${ready} of ${models.length} ready` : "");
  });

  store.on((what) => {
    if (["snapshot", "models", "requests", "resources", "tick", "connection"].includes(what)) render();
  });
  render();
}
