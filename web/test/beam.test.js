// web/beam.js and web/model.js against aiayn.browser: the same slots on made-up log-probabilities (ties included),
// and on the exported graphs (ONNX Runtime Web under Node) the hypotheses of Python's beam search.
import assert from "node:assert/strict";
import { test } from "node:test";

import { beamSearch, topK } from "../beam.js";
import { Translator } from "../model.js";
import { exported, fixtures, MISSING } from "./fixtures.js";

const model = exported();
const skipModel = !fixtures ? MISSING : !model ? `the export in ${fixtures.model_dir} is gone: export again` : false;

test("topK keeps the K largest, equal values in index order", () => {
  const values = [3, 1, 3, -Infinity, 5, 3, -Infinity];
  assert.deepEqual(topK(values.length, 4, (i) => values[i]), [[5, 4], [3, 0], [3, 2], [3, 5]]);
  assert.deepEqual(topK(3, 4, () => -Infinity), [[-Infinity, 0], [-Infinity, 1], [-Infinity, 2]]);
});

test("beam search picks Python's slots on made-up log-probabilities", { skip: !fixtures && MISSING }, async () => {
  for (const [i, c] of fixtures.toy_beams.entries()) {
    const table = c.table.map((byT) => byT.map((row) => Float32Array.from(row, (x) => (x === null ? -Infinity : x))));
    const step = async (t, last) => {
      const out = new Float32Array(c.K * c.V);
      last.forEach((y, k) => out.set(table[y][t], k * c.V));
      return out;
    };
    const { hyps, scores } = await beamSearch(step, { K: c.K, V: c.V, lp: c.lp, limit: c.limit });
    assert.deepEqual(hyps, c.hyps, `case ${i}`);
    assert.deepEqual(scores.map((s) => (s === -Infinity ? null : s)), c.scores, `case ${i}`);
  }
});

test("translations over the exported graphs equal Python's", { skip: skipModel }, async () => {
  const ort = await import("onnxruntime-web");
  ort.env.wasm.numThreads = 1;
  const translator = await Translator.load(ort, model.manifest, model.read);
  for (const [name, cases] of Object.entries(fixtures.beams)) {
    let same = 0;
    for (const c of cases) {
      const out = await translator.translate(c.text, name);
      assert.deepEqual(out.src, c.src, c.text);
      same += JSON.stringify(out.hyp) === JSON.stringify(c.hyp);
      if (JSON.stringify(out.hyp) === JSON.stringify(c.hyp)) assert.equal(out.translation, c.translation);
    }
    // ONNX Runtime's WebAssembly kernels may round a last bit differently from its x86 ones
    assert.ok(same >= cases.length - 1, `${name}: ${same} of ${cases.length} the same`);
  }
});

test("the attention of a translation has a row per token and sums to 1", { skip: skipModel }, async () => {
  const ort = await import("onnxruntime-web");
  const [name] = Object.keys(model.manifest.models);
  const translator = await Translator.load(ort, model.manifest, model.read, [name]);
  const out = await translator.translate(fixtures.beams[name][0].text, name);
  const a = await translator.attention(out);
  const { N, h } = model.manifest.models[name].config;
  const T = out.hyp.length + 1;
  const S = out.src.length + 1;
  assert.equal(a.srcPieces.length, S);
  assert.equal(a.tgtPieces.length, T);
  for (const [kind, rows, cols] of [["encSelf", S, (r) => S], ["decSelf", T, (r) => r + 1], ["cross", T, () => S]]) {
    assert.equal(a[kind].length, N);
    assert.equal(a[kind][0].length, h);
    for (const head of a[kind].flat()) {
      assert.equal(head.length, rows);
      head.forEach((row, r) => {
        assert.equal(row.length, cols(r));
        assert.ok(Math.abs(row.reduce((x, y) => x + y, 0) - 1) < 1e-4, kind);
      });
    }
  }
});
