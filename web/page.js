// The "Try the model" page: loads ONNX Runtime Web and a direction's graphs from the site itself, translates what
// the reader types with beam search (K = 4, α = 0.6), and draws the translation's candidates and attention.
// Everything comes from the export folder this script sits in (book/_static/model/, `python -m aiayn.browser export`).

import { attentionView } from "./attention.js";
import { InputError, Translator } from "./model.js";

const base = new URL("../", import.meta.url);
const EXPORT = "python -m aiayn.browser export --out book/_static/model";
const LANGS = { en: "English", de: "German" };

class MissingFile extends Error {}

function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

// A file of the export as bytes; its .gz copy, unpacked here, where the browser can (DecompressionStream).
async function read(file, manifest) {
  const packed = manifest.sizes[file] && typeof DecompressionStream === "function";
  const response = await fetch(new URL(packed ? `${file}.gz` : file, base));
  if (!response.ok) throw new MissingFile(`${file} is missing from this build of the book (HTTP ${response.status})`);
  let bytes = new Uint8Array(await response.arrayBuffer());
  if (packed && bytes[0] === 0x1f && bytes[1] === 0x8b) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    bytes = new Uint8Array(await new Response(stream).arrayBuffer());
  }
  return bytes;
}

// The page's prose quotes measured numbers: <span data-figure="path.in.figures" data-digits="1">.
function fillFigures(figures) {
  for (const span of document.querySelectorAll("[data-figure]")) {
    const value = span.dataset.figure.split(".").reduce((x, key) => (x == null ? x : x[key]), figures);
    if (typeof value === "number") {
      const scale = Number(span.dataset.scale || 1);
      span.textContent = (value * scale).toFixed(Number(span.dataset.digits || 0));
    } else if (typeof value === "string") span.textContent = value;
  }
}

// the bytes this page has fetched so far, as they crossed the wire (its resources' encoded bodies)
function fetchedBytes() {
  return performance.getEntriesByType("resource").reduce((sum, e) => sum + e.encodedBodySize, 0);
}

function megabytes(manifest, files) {
  const bytes = files.reduce((sum, f) => sum + (manifest.sizes[f] ? manifest.sizes[f].gzip : 0), 0);
  return (bytes / 1e6).toFixed(1);
}

function buildForm(root, manifest) {
  const direction = el("select", { name: "direction", id: "try-direction" });
  for (const [name, entry] of Object.entries(manifest.models)) {
    direction.add(new Option(`${LANGS[entry.src_lang]} → ${LANGS[entry.tgt_lang]}`, name));
  }
  const text = el("textarea", { id: "try-text", name: "text", rows: 3, spellcheck: false });
  const button = el("button", { type: "submit", textContent: "Translate", disabled: true });
  const example = el("button", { type: "button", textContent: "Example", className: "try-secondary" });
  const form = el(
    "form",
    { className: "try-form" },
    el("label", { htmlFor: "try-direction", textContent: "Direction " }),
    direction,
    el("label", { htmlFor: "try-text", textContent: "Sentence", className: "try-block" }),
    text,
    el("div", { className: "try-buttons" }, button, example),
  );
  const status = el("p", { className: "try-status", role: "status" });
  const error = el("p", { className: "try-error", role: "alert", hidden: true });
  const result = el("div", { className: "try-result" });
  root.replaceChildren(form, status, error, result);
  const placeholder = () => {
    const ex = manifest.examples && manifest.examples[direction.value];
    text.placeholder = ex ? `e.g. ${ex}` : "";
  };
  direction.addEventListener("change", placeholder);
  placeholder();
  return { form, direction, text, button, example, status, error, result };
}

function showError(ui, message) {
  ui.error.hidden = !message;
  ui.error.textContent = message || "";
}

// The translation, the beam's candidates and (once computed) the attention views.
function showResult(ui, out, note) {
  const rows = [...out.candidates].sort((a, b) => b.score - a.score);
  const table = el(
    "table",
    { className: "try-candidates" },
    el("caption", { textContent: "The beam's candidates when the search ended (score: log p / length penalty)" }),
    el("tr", {}, el("th", { textContent: "Candidate" }), el("th", { textContent: "Score" })),
    ...rows.map((c) =>
      el(
        "tr",
        { className: c.best ? "try-best" : "" },
        el("td", { textContent: (c.text || "(empty)") + (c.best ? "  ← chosen" : "") }),
        el("td", { textContent: c.score.toFixed(3) }),
      ),
    ),
  );
  const far = (out.far || []).length
    ? el(
        "div",
        { className: "try-far", role: "note" },
        el("strong", { textContent: "This sentence is far from what the model learned from. " }),
        `It was trained only on image captions (Multi30k: one-sentence descriptions of photos, mostly of people ` +
          `and animals), and ${out.far.join("; ")}. Expect a poor translation.`,
      )
    : "";
  const attention = el("div", { className: "try-attention" });
  ui.result.replaceChildren(
    el("p", { className: "try-translation", lang: out.tgtLang || "" }, out.translation || "(empty)"),
    far,
    el("p", { className: "try-note", textContent: note }),
    table,
    el("p", { className: "try-heading", textContent: "Attention for this sentence" }),
    attention,
  );
  return attention;
}

// Where WebAssembly cannot run: the translation `python -m aiayn.browser export` stored, drawn the same way.
async function showStored(ui, manifest, why) {
  ui.form.hidden = true;
  let examples;
  try {
    examples = JSON.parse(new TextDecoder().decode(await read(manifest.example, manifest)));
  } catch (err) {
    ui.root.dataset.state = "error";
    return showError(ui, `${why} The stored example is missing too (${err.message}); \`${EXPORT}\` makes it.`);
  }
  ui.status.textContent = `${why} Here instead is a translation stored when the book was built.`;
  const ex = examples[ui.direction.value] || Object.values(examples)[0];
  attentionView(showResult(ui, { ...ex, far: [] }, `Source: ${ex.text}`), ex);
  ui.root.dataset.state = "stored";
}

export async function start(root) {
  for (const note of document.querySelectorAll(".try-missing")) note.hidden = true; // this script is here
  let manifest;
  try {
    const response = await fetch(new URL("manifest.json", base));
    if (!response.ok) throw new MissingFile(`HTTP ${response.status}`);
    manifest = await response.json();
  } catch (err) {
    root.replaceChildren(
      el("p", {
        className: "try-error",
        textContent: `The model files are missing from this build of the book (manifest.json: ${err.message}). ` +
          `\`${EXPORT}\` makes them; \`make book\` runs it.`,
      }),
    );
    root.dataset.state = "missing";
    return null;
  }
  fillFigures(manifest.figures || {});
  const ui = { root, ...buildForm(root, manifest) };
  const app = new App(ui, manifest);
  globalThis.tryModel = app;
  if (typeof WebAssembly !== "object" || typeof WebAssembly.instantiate !== "function") {
    await showStored(ui, manifest, "Your browser cannot run WebAssembly, which the model needs.");
    return app;
  }
  await app.start();
  return app;
}

class App {
  constructor(ui, manifest) {
    Object.assign(this, { ui, manifest, translator: null, loading: {} });
    this.read = (file) => read(file, manifest);
    ui.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.submit();
    });
    ui.example.addEventListener("click", () => {
      ui.text.value = manifest.examples[ui.direction.value];
      this.submit();
    });
  }

  async start() {
    const { ui, manifest } = this;
    const t0 = performance.now();
    const name = ui.direction.value;
    const entry = manifest.models[name];
    const files = [manifest.runtime.wasm, manifest.words, entry.tokenizer, ...Object.values(entry.files)];
    const fetching = new Map(files.map((file) => [file, this.read(file)])); // all at once
    fetching.forEach((promise) => promise.catch(() => {})); // a failure is reported where it is awaited
    const read = (file) => fetching.get(file) || this.read(file);
    const model = ui.direction.selectedOptions[0].text;
    ui.status.textContent = `Loading ONNX Runtime and the ${model} model (${megabytes(manifest, files)} MB)…`;
    ui.root.dataset.state = "loading";
    try {
      const ort = await import(new URL(manifest.runtime.module, base).href);
      ort.env.wasm.numThreads = 1; // no cross-origin isolation on a static host: one thread
      ort.env.wasm.wasmBinary = await read(manifest.runtime.wasm);
      this.ort = ort;
      this.translator = await Translator.load(ort, manifest, read, [name]);
    } catch (err) {
      return this.failed(err);
    }
    this.timing = { load: (performance.now() - t0) / 1000, fetched: fetchedBytes() };
    ui.status.textContent = `Ready: the model loaded in ${this.timing.load.toFixed(1)} s and runs on your device.`;
    ui.button.disabled = false;
    ui.root.dataset.state = "ready";
    this.preload();
  }

  // the other direction, in the background, so that no file is fetched once a reader starts translating
  preload() {
    for (const name of Object.keys(this.manifest.models)) this.model(name).catch(() => {});
  }

  model(name) {
    if (!this.loading[name]) {
      this.loading[name] = this.translator.models[name]
        ? Promise.resolve()
        : this.translator.addModel(this.ort, name);
    }
    return this.loading[name];
  }

  failed(err) {
    const { ui } = this;
    ui.root.dataset.state = "error";
    ui.status.textContent = "";
    if (err instanceof MissingFile) {
      showError(ui, `${err.message}. \`${EXPORT}\` makes the model files; \`make book\` runs it.`);
    } else if (/wasm|WebAssembly/i.test(String(err && err.message))) {
      return showStored(ui, this.manifest, `ONNX Runtime could not start WebAssembly here (${err.message}).`);
    } else showError(ui, `The model could not load: ${err.message}`);
  }

  async translate(text, name) {
    await this.model(name);
    const out = await this.translator.translate(text, name);
    return { ...out, tgtLang: this.manifest.models[name].tgt_lang };
  }

  async submit() {
    const { ui } = this;
    if (!this.translator) return;
    showError(ui, "");
    ui.button.disabled = true;
    ui.root.dataset.state = "translating";
    ui.status.textContent = "Translating…";
    try {
      const out = await this.translate(ui.text.value, ui.direction.value);
      ui.status.textContent = "";
      const view = showResult(ui, out, `Translated on your device in ${out.seconds.toFixed(2)} s.`);
      attentionView(view, await this.translator.attention(out));
      this.last = out;
      ui.root.dataset.state = "done";
    } catch (err) {
      ui.status.textContent = "";
      if (err instanceof InputError) showError(ui, err.message);
      else if (err instanceof MissingFile) return this.failed(err);
      else showError(ui, `The translation failed: ${err.message}`);
      ui.root.dataset.state = "ready";
    } finally {
      ui.button.disabled = false;
    }
  }
}

// A page that embeds the translator further down (§6.1) fetches the model only when the reader scrolls near it.
const root = document.getElementById("try-model");
if (root && "lazy" in root.dataset && "IntersectionObserver" in window) {
  const near = new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting)) {
      near.disconnect();
      start(root);
    }
  }, { rootMargin: "600px" });
  near.observe(root);
} else if (root) start(root);
