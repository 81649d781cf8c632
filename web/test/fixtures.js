// The fixtures Python writes (`python -m aiayn.browser fixtures`), and the export they were made from.
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const FIXTURES = process.env.AIAYN_FIXTURES || join(here, "fixtures", "fixtures.json");
export const MISSING =
  `no ${FIXTURES}: run \`python -m aiayn.browser export\` then \`python -m aiayn.browser fixtures\``;

export const fixtures = existsSync(FIXTURES) ? JSON.parse(readFileSync(FIXTURES, "utf-8")) : null;

// The export's manifest and a `read(file)` over its folder, or null where the folder is gone.
export function exported() {
  const folder = fixtures && fixtures.model_dir;
  if (!folder || !existsSync(join(folder, "manifest.json"))) return null;
  const manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf-8"));
  return { folder, manifest, read: async (file) => new Uint8Array(readFileSync(join(folder, file))) };
}
