// What the event stream does not carry, or not always: the devices' memory (GET
// /api/resources) and fresh estimates of when each waiting request starts (the
// eta_seconds of GET /api/inflight). Memory figures come from a GPU sample llamaswap
// takes every 2 s. An estimate comes with each queue event (eta_ms), but those come only
// when the queue changes, and an estimate goes wrong as time passes (a long answer runs
// past its expected end). So both are read every 2 s, while the page is shown and live,
// and soon after a model, load or queue event (a load began or ended, a request came or
// went). One read at a time, at most two a second; the in-flight list only while a
// request waits.

import * as api from "./api.js";
import { paced } from "./paced.js";

const PERIOD = 2000;
const GAP = 500;

export function followResources(store) {
  let routeMissing = false; // an older llamaswap: no /api/resources

  const wanted = () => store.synced && !store.stale && document.visibilityState === "visible";
  const waiting = () =>
    [...store.requests.values()].some((request) => ["queued", "paused", "loading"].includes(request.state));

  async function read() {
    if (!routeMissing) {
      try {
        store.setResources(await api.json("api/resources"));
      } catch (error) {
        if (error.status === 404) {
          routeMissing = true;
          store.setResources(null);
        } // else: the event stream's own reconnection reports trouble
      }
    }
    if (waiting()) {
      try {
        store.setEtas((await api.json("api/inflight")).inflight);
      } catch {
        // as above
      }
    } else if (store.etas.size) {
      store.setEtas([]);
    }
  }

  // Read now, or as soon as the last read is over and GAP has passed; then every PERIOD.
  const { soon } = paced(read, wanted, { gap: GAP, period: PERIOD });

  store.on((what) => {
    if (what === "snapshot") routeMissing = false; // llamaswap may have been upgraded
    if (["snapshot", "models", "queue", "load"].includes(what)) soon();
    if (what === "connection" && store.connection.state === "live") soon();
  });
  document.addEventListener("visibilitychange", soon);
}
