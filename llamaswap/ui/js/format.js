// Numbers and times as people read them.

export const BANDS = ["above_interactive", "interactive", "normal", "batch", "below_batch"];

export function duration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "—";
  // Each unit is chosen after rounding to the digits it shows: 999.6 ms is "1.00 s", not
  // "1000 ms"; 9.996 s is "10.0 s"; 59.96 s is "1m 00s".
  if (Math.round(ms) < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (Math.round(s * 100) < 1000) return `${s.toFixed(2)} s`;
  if (Math.round(s * 10) < 600) return `${s.toFixed(1)} s`;
  const whole = Math.max(60, Math.floor(s));
  const m = Math.floor(whole / 60);
  if (m < 60) return `${m}m ${String(whole % 60).padStart(2, "0")}s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

export function clock(epochMs) {
  if (epochMs === null || epochMs === undefined || !Number.isFinite(epochMs)) return "—";
  return new Date(epochMs).toLocaleTimeString([], { hour12: false });
}

export function isoClock(iso) {
  return iso ? clock(Date.parse(iso)) : "—";
}

export function number(value, digits = 0) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "—";
  return value.toLocaleString(undefined, {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  });
}

export function score(value) {
  if (value === null || value === undefined) return "—";
  if (Math.abs(value) >= 1e6) return value.toExponential(2);
  return value.toFixed(1);
}

export function bandLabel(band) {
  return band ? band.replace("_", " ") : "—";
}

export function priority(value) {
  if (value === null || value === undefined) return "";
  return value > 0 ? `+${value}` : String(value);
}

// A coarse age: "12s", "3m 12s", "2h 05m".
export function ago(ms) {
  if (!Number.isFinite(ms)) return "—";
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  return duration(s * 1000);
}

// "1 line", "2 lines", "0 lines": a count and its noun, singular only for exactly one.
export function plural(count, one, many = `${one}s`) {
  return `${count} ${count === 1 ? one : many}`;
}

// "8 GiB", "23.5 GiB", "512 MiB": a size in bytes, as llamaswap's log writes it
// (resources/book.py format_size): to a tenth of its unit, ".0" left out.
export function size(bytes) {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) return "—";
  for (const [unit, scale] of [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (bytes >= scale) {
      return `${(bytes / scale).toFixed(1).replace(/\.0$/, "")} ${unit}`;
    }
  }
  return `${bytes} B`;
}

// "about 4 s", "about 3 min": an estimate, never more precise than it is. The number
// keeps its unit (a no-break space) where the text wraps.
export function about(ms) {
  const s = Math.round(ms / 1000);
  if (s < 1) return "any moment";
  if (s < 90) return `about ${s}\u00a0s`;
  return `about ${Math.round(s / 60)}\u00a0min`;
}
