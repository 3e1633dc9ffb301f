// Logs: llamaswap's own log and every model's output, live, with a source picker and a
// search. While this tab is open it reads GET /logs/stream (everything) or
// /logs/stream/{model}: the history, then each line as it is written, from one
// consistent point, filtered by the server. It is a pushed stream, not polling, and it
// is kept off /api/events on purpose: a chatty model cannot crowd the dashboard's state
// events out of their bounded buffer.

import * as api from "./api.js";
import { $, h, setText } from "./dom.js";
import * as fmt from "./format.js";

const KEPT = 5000;
const DROPPED = /^\[\d+ lines dropped: this reader is too slow\]$/;

export function mountLogs(store) {
  const pre = $("#log");
  const source = $("#logs-source");
  const search = $("#logs-search");
  const follow = $("#logs-follow");
  let lines = []; // {text, src}
  let controller = null;
  let shown = false;
  // The stream has ended or failed, or the event stream broke since it was opened (say
  // llamaswap restarted): the next snapshot, on reconnection, opens it again.
  let stale = false;
  let pending = []; // lines not rendered yet
  let frame = 0;

  // "[chat] text" in the merged stream is the model's line (llamaswap's own lines start
  // with their time).
  function parse(text, model) {
    if (model) return { text, src: null };
    const match = /^\[([^\]\s]+)\] /.exec(text);
    if (match && !DROPPED.test(text)) return { text: text.slice(match[0].length), src: match[1] };
    return { text, src: null };
  }

  function lineNode(line, query) {
    const el = h("span", { class: DROPPED.test(line.text) ? "line dropped" : "line" });
    if (line.src) el.append(h("span", { class: "src" }, `[${line.src}] `));
    if (query) {
      const lower = line.text.toLowerCase();
      let at = 0;
      for (let hit = lower.indexOf(query, at); hit !== -1; hit = lower.indexOf(query, at)) {
        el.append(line.text.slice(at, hit), h("mark", {}, line.text.slice(hit, hit + query.length)));
        at = hit + query.length;
      }
      el.append(line.text.slice(at));
    } else {
      el.append(line.text);
    }
    el.append("\n");
    return el;
  }

  const query = () => search.value.trim().toLowerCase();
  // "llamaswap only" reads the merged stream and keeps llamaswap's own lines here.
  const fromSource = (line) => source.value !== "-" || line.src === null;
  const wanted = (line, q) => fromSource(line) && (!q || line.text.toLowerCase().includes(q));

  function renderAll() {
    pending = [];
    const q = query();
    pre.replaceChildren(...lines.filter((line) => wanted(line, q)).map((line) => lineNode(line, q)));
    afterRender();
  }

  function flush() {
    frame = 0;
    const q = query();
    const nodes = pending.filter((line) => wanted(line, q)).map((line) => lineNode(line, q));
    pending = [];
    pre.append(...nodes);
    while (pre.childElementCount > KEPT) pre.firstElementChild.remove();
    afterRender();
  }

  function afterRender() {
    const q = query();
    const count = pre.childElementCount;
    const total = source.value === "-" ? lines.filter(fromSource).length : lines.length;
    const all = fmt.plural(total, "line");
    setText($("#logs-count"), q ? `${count} matching of ${all}` : all);
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  }

  function receive(line) {
    lines.push(line);
    if (lines.length > KEPT) lines = lines.slice(-KEPT);
    pending.push(line);
    if (!frame) frame = requestAnimationFrame(flush);
  }

  async function open() {
    controller?.abort();
    const mine = new AbortController();
    controller = mine;
    stale = false;
    lines = []; // the history comes again: nothing is shown twice
    pending = [];
    pre.replaceChildren();
    const model = source.value && source.value !== "-" ? source.value : null;
    const path = model ? `logs/stream/${encodeURIComponent(model)}` : "logs/stream";
    try {
      const response = await api.request(path, { signal: mine.signal });
      if (!response.ok) throw new api.ApiError(response.status, await response.json().catch(() => null));
      for await (const text of api.lines(response, mine.signal)) receive(parse(text, model));
      if (mine.signal.aborted) return;
      stale = true;
      receive({ text: "[the log stream ended: llamaswap stopped]", src: null });
    } catch (error) {
      if (mine.signal.aborted) return;
      stale = true;
      receive({ text: `[the log stream failed: ${error.message}]`, src: null });
    }
  }

  function close() {
    controller?.abort();
    controller = null;
  }

  // The models the cards show (store.visibleModels): not one a reload removed, whose late
  // "stopped" event the store still hears.
  function renderSources() {
    const models = store.visibleModels().map((model) => model.id).sort();
    const have = [...source.options].slice(2).map((option) => option.value);
    if (models.join("\n") === have.join("\n")) return;
    const chosen = source.value;
    source.replaceChildren(
      h("option", { value: "" }, "everything"),
      h("option", { value: "-" }, "llamaswap only"),
      ...models.map((model) => h("option", { value: model }, model)),
    );
    source.value = chosen === "" || chosen === "-" || models.includes(chosen) ? chosen : "";
    if (source.value !== chosen && shown) open(); // its model went: show everything
  }

  source.addEventListener("change", () => {
    source.title = source.value; // a long model ID may be clipped
    if (shown) open();
  });
  search.addEventListener("input", renderAll);
  follow.addEventListener("change", () => {
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  });
  pre.addEventListener("scroll", () => {
    follow.checked = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  });
  $("#logs-form").addEventListener("submit", (event) => event.preventDefault());
  store.on((what) => {
    if (what === "connection" && store.connection.state === "retrying") stale = true;
    if (what === "snapshot" || what === "models") renderSources();
    if (what === "snapshot" && shown && stale) open(); // reconnected: follow the log again
  });

  return {
    show(visible) {
      if (visible === shown) return;
      shown = visible;
      if (visible) open();
      else close();
    },
  };
}
