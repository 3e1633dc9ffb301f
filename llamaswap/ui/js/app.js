// The dashboard: one /api/events stream feeds the store; the panels render the store.

import * as api from "./api.js";
import { $, h, setText, toast } from "./dom.js";
import * as fmt from "./format.js";
import { mountActivity } from "./activity.js";
import { mountLogs } from "./logs.js";
import { mountMemory } from "./memory.js";
import { mountModels } from "./models.js";
import { mountPlayground } from "./playground.js";
import { mountProfiles } from "./profiles.js";
import { mountQueue } from "./queue.js";
import { followResources } from "./resources.js";
import { mountStats } from "./stats.js";
import { Store } from "./store.js";

const store = new Store();
let stream = null; // the AbortController of the open /api/events request

// ------------------------------------------------------------------- the key

const waitingForKey = [];

function openKeyDialog(message) {
  const dialog = $("#key-dialog");
  setText($("#key-error"), message);
  $("#key-btn").hidden = false;
  if (!dialog.open) dialog.showModal();
  $("#key-input").focus();
}

function askForKey(message) {
  store.setConnection("key");
  openKeyDialog(message);
  return new Promise((resolve) => waitingForKey.push(resolve));
}

$("#key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = $("#key-input").value.trim();
  if (!value) return;
  const problem = api.keyProblem(value);
  if (problem !== null) {
    setText($("#key-error"), problem); // no server could take it: ask again at once
    $("#key-input").focus();
    return;
  }
  api.setKey(value, $("#key-remember").checked);
  $("#key-input").value = "";
  $("#key-dialog").close();
  if (waitingForKey.length) {
    for (const resolve of waitingForKey.splice(0)) resolve();
  } else {
    reconnect(); // a new key chosen from the header: start again with it
  }
});
$("#key-btn").addEventListener("click", () => openKeyDialog(""));
api.onKeyNeeded(askForKey);

// ------------------------------------------------------------ the event stream

function reconnect() {
  stream?.abort();
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Reads /api/events for as long as the page is open. A new connection starts with a
// fresh snapshot, so after a drop (or a "dropped" event: we fell behind) the page is
// right again. Retries back off from 1 s to 15 s: this only runs when the stream broke.
async function follow() {
  let delay = 1000;
  for (;;) {
    const controller = new AbortController();
    stream = controller;
    try {
      const response = await api.request("api/events", { signal: controller.signal });
      if (!response.ok) throw new api.ApiError(response.status, null);
      for await (const message of api.events(response, controller.signal)) {
        const event = JSON.parse(message.data);
        if (event.type === "dropped") {
          controller.abort(); // we fell behind: start again from a fresh snapshot, now
          break;
        }
        const afterBreak = event.type === "snapshot" && store.stale;
        if (event.type === "snapshot") {
          store.setConnection("live");
          delay = 1000;
        }
        store.apply(event);
        if (afterBreak) dropReloadResult(); // llamaswap may have restarted, with another config
      }
    } catch (error) {
      if (!controller.signal.aborted) console.warn("llamaswap: event stream:", error.message);
    }
    if (controller.signal.aborted) {
      store.setConnection("connecting");
      continue; // asked to reconnect: at once
    }
    store.setConnection("retrying", Date.now() + delay);
    await sleep(delay);
    delay = Math.min(delay * 2, 15000);
    store.setConnection("connecting");
  }
}

// ------------------------------------------------------------------- header

function renderConnection() {
  const { state, retryAt } = store.connection;
  $("#conn").dataset.state = state;
  let text = "connecting…";
  if (state === "live") text = "live";
  if (state === "key") text = "waiting for an API key";
  if (state === "retrying") {
    const seconds = Math.max(0, Math.ceil((retryAt - Date.now()) / 1000));
    text = `disconnected, retrying in ${seconds} s`;
  }
  setText($("#conn-text"), text);
  setText($("#sched"), store.scheduler ? `scheduler: ${store.scheduler}` : "");

  // Nothing is shown before the first snapshot, nor while a key is wanted: empty panels
  // would read as "no models, no requests". After the stream broke the panels stay,
  // dimmed and with their buttons off, until a fresh snapshot.
  const shown = store.synced && state !== "key";
  let note = "";
  if (state === "key") note = "An API key is needed: nothing is shown until one is accepted (the API key button above asks for it).";
  else if (!store.synced) note = state === "retrying" ? "llamaswap does not answer yet." : "Connecting to llamaswap…";
  else if (store.stale) note = "Not live: this is the last state llamaswap sent. The buttons come back when the page reconnects.";
  setText($("#gate"), note);
  $("#gate").hidden = note === "";
  for (const part of document.querySelectorAll("main > .panel, main > .live-grid")) part.hidden = !shown;
  $("#main").classList.toggle("stale", store.stale);
  $("#reload-btn").disabled = store.stale || reloading;
}

const CHANGE_KINDS = ["added", "removed", "restarted", "updated", "settings", "at_start"];

// The result's details open under the header, in the page's flow: they push the panels
// down rather than cover them. The summary opens and closes them.
function showReloadDetails(open) {
  $("#reload-summary").setAttribute("aria-expanded", String(open));
  $("#reload-details").hidden = !open;
}

function dropReloadResult() {
  store.lastReload = null;
  $("#reload-summary").hidden = true;
  showReloadDetails(false);
}

function renderReload() {
  const result = store.lastReload;
  const box = $("#reload-summary");
  if (result === null) return;
  box.hidden = false;
  box.dataset.ok = String(result.ok);
  const when = fmt.clock(result.at);
  const details = $("#reload-details");
  details.replaceChildren();
  if (result.ok) {
    const counts = CHANGE_KINDS.map((kind) => [kind, result.changed?.[kind] ?? []]).filter(
      ([, models]) => models.length,
    );
    const summary = counts.length
      ? counts.map(([kind, models]) => `${models.length} ${kind.replace("_", " ")}`).join(", ")
      : "nothing changed";
    setText($("#reload-summary"), `Reloaded at ${when} (${result.trigger}): ${summary}`);
    const list = h("ul");
    for (const [kind, models] of counts) {
      list.append(h("li", {}, `${kind.replace("_", " ")}: ${models.join(", ")}`));
    }
    const unchanged = result.changed?.unchanged ?? [];
    if (unchanged.length) list.append(h("li", {}, `unchanged: ${unchanged.join(", ")}`));
    details.append(list.children.length ? list : h("p", {}, "The configuration is the same."));
  } else {
    const problems = result.problems ?? [];
    setText(
      $("#reload-summary"),
      `Reload refused at ${when} (${result.trigger ?? "api"}): ${fmt.plural(problems.length, "problem")}; the running config stays`,
    );
    details.append(h("ul", {}, problems.map((problem) => h("li", {}, problem))));
  }
}

let reloading = false;

async function reloadConfig() {
  reloading = true;
  renderConnection();
  try {
    const result = await api.post("api/config/reload");
    store.lastReload = { ...result, at: Date.now() };
  } catch (error) {
    if (error.body && "ok" in error.body) {
      store.lastReload = { ...error.body, at: Date.now() };
    } else {
      toast(`Reload failed: ${error.message}`, { bad: true });
    }
  } finally {
    reloading = false;
    renderConnection();
  }
  renderReload();
}

async function showVersion() {
  try {
    const v = await api.json("api/version");
    setText($("#version"), `llamaswap ${v.version} · Python ${v.python} · Trio ${v.trio} · Hypercorn ${v.hypercorn}`);
  } catch {
    // not essential
  }
}

// --------------------------------------------------------------------- tabs

function setUpTabs(onShow) {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  const select = (tab, focus, remember = true) => {
    for (const other of tabs) {
      const selected = other === tab;
      other.setAttribute("aria-selected", String(selected));
      other.tabIndex = selected ? 0 : -1;
      document.getElementById(other.getAttribute("aria-controls")).hidden = !selected;
    }
    if (focus) tab.focus();
    const name = tab.id.replace("tab-", "");
    if (remember) history.replaceState(null, "", `#${name}`); // a reload shows it again
    onShow(name);
  };
  for (const tab of tabs) {
    tab.addEventListener("click", () => select(tab, false));
    tab.addEventListener("keydown", (event) => {
      const at = tabs.indexOf(tab);
      const to = {
        ArrowRight: (at + 1) % tabs.length,
        ArrowLeft: (at - 1 + tabs.length) % tabs.length,
        Home: 0,
        End: tabs.length - 1,
      }[event.key];
      if (to === undefined) return;
      event.preventDefault();
      select(tabs[to], true);
    });
  }
  const initial = tabs.find((tab) => `#${tab.id.replace("tab-", "")}` === location.hash);
  select(initial ?? tabs[0], false, false);
}

// --------------------------------------------------------------------- boot

store.on((what) => {
  if (what === "connection" || what === "snapshot") renderConnection();
  if (what === "reload") {
    renderReload();
    reconnect(); // models may have come or gone: a fresh snapshot says which
  }
});
setInterval(() => {
  store.emit("tick");
  if (store.connection.state === "retrying") renderConnection();
}, 1000);

$("#reload-btn").addEventListener("click", reloadConfig);
$("#reload-summary").addEventListener("click", (event) => {
  showReloadDetails(event.currentTarget.getAttribute("aria-expanded") !== "true");
});
mountModels(store);
mountMemory(store);
mountQueue(store);
const activity = mountActivity(store);
const stats = mountStats(store);
const logs = mountLogs(store);
mountPlayground(store);
mountProfiles(store);
setUpTabs((name) => {
  logs.show(name === "logs");
  activity.show(name === "activity");
  stats.show(name === "activity");
});
renderConnection();
follow();
followResources(store);
showVersion();
