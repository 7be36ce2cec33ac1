// Builds dist/esm (ES modules + .d.ts), dist/cjs (CommonJS) and dist-test with tsc, and marks dist/cjs
// as CommonJS (the package itself is "type": "module").
import { execFileSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
rmSync(join(root, "dist"), { recursive: true, force: true });
rmSync(join(root, "dist-test"), { recursive: true, force: true });
// dist-test: the tests' `await using` file (not packed).
for (const p of ["tsconfig.esm.json", "tsconfig.cjs.json", "tsconfig.test.json"]) {
  execFileSync(process.execPath, [tsc, "-p", join(root, p)], { stdio: "inherit", cwd: root });
}
mkdirSync(join(root, "dist/cjs"), { recursive: true });
writeFileSync(join(root, "dist/cjs/package.json"), '{\n  "type": "commonjs"\n}\n');
