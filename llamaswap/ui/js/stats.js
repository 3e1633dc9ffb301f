// Statistics above the activity table: per model, the p50/p95/p99 of queue wait, time to
// first token, generation speed and duration over a window (GET /api/activity/stats).
//
// llamaswap computes them; the page only shows them. They are read while the Activity
// tab is shown and the page live: when it is shown, when the window changes, and after
// new activity, one read at a time and at most one every 2 s.

import * as api from "./api.js";
import { $, h, setText, syncList } from "./dom.js";
import * as fmt from "./format.js";
import { paced } from "./paced.js";

const GAP = 2000;
const PERCENTILES = ["p50", "p95", "p99"];
const FIGURES = [
  ["queue_wait_ms", fmt.duration],
  ["ttft_ms", fmt.duration],
  ["generation_tokens_per_second", (value) => fmt.number(value, 1)],
  ["duration_ms", fmt.duration],
];

function draft(stats) {
  if (!stats.draft_tokens) return null;
  const share = Math.round((100 * stats.draft_accepted_tokens) / stats.draft_tokens);
  return `${share}% of ${fmt.number(stats.draft_tokens)}`;
}

function cells(model, stats) {
  return [
    h("th", { scope: "row", title: model }, model),
    h("td", { class: "num" }, fmt.number(stats.requests)),
    h("td", { class: stats.errors ? "num status-bad" : "num" }, fmt.number(stats.errors)),
    ...FIGURES.flatMap(([name, format]) => {
      const title = `of ${fmt.plural(stats[name].count, "request")} served`;
      return PERCENTILES.map((p) => h("td", { class: "num", title: `${p} ${title}` }, format(stats[name][p])));
    }),
    h("td", { class: "num" }, fmt.number(stats.cached_tokens)),
    h("td", { class: "num" }, draft(stats) ?? "—"),
  ];
}

export function mountStats(store) {
  const select = $("#stats-window");
  const table = $("#stats-table");
  let visible = false;

  function render(answer) {
    const models = Object.entries(answer.models);
    syncList(table.tBodies[0], models, ([model]) => model, () => h("tr"), (row, [model, stats]) => {
      row.replaceChildren(...cells(model, stats));
    });
    table.hidden = models.length === 0;
    $("#stats-empty").hidden = models.length > 0;
    const newest = answer.truncated ? ` (the newest ${fmt.number(answer.records)})` : "";
    setText($("#stats-note"), `${fmt.plural(answer.records, "request")}${newest}; percentiles of those served`);
  }

  const reader = paced(
    async () => {
      try {
        render(await api.json(`api/activity/stats?window=${encodeURIComponent(select.value)}`));
      } catch (error) {
        console.warn("llamaswap: statistics:", error.message);
      }
    },
    () => visible && store.synced && !store.stale, // showing the tab starts it over
    { gap: GAP },
  );

  select.addEventListener("change", reader.now); // the other window's figures: at once
  store.on((what) => {
    if (what === "snapshot" || what === "activity") reader.soon();
  });
  return {
    show(shown) {
      visible = shown;
      if (shown) reader.soon();
    },
  };
}
