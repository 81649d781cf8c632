// web/tokenizer.js against aiayn.tokenization: the same words and the same ids for every sentence of val and
// test 2016 in both languages, and for the edge cases of aiayn.browser.EDGE_CASES.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { Tokenizer } from "../tokenizer.js";
import { exported, fixtures, MISSING } from "./fixtures.js";

const model = exported();
const skip = !fixtures ? MISSING : !model ? `the export in ${fixtures.model_dir} is gone: export again` : false;

function tokenizerFor(file) {
  const json = (f) => JSON.parse(readFileSync(join(model.folder, f), "utf-8"));
  return new Tokenizer(json(model.manifest.words), json(file));
}

for (const [file, langs] of Object.entries(fixtures ? fixtures.tokenizers : {})) {
  for (const [lang, cases] of Object.entries(langs)) {
    test(`${file}, ${lang}: words and ids of ${cases.length} sentences equal Python's`, { skip }, () => {
      const tokenizer = tokenizerFor(file);
      const wrong = cases.filter((c) => JSON.stringify(tokenizer.words(c.text, lang)) !== JSON.stringify(c.words));
      assert.deepEqual(wrong.slice(0, 3).map((c) => [c.text, tokenizer.words(c.text, lang), c.words]), []);
      for (const c of cases) assert.deepEqual(tokenizer.encode(c.text, lang), c.ids, c.text);
    });
    test(`${file}, ${lang}: decode gives back the text of the pieces`, { skip }, () => {
      const tokenizer = tokenizerFor(file);
      for (const c of cases.slice(0, 200)) {
        assert.equal(tokenizer.decode(c.ids), c.words.join("").replaceAll("\u2581", " "));
      }
    });
  }
}

test("the fixtures are there", { skip: fixtures ? false : MISSING }, () => {
  assert.ok(Object.keys(fixtures.tokenizers).length > 0);
});
