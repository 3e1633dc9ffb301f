// The active profile (docs/configuration.md, "Profiles and selectors"): shown in the
// header, and switched from there. The list comes from GET /api/profiles after every
// snapshot (a reload reconnects, so a new list comes with it); which one is active comes
// from the event stream (the snapshot's `profile`, then `profileChanged`), so every open
// page shows the same, whoever switched it.

import * as api from "./api.js";
import { $, h, setText, toast } from "./dom.js";

const NONE = ""; // the <option> value of "no profile"

export function mountProfiles(store) {
  const box = $("#profile");
  const select = $("#profile-select");
  let profiles = [];
  let switching = false;

  function render() {
    box.hidden = profiles.length === 0;
    const options = [h("option", { value: NONE }, "none"), ...profiles.map((p) => h("option", { value: p.name }, p.name))];
    select.replaceChildren(...options);
    select.value = store.profile ?? NONE;
    select.disabled = store.stale || switching;
    const active = profiles.find((p) => p.name === store.profile);
    select.title = active?.description ?? "no profile: every name reaches its own model";
    setText($("#profile-pins"), active ? pinsText(active.pins) : "");
  }

  async function load() {
    try {
      profiles = (await api.json("api/profiles")).profiles;
    } catch {
      profiles = []; // a llamaswap without profiles: the control stays hidden
    }
    render();
  }

  select.addEventListener("change", async () => {
    const chosen = select.value; // before render() shows the active one until it answers
    switching = true;
    render();
    try {
      const body = JSON.stringify({ profile: chosen === NONE ? null : chosen });
      const answer = await api.json("api/profiles/active", {
        method: "PUT",
        headers: { "Content-Type": "application/json" },
        body,
      });
      store.setProfile(answer.active); // the event says so too; this is at once
    } catch (error) {
      toast(`Switching the profile failed: ${error.message}`, { bad: true });
    } finally {
      switching = false;
      render();
    }
  });

  store.on((what) => {
    if (what === "snapshot") load();
    else if (what === "profile" || what === "connection") render();
  });
}

function pinsText(pins) {
  const entries = Object.entries(pins);
  const shown = entries.slice(0, 3).map(([name, target]) => `${name} → ${target || "off"}`);
  if (entries.length > shown.length) shown.push(`+${entries.length - shown.length} more`);
  return shown.join(", ");
}
