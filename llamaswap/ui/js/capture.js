// A request's capture (GET /api/captures/{id}) in a dialog: what the client sent and what
// it was answered. Bodies are shown as text (JSON indented, when whole), never as HTML.

import * as api from "./api.js";
import { $, h, setText } from "./dom.js";
import * as fmt from "./format.js";

let shown = 0; // the capture asked for last: an earlier answer that arrives late is dropped

function readable(body) {
  if (body.text === undefined) return body.base64;
  if (body.kept === body.size) {
    try {
      return JSON.stringify(JSON.parse(body.text), null, 2);
    } catch {
      // not JSON: as it is
    }
  }
  return body.text;
}

function part(title, line, message) {
  const { body } = message;
  let note = body.kept < body.size ? `${fmt.size(body.size)}, the first ${fmt.size(body.kept)} kept` : fmt.size(body.size);
  if (body.base64 !== undefined) note += ", not UTF-8 text: base64";
  const fields = message.headers.map(([name, value]) => h("tr", {}, h("th", { scope: "row" }, name), h("td", {}, value)));
  return h(
    "section",
    { class: "capture-part", "aria-label": title },
    h("h3", {}, title),
    h("p", { class: "capture-line" }, line),
    h("table", { class: "capture-headers" }, h("caption", { class: "sr-only" }, `${title} header fields`), h("tbody", {}, fields)),
    h("p", { class: "hint" }, `Body: ${note}`),
    body.size ? h("pre", { class: "capture-body", tabindex: "0" }, readable(body)) : null,
  );
}

export async function showCapture(record) {
  const dialog = $("#capture-dialog");
  const content = $("#capture-content");
  const mine = ++shown;
  const number = record.request === null || record.request === undefined ? "" : ` (request #${record.request})`;
  setText($("#capture-h"), `Capture of record ${record.id}${number}`);
  content.replaceChildren(h("p", { class: "hint" }, "Loading…"));
  if (!dialog.open) dialog.showModal();
  let parts;
  try {
    const capture = await api.json(`api/captures/${record.id}`);
    const { request, response } = capture;
    const target = request.query ? `${request.path}?${request.query}` : request.path;
    parts = [
      part("Request", `${request.method} ${target}`, request),
      response === null
        ? h("p", { class: "hint" }, "No answer was sent: the client left first.")
        : part("Response", `${response.status}`, response),
    ];
  } catch (error) {
    parts = [h("p", { class: "error" }, error.message)];
  }
  if (mine === shown) content.replaceChildren(...parts);
}

$("#capture-close").addEventListener("click", () => $("#capture-dialog").close());
