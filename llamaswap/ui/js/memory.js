// Memory: one bar per device, from GET /api/resources. Left to right: what each running
// model holds (in its card's colour), what other processes use, then the need of each
// load that waits (hatched, in its model's colour), on the device's whole memory; the
// headroom at the right end is shaded and the budget (memory less headroom) marked.
// Without any device (no GPU probe, none declared) a muted line says why instead.
//
// The bars draw what llamaswap reports and nothing else: which load fits, and what it
// would evict, is the scheduler's to decide.

import { $, batched, h, setAttr, setText, syncList } from "./dom.js";
import * as fmt from "./format.js";

const RUNNING = new Set(["starting", "ready", "stopping"]);

const pct = (part, whole) => `${Math.min(100, (100 * part) / whole)}%`;

export function mountMemory(store) {
  const box = $("#memory");
  const list = $("#devices");

  // The parts of one device's bar: [{kind, model, bytes, title}], and the bytes they add.
  function partsOf(device, resources) {
    const parts = [];
    let models = 0;
    for (const [model, bytes] of Object.entries(device.models).sort(([a], [b]) => a.localeCompare(b))) {
      const need = resources.models[model]?.memory?.[device.name];
      const figure = need === undefined ? "" : `; needs ${fmt.size(need)} (${resources.models[model].memory_source})`;
      parts.push({ kind: "held", model, bytes, label: `${model} ${fmt.size(bytes)}`, title: `${model} holds ${fmt.size(bytes)}, measured${figure}` });
      models += bytes;
    }
    // A running model nothing measured (no probe reads it, or not yet): its need, as the
    // fit rule counts it, drawn lighter.
    for (const [model, entry] of Object.entries(resources.models).sort(([a], [b]) => a.localeCompare(b))) {
      const need = entry.memory?.[device.name];
      if (!RUNNING.has(entry.state) || need === undefined || model in device.models) continue;
      const title = `${model} (${entry.state}) counts for ${fmt.size(need)}, ${entry.memory_source}: not measured`;
      parts.push({ kind: "counted", model, bytes: need, label: `${model} ${fmt.size(need)} ${entry.memory_source}`, title });
      models += need;
    }
    const other = device.used === null ? 0 : device.used - Object.values(device.models).reduce((a, b) => a + b, 0);
    if (other > 0) {
      parts.push({ kind: "other", model: null, bytes: other, label: `other ${fmt.size(other)}`, title: `other processes use ${fmt.size(other)}` });
    }
    const occupied = Math.max(device.used ?? 0, models + Math.max(0, other));
    // A load that waits needs its memory; one under way (its model starting) needs
    // what it does not hold yet.
    for (const load of resources.waiting) {
      const need = load.memory?.[device.name];
      if (need === undefined) continue;
      const has = parts.find((p) => p.model === load.model)?.bytes ?? 0;
      if (need - has <= 0) continue;
      const requests = fmt.plural(load.requests, "request");
      parts.push({
        kind: "need",
        model: load.model,
        bytes: need - has,
        label: `${load.model} needs ${fmt.size(need)}`,
        title: `${load.model} needs ${fmt.size(need)} to load (${requests} waiting for it)`,
      });
    }
    return { parts, occupied };
  }

  function createDevice() {
    return h(
      "div",
      { class: "device" },
      h(
        "div",
        { class: "device-head" },
        h("span", { class: "device-name", "data-role": "name" }),
        h("span", { class: "device-label", "data-role": "label" }),
        h("span", { class: "device-sum", "data-role": "sum" }),
      ),
      h(
        "div",
        { class: "membar", "data-role": "bar", role: "img" },
        h("div", { class: "mem-parts", "data-role": "parts" }),
        h("div", { class: "mem-headroom", "data-role": "headroom" }),
        h("div", { class: "mem-budget", "data-role": "budget" }),
      ),
      h("ul", { class: "mem-legend", "data-role": "legend" }),
    );
  }

  const createPart = (part) => h("div", { class: `mem-part ${part.kind}` }, h("span", {}));
  const createItem = (part) =>
    h("li", { class: part.kind }, h("span", { class: `swatch ${part.kind}`, "aria-hidden": "true" }), h("span", {}));
  // The model's colour (a reload may have changed the models, and so the colours).
  const paint = (el, part) => setAttr(el, "data-colour", part.model === null ? null : store.colour(part.model));

  function updateDevice(el, device) {
    const resources = store.resources;
    const part = (role) => el.querySelector(`[data-role="${role}"]`);
    setText(part("name"), device.name);
    setText(part("label"), device.label === device.name ? "" : device.label);
    const { parts, occupied } = partsOf(device, resources);
    const needs = parts.filter((p) => p.kind === "need").reduce((a, p) => a + p.bytes, 0);
    // The bar is the device's whole memory; where nothing says how much that is, the
    // budget, or what is drawn.
    const scale = Math.max(1, device.total ?? device.budget ?? occupied + needs);
    const budget = device.budget ?? device.total;
    const sensors = [
      device.utilization === null ? null : `${Math.round(device.utilization)} % busy`,
      device.temperature === null ? null : `${Math.round(device.temperature)} °C`,
      device.power === null ? null : `${Math.round(device.power)} W`,
    ].filter(Boolean);
    const used = device.used === null ? `${fmt.size(occupied)} counted` : `${fmt.size(device.used)} used`;
    const of = device.total === null ? "" : ` of ${fmt.size(device.total)}`;
    setText(part("sum"), [`${used}${of}`, ...sensors].join(" · "));

    let at = 0;
    const placed = parts.map((p) => {
      // Needs start where the occupied memory ends, one after another.
      if (p.kind === "need" && at < occupied) at = occupied;
      const left = at;
      at += p.bytes;
      return { ...p, left };
    });
    const key = (p) => `${p.kind}:${p.model ?? ""}`;
    syncList(part("parts"), placed, key, createPart, (seg, p) => {
      seg.style.left = pct(p.left, scale);
      seg.style.width = pct(Math.min(p.bytes, Math.max(0, scale - p.left)), scale);
      seg.classList.toggle("over", budget !== null && p.kind === "need" && p.left + p.bytes > budget);
      paint(seg, p);
      setText(seg.firstChild, p.label);
      setAttr(seg, "title", p.title);
    });
    const headroom = part("headroom");
    const mark = part("budget");
    const marked = device.budget !== null && device.total !== null && scale > 0;
    headroom.hidden = mark.hidden = !marked;
    if (marked) {
      headroom.style.left = mark.style.left = pct(device.budget, scale);
      headroom.style.width = pct(device.total - device.budget, scale);
      setAttr(headroom, "title", `headroom ${fmt.size(device.headroom)}: kept free of models`);
      setAttr(mark, "title", `budget ${fmt.size(device.budget)}: what models may use`);
    }

    const free = budget === null ? null : Math.max(0, budget - occupied);
    const items = [...placed];
    if (free !== null) {
      const headroomText = device.headroom ? ` (headroom ${fmt.size(device.headroom)})` : "";
      items.push({ kind: "free", model: null, label: `${fmt.size(free)} free of a ${fmt.size(budget)} budget${headroomText}` });
    }
    syncList(part("legend"), items, key, createItem, (li, p) => {
      setText(li.lastChild, p.label);
      paint(li.firstChild, p);
      setAttr(li, "title", p.title ?? null);
    });
    const summary = placed.map((p) => p.title).join("; ");
    setAttr(part("bar"), "aria-label", `${device.name}: ${summary || "nothing held"}${free === null ? "" : `; ${fmt.size(free)} free`}`);
  }

  const render = batched(() => {
    const resources = store.resources;
    box.hidden = resources === null;
    if (resources === null) {
      $("#models-panel").classList.remove("with-memory");
      return;
    }
    syncList(list, resources.devices, (device) => device.name, createDevice, updateDevice);
    // Loads whose need nobody knows yet: said in words, they have no place on a bar.
    const unknown = resources.waiting.filter((load) => load.memory === null).map((load) => load.model);
    const notes = [];
    if (resources.absent) notes.push(`No GPU figures: ${resources.absent}.`);
    if (unknown.length) notes.push(`Waiting to load, need unknown: ${unknown.join(", ")}.`);
    setText($("#memory-note"), notes.join(" "));
    $("#memory-note").hidden = notes.length === 0;
    // No device: the note alone, one muted line; and the cards' colours mean nothing.
    const bars = resources.devices.length > 0;
    $("#memory-h").hidden = !bars;
    box.hidden = !bars && notes.length === 0;
    $("#models-panel").classList.toggle("with-memory", bars);
  });

  store.on((what) => {
    if (["resources", "snapshot"].includes(what)) render();
  });
  render();
}
