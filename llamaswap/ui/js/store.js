// The dashboard's picture of llamaswap, kept up to date by /api/events.
//
// A snapshot replaces everything; each later event changes one thing. What the events do
// not carry is derived here, the way the server derives it:
// - in flight per model = its requests in state "serving" (granted, not yet released:
//   the router's own count);
// - the TTL countdown restarts when a ready model's last request finishes or leaves, as
//   the supervisor's idle deadline does; it is paused while requests for the model wait
//   or are in flight;
// - how long a load took = from its "starting" event to its "ready" event.
// GET /v1/models (names, ttl, loaded_since, ttl_left) is read with each snapshot (the
// app reconnects after a reload) and after a model changes state: on events, never on a
// timer.

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
    this.reset();
    this.refreshTimer = null;
  }

  reset() {
    this.scheduler = null;
    this.models = new Map();
    this.requests = new Map();
    this.queue = { waiting: 0, loading: 0, bands: {}, order: [], scores: [], at: performance.now() };
    this.activity = [];
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
        this.queue = { ...event, scores: event.scores ?? [], at: performance.now() };
        return this.emit("queue");
      case "activity":
        this.activity.unshift(event.record);
        this.activity.length = Math.min(this.activity.length, ACTIVITY_KEPT);
        return this.emit("activity", event.record);
      case "reload":
        // Models may have come or gone: the app reconnects for a fresh snapshot.
        this.lastReload = { ...event, at: Date.now() };
        return this.emit("reload");
      default:
        return undefined; // log events and future types: not ours
    }
  }

  onSnapshot(event) {
    const previous = this.models;
    this.reset();
    this.scheduler = event.scheduler;
    for (const entry of event.models) {
      const model = this.model(entry.model, previous.get(entry.model));
      if (model.state !== entry.state || model.pid !== entry.pid) {
        // Not the state this page followed (llamaswap may have restarted): what it
        // measured of that one no longer holds. GET /v1/models says the rest.
        model.loadedSince = null;
        model.ttlDeadline = null;
        model.loadStarted = null;
      }
      model.state = entry.state;
      model.pid = entry.pid;
    }
    for (const request of event.requests) this.requests.set(request.id, this.stamp(request));
    this.queue = { ...event.queue, scores: event.queue.scores ?? [], at: performance.now() };
    this.activity = [...event.activity];
    this.synced = true;
    this.emit("snapshot");
    this.refreshModels();
  }

  onModel(event) {
    const model = this.model(event.model);
    const now = Date.now();
    if (event.state === "starting" && model.state !== "starting") model.loadStarted = now;
    if (event.state === "ready" && model.state === "starting" && model.loadStarted !== null) {
      model.lastLoadMs = now - model.loadStarted;
    }
    if (event.state === "ready") {
      model.loadedSince = now;
      this.restartTtl(model);
    } else {
      model.ttlDeadline = null;
      if (event.state !== "stopping") model.loadedSince = null;
    }
    if (event.state !== "starting") model.loadStarted = null;
    model.state = event.state;
    model.pid = event.pid;
    this.emit("models");
    this.refreshModelsSoon();
  }

  onRequest(event) {
    const model = this.models.get(event.model);
    const before = model ? this.inFlight(event.model) : 0;
    const wantedBefore = model ? this.wanted(event.model) : 0;
    if (FINISHED.has(event.state)) this.requests.delete(event.id);
    else this.requests.set(event.id, this.stamp(event));
    this.emit("requests", event);
    if (model) {
      if (this.wanted(event.model) > 0) model.ttlDeadline = null;
      else if (wantedBefore > 0) this.restartTtl(model);
      if (this.inFlight(event.model) !== before) this.emit("models");
    }
  }

  stamp(request) {
    return { ...request, at: performance.now() };
  }

  // ------------------------------------------------------------------ models

  model(id, previous) {
    let model = this.models.get(id);
    if (model === undefined) {
      model = previous ?? {
        id,
        state: "stopped",
        pid: null,
        loadedSince: null,
        ttlDeadline: null,
        loadStarted: null,
        lastLoadMs: null,
      };
      this.models.set(id, model);
    }
    return model;
  }

  restartTtl(model) {
    const ttl = this.listed.get(model.id)?.ttl ?? null;
    const idle = this.wanted(model.id) === 0;
    model.ttlDeadline = ttl !== null && idle && model.state === "ready" ? Date.now() + ttl * 1000 : null;
  }

  inFlight(id) {
    let count = 0;
    for (const request of this.requests.values()) {
      if (request.model === id && request.state === "serving") count += 1;
    }
    return count;
  }

  // Requests for the model, waiting or in flight.
  wanted(id) {
    return this.inFlight(id) + this.waitingFor(id);
  }

  waitingFor(id) {
    let count = 0;
    for (const request of this.requests.values()) {
      if (request.model === id && request.state !== "serving") count += 1;
    }
    return count;
  }

  // Shown: every model /v1/models lists, and any other that is running (unlisted ones).
  visibleModels() {
    return [...this.models.values()].filter(
      (model) => this.listed.has(model.id) || model.state !== "stopped",
    );
  }

  refreshModelsSoon() {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => this.refreshModels(), 150);
  }

  async refreshModels() {
    clearTimeout(this.refreshTimer);
    let body;
    try {
      body = await api.json("v1/models");
    } catch {
      return; // the event stream's own reconnection reports trouble
    }
    const listed = new Map();
    const peers = [];
    const now = Date.now();
    for (const entry of body.data) {
      const status = entry.meta?.llamaswap;
      if (entry.meta?.peer !== undefined) {
        peers.push(entry.id);
        continue;
      }
      if (!status || !this.models.has(entry.id)) continue; // an alias entry, or not ours
      listed.set(entry.id, {
        name: entry.name,
        description: entry.description,
        ttl: status.ttl,
      });
      const model = this.models.get(entry.id);
      if (status.state === model.state) {
        model.loadedSince = status.loaded_since ? Date.parse(status.loaded_since) : null;
        model.ttlDeadline = status.ttl_left === null ? null : now + status.ttl_left * 1000;
      }
    }
    this.listed = listed;
    this.peers = peers;
    this.emit("models");
  }
}
