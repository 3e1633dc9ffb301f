// Talking to llamaswap: the API key, authorised requests, and server-sent events read
// from a fetch() body (EventSource cannot send an Authorization header).
//
// Every URL is relative to the page (served at <base>/ui/), so the dashboard also works
// behind a reverse proxy that adds a path prefix. The key travels only in the
// Authorization header: never in a URL, where it would end up in logs and history.

const KEY_NAME = "llamaswap.apiKey";
const BASE = new URL("../", document.baseURI);

let key = sessionStorage.getItem(KEY_NAME) ?? localStorage.getItem(KEY_NAME);
let keyWanted = null; // a promise while the page waits for the user to give a key
let askForKey = null; // set by the app: (message) => Promise<void>
let savedKeyUnusable = null; // why a key kept in storage was dropped, told at the prompt

export class ApiError extends Error {
  constructor(status, body, fallback) {
    const message = body?.error?.message ?? fallback ?? `HTTP ${status}`;
    super(message);
    this.status = status;
    this.code = body?.error?.code ?? null;
    this.body = body;
  }
}

// A key is printable ASCII without spaces, as llamaswap's config requires of apiKeys
// (docs/configuration.md): it travels in a header. fetch() refuses to send anything else
// (a zero-width space or a curly quote picked up by copy and paste) before any server sees
// it, so such a key is refused here, with the reason, instead of failing every request.
export function keyProblem(value) {
  const bad = [...value].find((char) => char < "!" || char > "~");
  if (value && bad === undefined) return null;
  const what = bad === undefined ? "is empty" : `holds ${bad === " " ? "a space" : codePoint(bad)}`;
  return `That key ${what}: an API key is printable ASCII without spaces. Check for a space, a curly quote or an invisible character copied with it.`;
}

function codePoint(char) {
  return `U+${char.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}`;
}

if (key !== null && keyProblem(key) !== null) {
  // Saved before this check existed: it could never be sent, so ask for another.
  savedKeyUnusable = `The saved key could not be used. ${keyProblem(key)}`;
  forgetKey();
}

export function url(path) {
  return new URL(path.replace(/^\//, ""), BASE);
}

export function hasKey() {
  return key !== null;
}

export function setKey(value, remember) {
  key = value;
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
  (remember ? localStorage : sessionStorage).setItem(KEY_NAME, value);
}

export function forgetKey() {
  key = null;
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
}

export function onKeyNeeded(callback) {
  askForKey = callback;
}

// One prompt however many requests were refused at once; resolves once a key is set.
function keyNeeded(refused) {
  if (keyWanted === null) {
    const message = refused ? "That key was refused." : (savedKeyUnusable ?? "");
    savedKeyUnusable = null;
    keyWanted = askForKey(message).finally(() => {
      keyWanted = null;
    });
  }
  return keyWanted;
}

// fetch() with the key. A 401 asks for a key and sends the request again with it.
export async function request(path, options = {}) {
  for (;;) {
    const headers = new Headers(options.headers ?? {});
    const sent = key;
    if (sent !== null) headers.set("Authorization", `Bearer ${sent}`);
    // credentials "omit": no cookies, and no browser Basic-auth prompt on a 401.
    const response = await fetch(url(path), { ...options, headers, credentials: "omit" });
    if (response.status !== 401 || askForKey === null) return response;
    await response.body?.cancel();
    if (key === sent) await keyNeeded(sent !== null); // else: another request already got a new key
  }
}

// A JSON answer, or an ApiError carrying llamaswap's error message.
export async function json(path, options = {}) {
  const response = await request(path, options);
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) throw new ApiError(response.status, body, text.slice(0, 200));
  return body;
}

export function post(path, options = {}) {
  return json(path, { method: "POST", ...options });
}

// The lines of a streamed text body, as they arrive.
export async function* lines(response, signal) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const abort = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", abort, { once: true });
  let pending = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += value;
      // A \r at the very end may be half of a \r\n: it waits for the next chunk.
      const parts = pending.split(/\r\n|\n|\r(?=[^])/);
      pending = parts.pop();
      yield* parts;
    }
    pending = pending.replace(/\r$/, "");
    if (pending) yield pending;
  } finally {
    signal?.removeEventListener("abort", abort);
    reader.releaseLock();
  }
}

// Server-sent events (the HTML spec's parsing rules): {event, data} per dispatch.
// Comment lines (": ping") and unknown fields are skipped.
export async function* events(response, signal) {
  let type = "";
  let data = [];
  for await (const line of lines(response, signal)) {
    if (line === "") {
      if (data.length) yield { event: type || "message", data: data.join("\n") };
      type = "";
      data = [];
      continue;
    }
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") type = value;
    else if (field === "data") data.push(value);
  }
}
