// Runs the dashboard's script (python/reprise/dashboard/app.js) under node against a tiny DOM, so
// that tests/test_dashboard.py can check how the page renders a snapshot without a browser.
//
//   node tests/dashboard_dom.js APP_JS SNAPSHOT_JSON
//
// The page starts as in a browser: its event stream fails (this fetch answers /api/events with an
// error), it falls back to polling, and /api/snapshot answers SNAPSHOT_JSON once; its timers never
// fire, so it draws that one snapshot and waits. Printed on stdout, as JSON:
//   sinks     every HTML-parsing sink the page used (innerHTML, outerHTML, insertAdjacentHTML,
//             document.write), with the value: user-chosen text must never reach one
//   created   the tag names passed to document.createElement
//   ids       {id: {text, dataset, hidden}} for every element looked up by id
//   tables    the table rows in order: {dataset, cells: {field: text}}
//   clients   the client rows in order: {dataset, cells: {field: text, title}}
// Only what app.js uses is modelled: elements, text nodes, dataset, classList, style, and
// querySelector(All) for tag, .class and [attr="value"] compounds joined by spaces.
"use strict";

const fs = require("fs");
const vm = require("vm");

const [appPath, snapshotPath] = process.argv.slice(2);
const snapshot = JSON.parse(fs.readFileSync(snapshotPath, "utf8"));
const sinks = [];
const created = [];

class Text {
  constructor(data) { this.data = String(data); this.parent = null; }
  get textContent() { return this.data; }
}

class Element {
  constructor(tag) {
    this.tagName = String(tag).toUpperCase();
    this.id = "";
    this.children = [];     // elements and text nodes
    this.parent = null;
    this.dataset = {};
    this.style = {};
    this.attributes = {};
    this.className = "";
    this.title = "";
    this.hidden = false;
    this.value = "";
    this.tabIndex = -1;
  }

  get textContent() { return this.children.map((c) => c.textContent).join(""); }
  set textContent(value) { this.replaceChildren(String(value ?? "")); }
  get innerHTML() { throw new Error("the stub does not serialise HTML"); }
  set innerHTML(value) { sinks.push({ sink: "innerHTML", value: String(value) }); }
  get outerHTML() { throw new Error("the stub does not serialise HTML"); }
  set outerHTML(value) { sinks.push({ sink: "outerHTML", value: String(value) }); }
  insertAdjacentHTML(position, value) { sinks.push({ sink: "insertAdjacentHTML", value: String(value) }); }

  get classList() {
    const el = this;
    const names = () => el.className.split(/\s+/).filter(Boolean);
    return {
      contains: (n) => names().includes(n),
      add: (...ns) => { el.className = [...new Set([...names(), ...ns])].join(" "); },
      remove: (...ns) => { el.className = names().filter((n) => !ns.includes(n)).join(" "); },
      toggle: (n, force) => {
        const on = force === undefined ? !names().includes(n) : Boolean(force);
        if (on) this.classList.add(n); else this.classList.remove(n);
        return on;
      },
    };
  }

  get elements() { return this.children.filter((c) => c instanceof Element); }
  get clientWidth() { return 800; }

  append(...nodes) {
    for (let node of nodes) {
      if (!(node instanceof Element) && !(node instanceof Text)) node = new Text(node);
      if (node.parent) node.parent.children.splice(node.parent.children.indexOf(node), 1);
      node.parent = this;
      this.children.push(node);
    }
  }

  replaceChildren(...nodes) {
    for (const c of this.children) c.parent = null;
    this.children = [];
    this.append(...nodes);
  }

  remove() {
    if (this.parent) this.parent.children.splice(this.parent.children.indexOf(this), 1);
    this.parent = null;
  }

  setAttribute(name, value) {
    if (/^on/i.test(name)) sinks.push({ sink: `setAttribute(${name})`, value: String(value) });
    this.attributes[name] = String(value);
  }

  getAttribute(name) { return this.attributes[name] ?? null; }
  addEventListener() {}
  removeEventListener() {}
  focus() {}

  descendants() {
    return this.elements.flatMap((c) => [c, ...c.descendants()]);
  }

  querySelectorAll(selector) {
    const parts = selector.trim().split(/\s+/).map(parseCompound);
    return this.descendants().filter((el) => matchesChain(el, parts, this));
  }

  querySelector(selector) { return this.querySelectorAll(selector)[0] || null; }
}

function parseCompound(text) {
  const m = /^([a-z0-9]*)((?:\.[\w-]+)*)((?:\[[\w-]+="[^"]*"\])*)$/i.exec(text);
  if (!m) throw new Error(`dashboard_dom.js: selector ${JSON.stringify(text)} is not modelled`);
  return {
    tag: m[1].toUpperCase(),
    classes: m[2].split(".").filter(Boolean),
    attrs: [...m[3].matchAll(/\[([\w-]+)="([^"]*)"\]/g)].map((a) => [a[1], a[2]]),
  };
}

function attribute(el, name) {
  if (name.startsWith("data-")) {
    const key = name.slice(5).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    return key in el.dataset ? String(el.dataset[key]) : null;
  }
  return name === "id" ? el.id : el.getAttribute(name);
}

function matches(el, c) {
  return (!c.tag || el.tagName === c.tag) && c.classes.every((n) => el.classList.contains(n))
    && c.attrs.every(([name, value]) => attribute(el, name) === value);
}

function matchesChain(el, parts, root) {
  if (!matches(el, parts[parts.length - 1])) return false;
  let rest = parts.length - 2;
  for (let up = el.parent; rest >= 0 && up && up !== root; up = up.parent) {
    if (matches(up, parts[rest])) rest -= 1;
  }
  return rest < 0;
}

const byId = new Map();
const document = {
  getElementById(id) {
    if (!byId.has(id)) {
      const el = new Element("div");
      el.id = id;
      byId.set(id, el);
    }
    return byId.get(id);
  },
  createElement(tag) {
    created.push(String(tag));
    return new Element(tag);
  },
  createTextNode: (data) => new Text(data),
  write(value) { sinks.push({ sink: "document.write", value: String(value) }); },
};

function fetchStub(path) {
  if (path === "/api/snapshot") {
    return Promise.resolve({ ok: true, status: 200, json: async () => snapshot });
  }
  return Promise.reject(new Error(`no ${path} in this stub`));
}

const context = vm.createContext({
  document,
  window: { addEventListener() {} },
  location: { search: "", hash: "", pathname: "/" },
  history: { replaceState() {} },
  sessionStorage: { getItem: () => null, setItem() {}, removeItem() {} },
  fetch: fetchStub,
  setTimeout: () => 0,      // never fires: the page draws the one snapshot and waits
  clearTimeout: () => {},
  console: { log() {}, warn() {}, error: console.error },
  AbortController,
  URLSearchParams,
  TextDecoderStream,
});
vm.runInContext(fs.readFileSync(appPath, "utf8"), context, { filename: appPath });

function rowsOf(id, withTitle) {
  return document.getElementById(id).elements.map((row) => ({
    dataset: { ...row.dataset },
    cells: Object.fromEntries(row.elements.map((td) => [td.dataset.field,
      withTitle ? { text: td.textContent, title: td.title } : td.textContent])),
  }));
}

setImmediate(() => setImmediate(() => {   // the fetch promises have settled and show() has run
  const ids = {};
  for (const [id, el] of byId) ids[id] = { text: el.textContent, dataset: { ...el.dataset }, hidden: el.hidden };
  process.stdout.write(JSON.stringify({
    sinks, created, ids, tables: rowsOf("table-rows", false), clients: rowsOf("client-rows", true),
  }));
}));
