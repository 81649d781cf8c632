// The page in Firefox, through WebDriver BiDi (puppeteer-core drives the Firefox already installed; nothing is
// downloaded): `node web/firefox/translate.mjs URL "en-de=A sentence." "de-en=Ein Satz." ...` opens the page at URL,
// translates each sentence, and prints one JSON line: the translations, the size of each drawn attention map, the
// number of head thumbnails and every error the page logged. tests/test_browser.py compares them with Python's.
import puppeteer from "puppeteer-core";

const [url, ...items] = process.argv.slice(2);
const browser = await puppeteer.launch({
  browser: "firefox",
  executablePath: process.env.FIREFOX || "/usr/bin/firefox-esr",
  headless: true,
});
const report = { version: await browser.version(), results: [], errors: [] };
try {
  const page = await browser.newPage();
  page.on("console", (m) => m.type() === "error" && report.errors.push(m.text()));
  page.on("pageerror", (e) => report.errors.push(String(e)));
  await page.goto(url);
  const state = (...want) => page.waitForFunction(
    (w) => w.includes(document.getElementById("try-model")?.dataset.state), { timeout: 120000 }, want);
  await state("ready");
  for (const item of items) {
    const [direction, text] = [item.slice(0, item.indexOf("=")), item.slice(item.indexOf("=") + 1)];
    await page.select("#try-direction", direction);
    await page.$eval("#try-text", (e, t) => { e.value = t; }, text);
    await page.click("#try-model button[type=submit]");
    await state("done", "error");
    report.results.push({
      direction,
      text,
      translation: await page.$eval(".try-translation", (e) => e.textContent),
      drawn: await page.$eval(".try-head", (c) => c.dataset.drawn),
      thumbs: await page.$$eval(".try-thumb canvas", (cs) => cs.length),
    });
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
