// Activity: finished requests, newest first, live. Columns sort (click) and move (drag,
// or Shift+←/→ on a heading); filters by model, band and status. Order and sort are
// remembered in localStorage. A captured request's row opens its capture (capture.js).
//
// Records come from GET /api/activity (when the stream connects and when a filter
// changes) and from "activity" events. Filters are applied here as well as sent to the
// server, so a live record that does not match stays out.

import * as api from "./api.js";
import { showCapture } from "./capture.js";
import { $, batched, h, setText, syncList } from "./dom.js";
import * as fmt from "./format.js";

const KEPT = 1000;
const SHOWN = 500;
const FETCHED = 200;
const LONG = 90; // characters shown of a long error before it folds
const ORDER_KEY = "llamaswap.activity.columns";
const SORT_KEY = "llamaswap.activity.sort";
const DEFAULT_SORT = { column: "id", descending: true };

const tps = (value) => fmt.number(value, 1);
const bandRank = (band) => (band ? fmt.BANDS.length - fmt.BANDS.indexOf(band) : null);

// id, heading, value (for sorting; null sorts last), text, and options.
const COLUMNS = [
  { id: "time", label: "Time", value: (r) => r.time, text: (r) => fmt.isoClock(r.time), title: (r) => r.time },
  { id: "id", label: "ID", num: true, value: (r) => r.id },
  // The request's number, as the queue and the log show it (#N): none if never queued.
  { id: "request", label: "Request", num: true, value: (r) => r.request ?? null, text: (r) => (r.request == null ? null : `#${r.request}`) },
  { id: "model", label: "Model", value: (r) => r.model || null, clip: true },
  { id: "route", label: "Route", value: (r) => `${r.method} ${r.path}`, clip: true },
  { id: "status", label: "Status", num: true, value: (r) => r.status, bad: (r) => r.status >= 400 },
  // What it sent and was answered, when its model captures: a button opens it.
  { id: "capture", label: "Capture", value: (r) => (r.captured ? 1 : null), capture: true },
  { id: "priority", label: "Priority", num: true, value: (r) => r.priority, text: (r) => fmt.priority(r.priority) },
  { id: "band", label: "Band", value: (r) => bandRank(r.band), text: (r) => fmt.bandLabel(r.band), band: true },
  { id: "score", label: "Score", num: true, value: (r) => r.score, text: (r) => fmt.score(r.score) },
  { id: "queue_wait", label: "Queue wait", num: true, value: (r) => r.queue_wait_ms, text: (r) => fmt.duration(r.queue_wait_ms) },
  { id: "ttft", label: "TTFT", num: true, value: (r) => r.ttft_ms ?? null, text: (r) => fmt.duration(r.ttft_ms) },
  { id: "duration", label: "Duration", num: true, value: (r) => r.duration_ms, text: (r) => fmt.duration(r.duration_ms) },
  { id: "prompt_tokens", label: "Prompt tok", num: true, value: (r) => r.prompt_tokens },
  { id: "cached_tokens", label: "Cached tok", num: true, value: (r) => r.cached_tokens ?? null },
  { id: "completion_tokens", label: "Output tok", num: true, value: (r) => r.completion_tokens },
  {
    id: "prompt_tps",
    label: "Prompt tok/s",
    num: true,
    value: (r) => r.prompt_tokens_per_second ?? null,
    text: (r) => tps(r.prompt_tokens_per_second),
  },
  {
    id: "generation_tps",
    label: "Gen tok/s",
    num: true,
    value: (r) => r.generation_tokens_per_second ?? null,
    text: (r) => tps(r.generation_tokens_per_second),
  },
  {
    // Speculative decoding: the draft model's tokens the model accepted, of those proposed.
    id: "draft",
    label: "Draft acc.",
    num: true,
    value: (r) => (r.draft_tokens ? r.draft_accepted_tokens / r.draft_tokens : null),
    text: (r) => (r.draft_tokens ? `${r.draft_accepted_tokens}/${r.draft_tokens}` : null),
  },
  { id: "error", label: "Error", value: (r) => r.error, fold: true },
  { id: "metadata", label: "Metadata", value: (r) => JSON.stringify(r.metadata ?? {}), meta: true },
];
const BY_ID = new Map(COLUMNS.map((column) => [column.id, column]));

function loadJson(key, fallback) {
  try {
    return JSON.parse(localStorage.getItem(key)) ?? fallback;
  } catch {
    return fallback;
  }
}

function initialOrder() {
  const saved = loadJson(ORDER_KEY, []);
  const order = Array.isArray(saved) ? saved.filter((id) => BY_ID.has(id)) : [];
  for (const column of COLUMNS) if (!order.includes(column.id)) order.push(column.id);
  return order;
}

function matchesStatus(filter, status) {
  if (!filter) return true;
  const range = /^([1-5])xx$/.exec(filter);
  if (range) return Math.floor(status / 100) === Number(range[1]);
  return status === Number(filter);
}

export function mountActivity(store) {
  const table = $("#activity");
  const headRow = table.querySelector("thead tr");
  const body = table.querySelector("tbody");
  const form = $("#activity-filters");
  const records = new Map(); // id → record
  const fresh = new Set(); // IDs that arrived live, highlighted once
  let order = initialOrder();
  let sort = { ...DEFAULT_SORT, ...loadJson(SORT_KEY, {}) };
  if (!BY_ID.has(sort.column)) sort = { ...DEFAULT_SORT };
  let visible = true;
  let layout = 0; // bumped when columns move: rows are rebuilt
  let fetching = null;

  const filters = () => Object.fromEntries(new FormData(form));

  function matches(record) {
    const f = filters();
    return (
      (!f.model || record.model === f.model) &&
      (!f.band || record.band === f.band) &&
      matchesStatus(f.status, record.status)
    );
  }

  function add(record) {
    records.set(record.id, record);
    if (records.size > KEPT) {
      const oldest = Math.min(...records.keys());
      records.delete(oldest);
    }
  }

  async function fetchRecords() {
    fetching?.abort();
    const controller = new AbortController();
    fetching = controller;
    const params = new URLSearchParams({ limit: String(FETCHED) });
    for (const [name, value] of Object.entries(filters())) if (value) params.set(name, value);
    try {
      const answer = await api.json(`api/activity?${params}`, { signal: controller.signal });
      for (const record of answer.activity) add(record);
      render();
    } catch (error) {
      if (!controller.signal.aborted) console.warn("llamaswap: activity:", error.message);
    }
  }

  // ------------------------------------------------------------ columns

  function saveLayout() {
    localStorage.setItem(ORDER_KEY, JSON.stringify(order));
    localStorage.setItem(SORT_KEY, JSON.stringify(sort));
  }

  function move(id, to) {
    const from = order.indexOf(id);
    if (from === -1 || to < 0 || to >= order.length || from === to) return;
    order.splice(from, 1);
    order.splice(to, 0, id);
    layout += 1;
    saveLayout();
    renderHead();
    render();
  }

  function sortBy(id) {
    sort = sort.column === id ? { column: id, descending: !sort.descending } : { column: id, descending: BY_ID.get(id).num === true };
    saveLayout();
    renderHead();
    render();
  }

  let dragged = null;

  function renderHead() {
    const focused = document.activeElement?.closest?.("th")?.dataset.column;
    headRow.replaceChildren(
      ...order.map((id) => {
        const column = BY_ID.get(id);
        const th = h("th", { scope: "col", class: column.num ? "num" : null, draggable: "true", "data-column": id });
        if (sort.column === id) th.setAttribute("aria-sort", sort.descending ? "descending" : "ascending");
        const button = h("button", { type: "button", title: "Sort; drag or Shift+←/→ to move" }, column.label);
        button.addEventListener("click", () => sortBy(id));
        button.addEventListener("keydown", (event) => {
          if (!event.shiftKey || (event.key !== "ArrowLeft" && event.key !== "ArrowRight")) return;
          event.preventDefault();
          move(id, order.indexOf(id) + (event.key === "ArrowLeft" ? -1 : 1));
        });
        th.append(button);
        th.addEventListener("dragstart", (event) => {
          dragged = id;
          th.classList.add("dragging");
          event.dataTransfer.effectAllowed = "move";
          event.dataTransfer.setData("text/plain", id);
        });
        th.addEventListener("dragend", () => {
          dragged = null;
          th.classList.remove("dragging");
        });
        th.addEventListener("dragover", (event) => {
          if (dragged === null || dragged === id) return;
          event.preventDefault();
          th.classList.add("drag-over");
        });
        th.addEventListener("dragleave", () => th.classList.remove("drag-over"));
        th.addEventListener("drop", (event) => {
          event.preventDefault();
          th.classList.remove("drag-over");
          const source = dragged ?? event.dataTransfer.getData("text/plain");
          if (!BY_ID.has(source) || source === id) return;
          move(source, order.indexOf(id));
        });
        return th;
      }),
    );
    if (focused) headRow.querySelector(`th[data-column="${focused}"] button`)?.focus();
  }

  // --------------------------------------------------------------- rows

  function cell(column, record) {
    const td = h("td", { class: column.num ? "num" : null });
    if (column.meta) {
      const entries = Object.entries(record.metadata ?? {});
      td.append(
        h(
          "span",
          { class: "meta" },
          entries.map(([key, value]) => h("code", {}, `${key}=${typeof value === "string" ? value : JSON.stringify(value)}`)),
        ),
      );
      return td;
    }
    if (column.capture && record.captured) {
      const label = `View the capture of record ${record.id}`;
      td.append(h("button", { type: "button", "aria-label": label, title: label, onclick: () => showCapture(record) }, "View"));
      return td;
    }
    const value = column.text ? column.text(record) : column.value(record);
    const text = value === null || value === undefined || value === "" ? "—" : String(value);
    if (column.band && record.band) td.append(h("span", { class: "band", "data-band": record.band }, text));
    else if (column.fold && text.length > LONG) {
      // Long text (an error with a model's last output lines) folds: open it to read it.
      td.append(h("details", {}, h("summary", {}, `${text.slice(0, LONG - 20)}…`), h("div", {}, text)));
    } else td.append(text);
    if (column.bad?.(record)) td.classList.add("status-bad");
    if (column.title) td.title = column.title(record);
    if (column.clip) {
      td.classList.add("clip"); // a long model ID ends in "…": the whole of it on hover
      td.title = text;
    }
    return td;
  }

  function createRow(record) {
    const row = h("tr", {});
    if (fresh.has(record.id)) {
      row.classList.add("fresh");
      fresh.delete(record.id);
    }
    return row;
  }

  const shownIn = new WeakMap(); // row → the record it shows

  function updateRow(row, record) {
    // A record never changes, but an ID can name another one: a restarted llamaswap
    // without a [store] numbers its records from 1 again.
    if (shownIn.get(row) === record && row.dataset.layout === String(layout)) return;
    shownIn.set(row, record);
    row.dataset.layout = String(layout);
    row.replaceChildren(...order.map((id) => cell(BY_ID.get(id), record)));
  }

  function compare(a, b) {
    const column = BY_ID.get(sort.column);
    const x = column.value(a);
    const y = column.value(b);
    if (x === null || x === undefined) return y === null || y === undefined ? b.id - a.id : 1;
    if (y === null || y === undefined) return -1;
    const result = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
    return (sort.descending ? -result : result) || b.id - a.id;
  }

  const render = batched(() => {
    renderFilterOptions();
    if (!visible) return;
    const rows = [...records.values()].filter(matches).sort(compare).slice(0, SHOWN);
    syncList(body, rows, (record) => record.id, createRow, updateRow);
    $("#activity-empty").hidden = rows.length > 0;
    const total = fmt.plural(records.size, "record");
    setText($("#activity-count"), rows.length === records.size ? total : `${rows.length} of ${total}`);
  });

  // ------------------------------------------------------------ filters

  function renderFilterOptions() {
    const select = form.elements.model;
    // The models the cards show, and any that the records name (a removed model's history).
    const models = new Set(store.visibleModels().map((model) => model.id));
    for (const record of records.values()) if (record.model) models.add(record.model);
    const wanted = ["", ...[...models].sort()];
    const have = [...select.options].map((option) => option.value);
    if (wanted.join("\n") === have.join("\n")) return;
    const chosen = select.value;
    select.replaceChildren(...wanted.map((model) => h("option", { value: model }, model || "any")));
    select.value = wanted.includes(chosen) ? chosen : "";
    select.title = select.value;
  }

  const bandSelect = form.elements.band;
  for (const band of fmt.BANDS) bandSelect.append(h("option", { value: band }, fmt.bandLabel(band)));
  form.addEventListener("change", () => {
    form.elements.model.title = form.elements.model.value; // it may be clipped
    render();
    fetchRecords();
  });
  form.addEventListener("submit", (event) => event.preventDefault());
  $("#columns-reset").addEventListener("click", () => {
    order = COLUMNS.map((column) => column.id);
    sort = { ...DEFAULT_SORT };
    layout += 1;
    saveLayout();
    renderHead();
    render();
  });

  store.on((what, detail) => {
    if (what === "snapshot") {
      // The snapshot replaces what the page had: after a restart the old records are
      // gone (GET /api/activity no longer has them) and their IDs are used again.
      records.clear();
      fresh.clear();
      for (const record of store.activity) add(record);
      fetchRecords(); // a fresh connection: whatever finished while we were away
    } else if (what === "activity") {
      if (visible) fresh.add(detail.id); // flashes once as it arrives, if it is seen arriving
      add(detail);
    } else if (what !== "models") {
      return;
    }
    render();
  });

  renderHead();
  render();
  return {
    show(shown) {
      visible = shown;
      if (shown) render();
    },
  };
}
