// The book's tokenizer (aiayn.tokenization) in the browser: spaCy's word rules (spacy.blank(lang).tokenizer, from
// words.json, which `python -m aiayn.browser export` writes), then the joint BPE (Hugging Face tokenizers' BPE with
// byte fallback). web/test/tokenizer.test.js checks both against Python on every sentence of val and test 2016.

export const SPACE = "\u2581"; // "▁": the word followed a space

// Python's re.search(pattern).span() for a JavaScript source that js_regex wrote.
function searcher(source) {
  if (!source) return () => null;
  const re = new RegExp(source, "u");
  return (text) => {
    const m = re.exec(text);
    return m && [m.index, m.index + m[0].length];
  };
}

// Python's re.finditer: non-overlapping matches left to right; an empty match moves the search on by a character.
function finder(source) {
  if (!source) return () => [];
  const re = new RegExp(source, "gu");
  return (text) => {
    const spans = [];
    re.lastIndex = 0;
    for (let m = re.exec(text); m; m = re.exec(text)) {
      spans.push([m.index, m.index + m[0].length]);
      if (m[0].length === 0) re.lastIndex += text.codePointAt(m.index) > 0xffff ? 2 : 1;
    }
    return spans;
  };
}

// spaCy's rule-based tokeniser for one language, as spacy/tokenizer.pyx does it with faster_heuristics: split on
// whitespace, peel prefixes and suffixes off each chunk, split the rest at infixes, then apply the special cases
// that hold affixes (its PhraseMatcher pass).
export class WordRules {
  constructor(rules, isspace) {
    this.isspace = isspace;
    this.prefix = searcher(rules.prefix);
    this.suffix = searcher(rules.suffix);
    this.infixes = finder(rules.infix);
    this.tokenMatch = searcher(rules.token_match && `^(?:${rules.token_match})`);
    this.urlMatch = searcher(rules.url_match && `^(?:${rules.url_match})`);
    this.rules = new Map(Object.entries(rules.rules));
    this.matched = Object.entries(rules.matched); // [special case, the tokens it is found as]
  }

  // [{text, space}]: spaCy's tokens and whether a space follows each (token.whitespace_).
  tokens(text) {
    const doc = [];
    const chars = Array.from(text);
    if (!chars.length) return doc;
    let inWs = this.isspace.has(chars[0].codePointAt(0));
    let start = 0;
    chars.forEach((c, i) => {
      if (this.isspace.has(c.codePointAt(0)) === inWs) return;
      if (start < i) this.chunk(doc, chars.slice(start, i).join(""));
      if (c === " ") {
        doc[doc.length - 1].space = true;
        start = i + 1;
      } else start = i;
      inWs = !inWs;
    });
    if (start < chars.length) {
      this.chunk(doc, chars.slice(start).join(""));
      doc[doc.length - 1].space = false;
    }
    return this.applySpecialCases(doc);
  }

  chunk(doc, text) {
    if (this.rules.has(text)) {
      for (const piece of this.rules.get(text)) doc.push({ text: piece, space: false });
      return;
    }
    const [rest, prefixes, suffixes] = this.splitAffixes(text);
    for (const p of prefixes) doc.push({ text: p, space: false });
    if (rest) this.attach(doc, rest);
    for (const s of suffixes.reverse()) doc.push({ text: s, space: false });
  }

  // spaCy's _split_affixes: [what is left, prefixes, suffixes (innermost last)]
  splitAffixes(text) {
    const prefixes = [];
    const suffixes = [];
    let last = -1;
    while (text && text.length !== last) {
      if (this.tokenMatch(text) || this.rules.has(text)) break;
      last = text.length;
      const pre = this.prefix(text);
      const preLen = pre ? pre[1] - pre[0] : 0;
      if (preLen && text.length > preLen && this.rules.has(text.slice(preLen))) {
        prefixes.push(text.slice(0, preLen));
        return [text.slice(preLen), prefixes, suffixes];
      }
      const suf = this.suffix(text.slice(preLen));
      const sufLen = suf ? suf[1] - suf[0] : 0;
      const minusSuf = text.slice(0, text.length - sufLen);
      if (sufLen && minusSuf && this.rules.has(minusSuf)) {
        suffixes.push(text.slice(text.length - sufLen));
        return [minusSuf, prefixes, suffixes];
      }
      if (preLen && sufLen && preLen + sufLen <= text.length) {
        prefixes.push(text.slice(0, preLen));
        suffixes.push(text.slice(text.length - sufLen));
        text = text.slice(preLen, text.length - sufLen);
      } else if (preLen) {
        prefixes.push(text.slice(0, preLen));
        text = text.slice(preLen);
      } else if (sufLen) {
        suffixes.push(text.slice(text.length - sufLen));
        text = minusSuf;
      }
    }
    return [text, prefixes, suffixes];
  }

  // spaCy's _attach_tokens for what the affixes left: a special case, a URL, or the pieces between infixes.
  attach(doc, text) {
    const push = (t) => doc.push({ text: t, space: false });
    if (this.rules.has(text)) return this.rules.get(text).forEach(push);
    if (this.tokenMatch(text) || this.urlMatch(text)) return push(text);
    let start = 0;
    for (const [from, to] of this.infixes(text)) {
      if (from === 0) continue;
      if (from !== start) push(text.slice(start, from));
      if (from !== to) push(text.slice(from, to));
      start = to;
    }
    if (start < text.length) push(text.slice(start));
  }

  // spaCy's _apply_special_cases: special cases found as several tokens, longest first, never overlapping.
  applySpecialCases(doc) {
    const found = [];
    doc.forEach((_, i) => {
      for (const [, pieces] of this.matched) {
        if (pieces.every((p, j) => doc[i + j] && doc[i + j].text === p)) found.push([i, i + pieces.length]);
      }
    });
    if (!found.length) return doc;
    found.sort((a, b) => b[1] - b[0] - (a[1] - a[0]) || a[0] - b[0]);
    const seen = new Set();
    const kept = [];
    for (const [from, to] of found) {
      if (!seen.has(from) && !seen.has(to - 1)) kept.push([from, to]);
      for (let i = from; i < to; i++) seen.add(i);
    }
    kept.sort((a, b) => a[0] - b[0]);
    const out = [];
    let i = 0;
    for (const [from, to] of kept) {
      out.push(...doc.slice(i, from));
      const span = doc.slice(from, to);
      const text = span.map((t, j) => t.text + (t.space && j < span.length - 1 ? " " : "")).join("");
      if (this.rules.has(text)) {
        const pieces = this.rules.get(text).map((p) => ({ text: p, space: false }));
        pieces[pieces.length - 1].space = span[span.length - 1].space;
        out.push(...pieces);
      } else out.push(...span);
      i = to;
    }
    return out.concat(doc.slice(i));
  }

  // aiayn.tokenization.pretokenize: the words, each with SPACE in front if a space preceded it.
  words(text) {
    const words = [];
    let spaceBefore = false;
    for (const token of this.tokens(text)) {
      words.push((spaceBefore ? SPACE : "") + token.text.replaceAll(" ", SPACE));
      spaceBefore = token.space;
    }
    if (spaceBefore) words.push(SPACE);
    return words;
  }
}

// The joint BPE: each character a piece (or its UTF-8 bytes, <0x..>, if training never saw it), then the merges
// applied lowest rank first, leftmost first among equals (tokenizers' BPE.merge_word).
export class BPE {
  constructor({ pieces, merges }) {
    this.pieces = pieces;
    this.ids = new Map(pieces.map((p, i) => [p, i]));
    this.merges = new Map();
    merges.forEach(([a, b], rank) => {
      this.merges.set(this.ids.get(a) * pieces.length + this.ids.get(b), [rank, this.ids.get(a + b)]);
    });
    this.cache = new Map();
    this.encoder = new TextEncoder();
  }

  word(word) {
    if (this.cache.has(word)) return this.cache.get(word);
    let symbols = [];
    for (const c of word) {
      if (this.ids.has(c)) symbols.push(this.ids.get(c));
      else for (const b of this.encoder.encode(c)) symbols.push(4 + b);
    }
    const V = this.pieces.length;
    for (;;) {
      let best = null;
      for (let i = 0; i + 1 < symbols.length; i++) {
        const merge = this.merges.get(symbols[i] * V + symbols[i + 1]);
        if (merge && (!best || merge[0] < best[0])) best = [merge[0], merge[1], i];
      }
      if (!best) break;
      symbols = [...symbols.slice(0, best[2]), best[1], ...symbols.slice(best[2] + 2)];
    }
    this.cache.set(word, symbols);
    return symbols;
  }

  encodeWords(words) {
    return words.flatMap((w) => this.word(w));
  }

  // aiayn.tokenization.Tokenizer.decode: <pad>, <s>, </s> skipped, byte pieces put back together as UTF-8.
  decode(ids) {
    const decoder = new TextDecoder("utf-8");
    let out = "";
    let pending = [];
    const flush = () => {
      out += decoder.decode(new Uint8Array(pending));
      pending = [];
    };
    for (const i of ids) {
      if (i >= 4 && i < 260) {
        pending.push(i - 4);
        continue;
      }
      flush();
      if (i > 2) out += this.pieces[i];
    }
    flush();
    return out.replaceAll(SPACE, " ");
  }
}

// Both together: encode(text, lang) gives aiayn.tokenization.Tokenizer.encode(text, lang)'s ids.
export class Tokenizer {
  constructor(words, bpe) {
    const isspace = new Set(words.isspace);
    this.langs = Object.fromEntries(Object.entries(words.langs).map(([l, r]) => [l, new WordRules(r, isspace)]));
    this.bpe = new BPE(bpe);
  }

  words(text, lang) {
    return this.langs[lang].words(text);
  }

  encode(text, lang) {
    return this.bpe.encodeWords(this.words(text, lang));
  }

  decode(ids) {
    return this.bpe.decode(ids);
  }

  piece(id) {
    return this.bpe.pieces[id];
  }
}
