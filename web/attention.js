// Attention weights as heatmaps on a canvas: one head large with its pieces on the axes, and every head of a kind
// small in a grid (layers down, heads across), as the book's chapters draw them (§3.2).

export const KINDS = {
  encSelf: { title: "Encoder self-attention", rows: "srcPieces", cols: "srcPieces" },
  decSelf: { title: "Decoder self-attention", rows: "tgtPieces", cols: "tgtPieces" },
  cross: { title: "Cross-attention (decoder reads the encoder)", rows: "tgtPieces", cols: "srcPieces" },
};

// white for 0, deep blue for the row's largest weights (each row sums to 1)
function colour(w) {
  const v = Math.max(0, Math.min(1, w));
  const [r, g, b] = [255 - 227 * v, 255 - 186 * v, 255 - 113 * v];
  return `rgb(${r | 0},${g | 0},${b | 0})`;
}

function fit(canvas, width, height) {
  const ratio = globalThis.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

const label = (piece) => piece.replaceAll("\u2581", "_");

// One head: rows (queries) down, columns (keys) across, within `width` CSS pixels; labels if there is room.
export function drawHead(canvas, rows, rowLabels, colLabels, width) {
  const ctx0 = canvas.getContext("2d");
  ctx0.font = "11px sans-serif";
  const textWidth = (labels) => Math.min(90, Math.max(...labels.map((l) => ctx0.measureText(label(l)).width)) + 6);
  const left = textWidth(rowLabels);
  const top = textWidth(colLabels) * 0.87 + 4; // column labels slant at 60 degrees
  const right = textWidth(colLabels) * 0.5;
  const cell = Math.max(4, Math.min(26, Math.floor((width - left - right) / colLabels.length)));
  const ctx = fit(canvas, left + cell * colLabels.length + right, top + cell * rowLabels.length);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  rows.forEach((row, r) => {
    for (let c = 0; c < colLabels.length; c++) {
      ctx.fillStyle = colour(c < row.length ? row[c] : 0);
      ctx.fillRect(left + c * cell, top + r * cell, cell, cell);
    }
  });
  ctx.fillStyle = "#222";
  ctx.font = `${Math.min(11, cell)}px sans-serif`;
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  rowLabels.forEach((l, r) => ctx.fillText(label(l), left - 4, top + (r + 0.5) * cell, left - 6));
  ctx.textAlign = "left";
  colLabels.forEach((l, c) => {
    ctx.save();
    ctx.translate(left + (c + 0.5) * cell, top - 4);
    ctx.rotate(-Math.PI / 3);
    ctx.fillText(label(l), 0, 0, (top - 4) / 0.87);
    ctx.restore();
  });
  canvas.dataset.drawn = `${rowLabels.length}x${colLabels.length}`;
}

// A small heatmap without labels, `size` CSS pixels on its longer side.
export function drawThumb(canvas, rows, cols, size) {
  const cell = size / Math.max(rows.length, cols);
  const ctx = fit(canvas, cell * cols, cell * rows.length);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  rows.forEach((row, r) => {
    row.forEach((w, c) => {
      ctx.fillStyle = colour(w);
      ctx.fillRect(c * cell, r * cell, Math.ceil(cell), Math.ceil(cell));
    });
  });
  canvas.dataset.drawn = `${rows.length}x${cols}`;
}

// The view: pick a kind, a layer and a head; the large map, then the grid of all heads of that kind, whose maps
// pick the head when clicked. `weights` holds encSelf, decSelf, cross ([layer][head][row]), srcPieces, tgtPieces.
export function attentionView(root, weights) {
  const N = weights.encSelf.length;
  const h = weights.encSelf[0].length;
  root.replaceChildren();
  const state = { kind: "cross", layer: N - 1, head: 0 };
  const controls = document.createElement("div");
  controls.className = "try-controls";
  const select = (name, text, options) => {
    const lab = document.createElement("label");
    lab.textContent = `${text} `;
    const s = document.createElement("select");
    s.name = name;
    for (const [value, shown] of options) s.add(new Option(shown, value));
    lab.append(s);
    controls.append(lab);
    return s;
  };
  const kind = select("kind", "Attention", Object.entries(KINDS).map(([k, v]) => [k, v.title]));
  const layer = select("layer", "Layer", [...Array(N).keys()].map((i) => [i, i + 1]));
  const head = select("head", "Head", [...Array(h).keys()].map((i) => [i, i + 1]));
  const big = document.createElement("canvas");
  big.className = "try-head";
  const note = document.createElement("p");
  note.className = "try-note";
  const grid = document.createElement("div");
  grid.className = "try-grid";
  grid.style.gridTemplateColumns = `repeat(${h}, minmax(0, 1fr))`;
  const caption = document.createElement("p");
  caption.className = "try-note";
  caption.textContent =
    `Every head of this kind: layers 1 to ${N} down, heads 1 to ${h} across; pick one to enlarge it.`;
  root.append(controls, big, note, caption, grid);

  function draw() {
    Object.assign(state, { kind: kind.value, layer: Number(layer.value), head: Number(head.value) });
    const k = KINDS[state.kind];
    const rows = weights[k.rows];
    const cols = weights[k.cols];
    const width = Math.max(200, root.clientWidth || 600);
    drawHead(big, weights[state.kind][state.layer][state.head], rows, cols, width);
    big.setAttribute("aria-label", `${k.title}, layer ${state.layer + 1}, head ${state.head + 1}`);
    note.textContent =
      `${k.title}, layer ${state.layer + 1}, head ${state.head + 1}: each row is a piece of ` +
      `${k.rows === "srcPieces" ? "the source" : "the output"} attending to the columns; darker is more weight.`;
    grid.replaceChildren();
    const size = Math.max(24, Math.floor(width / h) - 6);
    weights[state.kind].forEach((heads, n) =>
      heads.forEach((w, a) => {
        const cell = document.createElement("button");
        cell.type = "button";
        cell.className = n === state.layer && a === state.head ? "try-thumb try-picked" : "try-thumb";
        cell.title = `layer ${n + 1}, head ${a + 1}`;
        const canvas = document.createElement("canvas");
        drawThumb(canvas, w, cols.length, size);
        cell.append(canvas);
        cell.addEventListener("click", () => {
          layer.value = n;
          head.value = a;
          draw();
        });
        grid.append(cell);
      }),
    );
  }
  kind.value = state.kind;
  layer.value = state.layer;
  head.value = state.head;
  for (const s of [kind, layer, head]) s.addEventListener("change", draw);
  draw();
  return { draw };
}
