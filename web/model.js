// The shipped translators on ONNX Runtime Web: the encoder and decoder-step graphs that `python -m aiayn.browser
// export` writes (manifest.json names them), beam search over them (beam.js), and the attention of a translation.
// The same module runs in the page and under Node (web/test/), given the `ort` module and a way to read files.

import { beamSearch, BOS, EOS } from "./beam.js";
import { Tokenizer } from "./tokenizer.js";

export const MAX_CHARS = 1000; // longer text is refused before it is split (the model reads far fewer pieces anyway)
const FAR = { share: 1 / 3, pieces: 48 }; // rare words (3 or more pieces each); the longest val source has 47 pieces

export class InputError extends Error {}

const int64 = (ort, values, dims) => new ort.Tensor("int64", BigInt64Array.from(values, BigInt), dims);

// (N, 1, h, S, d_k) -> (N, rows, h, S, d_k): the cross-attention keys or values, once per beam row.
function repeatRows(ort, tensor, rows) {
  const [N, , h, S, dk] = tensor.dims;
  const block = h * S * dk;
  const out = new Float32Array(N * rows * block);
  for (let n = 0; n < N; n++) {
    for (let r = 0; r < rows; r++) out.set(tensor.data.subarray(n * block, (n + 1) * block), (n * rows + r) * block);
  }
  return new ort.Tensor("float32", out, [N, rows, h, S, dk]);
}

// One direction: its two ONNX Runtime sessions, its configuration and its length penalties.
export class Model {
  constructor(ort, encoder, decoder, entry, decoding) {
    Object.assign(this, { ort, encoder, decoder, entry, config: entry.config, decoding });
  }

  // `read(file)` resolves to a file's bytes (Uint8Array).
  static async load(ort, manifest, name, read) {
    const entry = manifest.models[name];
    const options = {
      executionProviders: ["wasm"],
      graphOptimizationLevel: "all",
      extra: { session: { disable_quant_qdq: "1" } }, // int8 weights become fp32 once, when the session loads
    };
    const [shared, encoderBytes, decoderBytes] = await Promise.all(
      [entry.files.shared, entry.files.encoder, entry.files.decoder].map(read),
    );
    const external = { ...options, externalData: [{ path: entry.files.shared, data: shared }] };
    const encoder = await ort.InferenceSession.create(encoderBytes, external);
    const decoder = await ort.InferenceSession.create(decoderBytes, external);
    return new Model(ort, encoder, decoder, entry, manifest.decoding);
  }

  async encode(src) {
    return this.encoder.run({ src: int64(this.ort, [...src, EOS], [1, src.length + 1]) });
  }

  // beamSearch's step for `rows` slots over an encoded source; `sink`, if given, receives each step's weights.
  stepper(encoded, rows, sink) {
    const { ort, config: c } = this;
    const cross_k = repeatRows(ort, encoded.cross_k, rows);
    const cross_v = repeatRows(ort, encoded.cross_v, rows);
    const empty = () => new ort.Tensor("float32", new Float32Array(0), [c.N, rows, c.h, 0, c.d_k]);
    let past_k = empty();
    let past_v = empty();
    return async (t, last, parent) => {
      const out = await this.decoder.run({
        token: int64(ort, last, [rows]),
        step: int64(ort, [t], [1]),
        parent: int64(ort, parent, [rows]),
        past_k,
        past_v,
        cross_k,
        cross_v,
      });
      ({ present_k: past_k, present_v: past_v } = out);
      if (sink) sink.push({ decSelf: out.dec_self, cross: out.cross });
      return out.logp.data;
    };
  }

  // The beam's slots for a source (ids without </s>): {hyps, scores, best}, and the encoder's output.
  async search(src) {
    const c = this.config;
    const encoded = await this.encode(src);
    const K = this.decoding.beam_size;
    const limit = Math.max(1, Math.min(src.length + 1 + this.decoding.extra_len, c.max_len));
    const lp = this.decoding.length_penalty;
    const beam = await beamSearch(this.stepper(encoded, K), { K, V: c.vocab_size, lp, limit, pad: c.pad_id });
    return { ...beam, encoded };
  }

  // The weights while the model re-reads <s> hyp: [layer][head] -> rows of Float32Array, as Pretrained.attention.
  async attention(encoded, hyp) {
    const { N, h } = this.config;
    const steps = [];
    const step = this.stepper(encoded, 1, steps);
    const tokens = [BOS, ...hyp].slice(0, this.config.max_len); // an output that ran to the limit has no </s>
    for (let t = 0; t < tokens.length; t++) await step(t, [tokens[t]], [0]);
    const heads = (tensor, rows, pick) =>
      Array.from({ length: N }, (_, n) => Array.from({ length: h }, (_, a) => rows.map((r) => pick(tensor, r, n, a))));
    const S = encoded.enc_self.dims[3];
    const row = (data, offset, length) => data.subarray(offset, offset + length);
    return {
      encSelf: heads(encoded.enc_self, [...Array(S).keys()], (x, r, n, a) => row(x.data, ((n * h + a) * S + r) * S, S)),
      decSelf: heads(null, [...tokens.keys()], (_, t, n, a) =>
        row(steps[t].decSelf.data, (n * h + a) * (t + 1), t + 1),
      ),
      cross: heads(null, [...tokens.keys()], (_, t, n, a) => row(steps[t].cross.data, (n * h + a) * S, S)),
    };
  }
}

// Text in, translation out: a model per direction with its tokenizer, and what the page shows of a translation.
export class Translator {
  constructor(manifest, read, words) {
    Object.assign(this, { manifest, read, words, tokenizers: {}, models: {} });
  }

  // `read(file)` resolves to a file's bytes; `names` the directions to load (default: all of the manifest's).
  static async load(ort, manifest, read, names = Object.keys(manifest.models)) {
    const translator = new Translator(manifest, read, await readJSON(read, manifest.words));
    for (const name of names) await translator.addModel(ort, name);
    return translator;
  }

  async addModel(ort, name) {
    const file = this.manifest.models[name].tokenizer;
    if (!this.tokenizers[file]) this.tokenizers[file] = new Tokenizer(this.words, await readJSON(this.read, file));
    const model = await Model.load(ort, this.manifest, name, this.read);
    model.tokenizer = this.tokenizers[file];
    this.models[name] = model;
  }

  // The source words and ids of `text`, or an InputError that says what is wrong with it.
  source(text, name) {
    const model = this.models[name];
    if (!text.trim()) throw new InputError("Type a sentence to translate.");
    if (text.length > MAX_CHARS) {
      throw new InputError(`That is ${text.length} characters; the page takes at most ${MAX_CHARS}.`);
    }
    const words = model.tokenizer.words(text, model.entry.src_lang);
    const src = model.tokenizer.bpe.encodeWords(words);
    const most = model.config.max_len - 1;
    if (src.length > most) {
      throw new InputError(
        `That is ${src.length} pieces; the model reads at most ${most} (its ${model.config.max_len} ` +
          `positions, less one for </s>). Split it into shorter sentences.`,
      );
    }
    return { words, src };
  }

  async translate(text, name) {
    const { words, src } = this.source(text, name);
    const model = this.models[name];
    const start = performance.now();
    const { hyps, scores, best, encoded } = await model.search(src);
    const decode = (ids) => model.tokenizer.decode(ids);
    const candidates = hyps.map((ids, k) => ({ ids, text: decode(ids), score: scores[k], best: k === best }));
    return {
      name,
      text,
      src,
      hyp: hyps[best],
      translation: candidates[best].text,
      candidates,
      far: farness(words, src, model.tokenizer.bpe),
      seconds: (performance.now() - start) / 1000,
      encoded,
    };
  }

  async attention(result) {
    const model = this.models[result.name];
    const pieces = (ids) => ids.map((i) => model.tokenizer.piece(i));
    const weights = await model.attention(result.encoded, result.hyp);
    const tgt = [BOS, ...result.hyp].slice(0, model.config.max_len);
    return { ...weights, srcPieces: pieces([...result.src, EOS]), tgtPieces: pieces(tgt) };
  }
}

async function readJSON(read, file) {
  return JSON.parse(new TextDecoder().decode(await read(file)));
}

// What makes a sentence unlike the captions the model learned from: characters it never saw (byte pieces, <unk>),
// words it knows only as fragments (3 or more pieces), more pieces than any validation caption.
export function farness(words, src, bpe) {
  const unseen = src.filter((i) => i >= 3 && i < 260).length;
  const rare = words.filter((w) => bpe.word(w).length >= 3).length;
  const reasons = [];
  if (unseen) reasons.push(`${unseen} of its pieces stand for characters the model never saw`);
  if (rare >= 2 && rare >= FAR.share * words.length) {
    reasons.push(`${rare} of its ${words.length} words are rare to the model (it knows them only as fragments)`);
  }
  if (src.length > FAR.pieces) {
    reasons.push(`it is ${src.length} pieces long, longer than any caption it was checked on`);
  }
  return reasons;
}
