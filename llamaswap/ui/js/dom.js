// A few DOM helpers. Text always goes in as text (textContent), never as HTML: model
// output, log lines and metadata are not ours to trust.

export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

export function $(selector, root = document) {
  return root.querySelector(selector);
}

// Set text only when it changed (keeps selections and avoids layout work).
export function setText(el, value) {
  const text = value === null || value === undefined ? "" : String(value);
  if (el.textContent !== text) el.textContent = text;
}

export function setAttr(el, name, value) {
  if (value === null || value === undefined || value === false) {
    if (el.hasAttribute(name)) el.removeAttribute(name);
  } else {
    const text = value === true ? "" : String(value);
    if (el.getAttribute(name) !== text) el.setAttribute(name, text);
  }
}

// Make parent's children match items, one element per key, in order. Elements are
// reused (updated in place) and moved only when out of place, so focus and hover survive
// live updates. Every child of parent must come from here.
export function syncList(parent, items, keyOf, create, update) {
  const existing = new Map();
  for (const child of parent.children) existing.set(child.dataset.key, child);
  let index = 0;
  for (const item of items) {
    const key = String(keyOf(item));
    let el = existing.get(key);
    if (el === undefined) {
      el = create(item);
      el.dataset.key = key;
    } else {
      existing.delete(key);
    }
    update(el, item);
    const here = parent.children[index] ?? null;
    if (here !== el) parent.insertBefore(el, here);
    index += 1;
  }
  for (const el of existing.values()) el.remove();
}

// Calls render() at most once per animation frame, however often it is asked for.
export function batched(render) {
  let queued = false;
  return () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      render();
    });
  };
}

// A short message in the corner (also read out by screen readers), with a button to
// close it. Long text (a failed load quotes its server's last lines) is clipped to a few
// lines: the whole of it is in the title, and where it belongs (the Activity row). It
// goes by itself after a while, but not while the pointer or the focus is on it.
export function toast(message, { bad = false } = {}) {
  const box = document.getElementById("toasts");
  const close = h("button", { type: "button", class: "quiet close", "aria-label": "Dismiss", title: "Dismiss" }, "×");
  const el = h("div", { class: bad ? "toast bad" : "toast" }, h("span", { class: "toast-text", title: message }, message), close);
  close.addEventListener("click", () => el.remove());
  box.append(el);
  const expire = () => {
    if (el.matches(":hover, :focus-within")) setTimeout(expire, 1000);
    else el.remove();
  };
  setTimeout(expire, bad ? 8000 : 4000);
}
