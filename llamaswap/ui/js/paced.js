// Reads of an API route paced for the page: one at a time, the starts of two at least
// `gap` ms apart, a call made while one runs served once it ends, and with `period` read
// again every `period` ms while `wanted()` (statistics, resources).

export function paced(read, wanted, { gap, period = null }) {
  let reading = false;
  let again = false;
  let last = -Infinity;
  let timer = null;

  // Read now, or once the read in progress is over and `gap` has passed since it began.
  async function soon() {
    clearTimeout(timer);
    timer = null;
    if (!wanted()) return; // the caller's next call starts it over
    if (reading) {
      again = true;
      return;
    }
    const wait = last + gap - performance.now();
    if (wait > 0) {
      timer = setTimeout(soon, wait);
      return;
    }
    reading = true;
    last = performance.now();
    try {
      await read();
    } finally {
      reading = false;
    }
    if (again) {
      again = false;
      soon();
    } else if (period !== null && wanted()) {
      timer = setTimeout(soon, period);
    }
  }

  return {
    soon,
    // Read without waiting out the gap (what is asked for has changed).
    now() {
      last = -Infinity;
      soon();
    },
  };
}
