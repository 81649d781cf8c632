// Beam search (§6.1: K = 4, α = 0.6) for one sentence, as aiayn.decoding.beam_search and aiayn.browser.beam_search
// do it, in float32: every sum and quotient is rounded to float32 (Math.fround), and the length penalties are the
// float32 numbers Python computed (manifest.json), so that the page ranks candidates exactly as Python does.

export const BOS = 1;
export const EOS = 2;

// The K best of `values` (a number per index), highest first; equal values in index order (numpy's stable argsort).
export function topK(count, K, value) {
  const best = []; // [value, index]
  for (let i = 0; i < count; i++) {
    const v = value(i);
    if (best.length === K && !(v > best[K - 1][0])) continue;
    let at = best.length;
    while (at > 0 && best[at - 1][0] < v) at--;
    best.splice(at, 0, [v, i]);
    if (best.length > K) best.pop();
  }
  return best;
}

// aiayn.decoding.strip_specials: the ids before the first </s>, without <s> and <pad>.
export function strip(ids, pad = 0) {
  const out = [];
  for (const i of ids) {
    if (i === EOS) break;
    if (i !== pad && i !== BOS) out.push(i);
  }
  return out;
}

// `step(t, last, parent)` resolves to log p(y_t | y_<t, x) as a Float32Array (K * V) for each slot's newest token
// `last`, once the slot's cache is gathered from `parent`, the slot of step t - 1 it continues. `lp[n]` is the length
// penalty of a hypothesis of n tokens; `limit` the most output tokens (</s> included). Returns every slot's
// hypothesis (ids without <s> and </s>) with its score log p / lp, and the index of the best.
export async function beamSearch(step, { K, V, lp, limit, pad = 0 }) {
  let logpSum = Array.from({ length: K }, (_, k) => (k ? -Infinity : 0));
  let lengths = new Array(K).fill(0);
  let ended = logpSum.map((s) => s === -Infinity);
  let tokens = Array.from({ length: K }, () => [BOS]);
  let parent = Array.from({ length: K }, (_, k) => k);
  for (let t = 0; t < limit; t++) {
    const logp = await step(t, tokens.map((row) => row[row.length - 1]), parent);
    // an ended hypothesis competes as itself, in its <pad> column; a live one by each extension
    const cand = (i) => {
      const k = Math.floor(i / V);
      const y = i - k * V;
      if (ended[k]) return y === pad ? logpSum[k] : -Infinity;
      return y === pad ? -Infinity : Math.fround(logpSum[k] + logp[i]);
    };
    const ranked = (i) => {
      const k = Math.floor(i / V);
      return Math.fround(cand(i) / lp[ended[k] ? lengths[k] : t + 1]);
    };
    const best = topK(K * V, K, ranked).map(([, i]) => i);
    parent = best.map((i) => Math.floor(i / V));
    const token = best.map((i) => i % V);
    const wasEnded = parent.map((p) => ended[p]);
    logpSum = best.map(cand);
    lengths = parent.map((p, k) => (wasEnded[k] ? lengths[p] : t + 1));
    ended = token.map((y, k) => wasEnded[k] || y === EOS || t + 1 >= limit || logpSum[k] === -Infinity);
    tokens = parent.map((p, k) => [...tokens[p], token[k]]);
    if (ended.every(Boolean)) break;
  }
  const scores = logpSum.map((s, k) => Math.fround(s / lp[lengths[k]]));
  let top = 0;
  scores.forEach((s, k) => {
    if (s > scores[top]) top = k;
  });
  return { hyps: tokens.map((row) => strip(row, pad)), scores, best: top };
}
