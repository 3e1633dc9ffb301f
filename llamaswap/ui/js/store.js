// The dashboard's picture of llamaswap, kept up to date by /api/events.
//
// A snapshot replaces everything; each later event changes one thing. A model event says
// all the page shows of it (its TTL countdown or that it is paused, how long it has
// loaded or been ready, its requests in flight and waiting): the page keeps no rule of
// its own. Times come as durations at the moment they were sent, and become moments on
// this page's clock as they arrive, so that a countdown runs on between events. How long
// a load took is the page's own measure: from its "starting" event to its "ready" event.
// GET /v1/models (names, descriptions, which models are listed) is read with each
// snapshot (the app reconnects after a reload), never on a timer. What the events do not
// carry, the devices' memory (GET /api/resources) and the estimates of when each waiting
// request starts (GET /api/inflight), is read by resources.js.

import * as api from "./api.js";

const FINISHED = new Set(["done", "failed", "cancelled"]);
const ACTIVITY_KEPT = 500;

export class Store {
  constructor() {
    this.listeners = new Set();
    this.connection = { state: "connecting", retryAt: null };
    this.synced = false; // a snapshot has come: there is something to show
    // Not live since the event stream broke (or a key is wanted): what the page shows is
    // the last state it heard, its clock stopped at that moment (`frozen`) so that nothing
    // counts on, and its buttons are off until a fresh snapshot.
    this.stale = false;
    this.frozen = null;
    this.lastReload = null;
    this.listed = new Map(); // /v1/models entries of local models, by ID
    this.peers = [];
    // The last GET /api/resources (null: none yet, or a llamaswap without the route).
    this.resources = null;
    this.reset();
  }

  reset() {
    this.scheduler = null;
    this.profile = null; // the active profile's name
    this.models = new Map();
    this.requests = new Map();
    this.queue = { waiting: 0, loading: 0, bands: {}, order: [], scores: [], at: performance.now() };
    this.activity = [];
    // Request ID -> {seconds, at}: when it is estimated to start, as llamaswap said at
    // `at` (this page's clock); counted down here until the next estimate.
    this.etas = new Map();
  }

  on(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  emit(what, detail) {
    for (const listener of this.listeners) listener(what, detail);
  }

  setConnection(state, retryAt = null) {
    this.connection = { state, retryAt };
    // "connecting" alone is not stale: the page reconnects at once after a reload.
    if (state === "retrying" || state === "key") {
      this.stale = true;
      this.frozen ??= { wall: Date.now(), mono: performance.now() };
    } else if (state === "live") {
      this.stale = false;
      this.frozen = null;
    }
    this.emit("connection");
  }

  // Date.now() and performance.now(), stopped while the page is stale.
  now() {
    return this.frozen?.wall ?? Date.now();
  }

  monoNow() {
    return this.frozen?.mono ?? performance.now();
  }

  // ------------------------------------------------------------------ events

  apply(event) {
    switch (event.type) {
      case "snapshot":
        return this.onSnapshot(event);
      case "model":
        return this.onModel(event);
      case "request":
        return this.onRequest(event);
      case "queue":
        this.onQueue(event);
        return this.emit("queue");
      case "activity":
        this.activity.unshift(event.record);
        this.activity.length = Math.min(this.activity.length, ACTIVITY_KEPT);
        return this.emit("activity", event.record);
      case "load":
        return this.emit("load", event); // a load began: what it needs and evicts is in /api/resources
      case "profileChanged":
        return this.setProfile(event.profile);
      case "reload":
        // Models may have come or gone: the app reconnects for a fresh snapshot.
        this.lastReload = { ...event, at: Date.now() };
        return this.emit("reload");
      default:
        return undefined; // log events and future types: not ours
    }
  }

  setProfile(profile) {
    this.profile = profile;
    this.emit("profile");
  }

  onSnapshot(event) {
    const previous = this.models;
    this.reset();
    this.scheduler = event.scheduler;
    this.profile = event.profile ?? null;
    for (const entry of event.models) {
      this.follow(this.model(entry.model, previous.get(entry.model)), entry);
    }
    for (const request of event.requests) this.requests.set(request.id, this.stamp(request));
    this.onQueue(event.queue);
    this.activity = [...event.activity];
    this.synced = true;
    this.emit("snapshot");
    this.refreshModels();
  }

  // The queue, and when each waiting request is estimated to start (eta_ms, by ID).
  onQueue(queue) {
    this.queue = { ...queue, scores: queue.scores ?? [], at: performance.now() };
    for (const [id, ms] of Object.entries(queue.eta_ms ?? {})) {
      this.setEta(Number(id), ms === null ? null : ms / 1000);
    }
  }

  onModel(event) {
    const model = this.model(event.model);
    const { state, loadStarted } = model;
    this.follow(model, event);
    if (event.state === "ready" && state === "starting" && loadStarted !== null) {
      model.lastLoadMs = model.loadedSince - loadStarted;
    }
    this.emit("models");
  }

  // What a model event (or a snapshot's entry) says, its durations as moments on this
  // page's clock.
  follow(model, entry) {
    const now = Date.now();
    const at = (ms, sign) => (ms === null ? null : now + sign * ms);
    model.state = entry.state;
    model.pid = entry.pid;
    model.ttl = entry.ttl;
    model.ttlDeadline = at(entry.ttl_left_ms, 1);
    model.ttlPaused = entry.ttl_paused;
    model.loadStarted = at(entry.loading_for_ms, -1);
    model.loadedSince = at(entry.loaded_for_ms, -1);
    model.inFlight = entry.in_flight;
    model.waiting = entry.waiting;
    model.failure = entry.failure; // why its last start failed, while "failed"
  }

  onRequest(event) {
    if (FINISHED.has(event.state)) {
      this.requests.delete(event.id);
      this.etas.delete(event.id);
    } else {
      this.requests.set(event.id, this.stamp(event));
      if (event.eta_seconds !== undefined) this.setEta(event.id, event.eta_seconds);
    }
    this.emit("requests", event);
  }

  stamp(request) {
    return { ...request, at: performance.now() };
  }

  // ------------------------------------------------------------- estimates

  setEta(id, seconds) {
    if (seconds === null || seconds === undefined) this.etas.delete(id);
    else this.etas.set(id, { seconds, at: performance.now() });
  }

  // What /api/inflight says now (read while requests wait, so that an estimate is
  // corrected between queue events): its estimates replace the page's.
  setEtas(entries) {
    this.etas = new Map();
    for (const entry of entries) {
      if (this.requests.has(entry.id)) this.setEta(entry.id, entry.eta_seconds);
    }
    this.emit("etas");
  }

  // Milliseconds until request `id` is estimated to start, counted down from the last
  // estimate (0 once that moment has passed); null when llamaswap gave none.
  etaLeft(id) {
    const eta = this.etas.get(id);
    if (eta === undefined) return null;
    return Math.max(0, eta.seconds * 1000 - (this.monoNow() - eta.at));
  }

  setResources(document) {
    this.resources = document;
    this.emit("resources");
  }

  // ------------------------------------------------------------------ models

  model(id, previous) {
    let model = this.models.get(id);
    if (model === undefined) {
      model = previous ?? {
        id,
        state: "stopped",
        pid: null,
        ttl: null,
        ttlDeadline: null,
        ttlPaused: false,
        loadStarted: null,
        loadedSince: null,
        lastLoadMs: null,
        inFlight: 0,
        waiting: 0,
      };
      this.models.set(id, model);
    }
    return model;
  }

  // A model's colour, 0 to 7: its place among the models llamaswap knows, in ID order, so
  // that its card and its part of a memory bar match.
  colour(id) {
    const ids = [...this.models.keys()].sort((a, b) => a.localeCompare(b));
    const at = ids.indexOf(id);
    return (at === -1 ? ids.length : at) % 8;
  }

  // Shown: every model /v1/models lists, and any other that is running (unlisted ones).
  visibleModels() {
    return [...this.models.values()].filter(
      (model) => this.listed.has(model.id) || model.state !== "stopped",
    );
  }

  async refreshModels() {
    let body;
    try {
      body = await api.json("v1/models");
    } catch {
      return; // the event stream's own reconnection reports trouble
    }
    const listed = new Map();
    const peers = [];
    for (const entry of body.data) {
      const status = entry.meta?.llamaswap;
      if (entry.meta?.peer !== undefined) {
        peers.push(entry.id);
        continue;
      }
      if (!status || !this.models.has(entry.id)) continue; // an alias entry, or not ours
      listed.set(entry.id, { name: entry.name, description: entry.description });
    }
    this.listed = listed;
    this.peers = peers;
    this.emit("models");
  }
}
