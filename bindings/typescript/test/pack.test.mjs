// The `npm pack` tarball installs into a fresh folder (with the two SDKs the example uses, at
// the versions of package.json's devDependencies, from npm's cache when it has them) and runs
// examples/sdk-clients.mjs there against a real daemon.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { startDaemon } from "./daemon.mjs";

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

test("the packed tarball installs into a fresh folder and runs the SDK example", { timeout: 300_000 }, async () => {
  const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
  const fresh = mkdtempSync(join(tmpdir(), "gatehouse-pack-"));
  const d = await startDaemon();
  try {
    const packed = JSON.parse(
      execFileSync(npm, ["pack", "--json", "--pack-destination", fresh], { cwd: pkgDir, encoding: "utf8" }),
    );
    const tarball = join(fresh, packed[0].filename);
    const files = packed[0].files.map((f) => f.path);
    assert.ok(files.includes("dist/esm/index.js") && files.includes("dist/cjs/index.js"), files.join(" "));
    assert.ok(files.includes("examples/sdk-clients.mjs"));
    assert.ok(!files.some((f) => f.startsWith("src/") || f.startsWith("test/")), files.join(" "));
    const app = join(fresh, "app");
    execFileSync("mkdir", ["-p", app]);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "fresh-app", private: true, type: "module" }));
    const deps = ["@modelcontextprotocol/sdk", "@ai-sdk/mcp", "zod"].map((n) => `${n}@${pkg.devDependencies[n]}`);
    execFileSync(npm, ["install", "--no-audit", "--no-fund", "--prefer-offline", tarball, ...deps], {
      cwd: app,
      stdio: ["ignore", "ignore", "inherit"],
    });
    // What it installed has no runtime dependency.
    const installed = JSON.parse(readFileSync(join(app, "node_modules/@gatehouse/client/package.json"), "utf8"));
    assert.equal(installed.dependencies, undefined);
    copyFileSync(join(app, "node_modules/@gatehouse/client/examples/sdk-clients.mjs"), join(app, "sdk-clients.mjs"));
    const env = { ...process.env, GATEHOUSE_ADMIN_URL: d.url, GATEHOUSE_ADMIN_TOKEN: d.token };
    const r = spawnSync(process.execPath, ["sdk-clients.mjs", "demo.echo"], { cwd: app, env, encoding: "utf8", timeout: 120_000 });
    assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /^probe: ok in /m);
    assert.match(r.stdout, /^mcp sdk: tools demo\.echo; demo\.echo -> .*from the MCP SDK/m);
    assert.match(r.stdout, /^ai sdk: tools demo\.echo; demo\.echo -> .*from the AI SDK/m);
    assert.match(r.stdout, /^after release: released$/m);
    // CommonJS consumers get the same client.
    const cjs = spawnSync(process.execPath, ["-e", "console.log(typeof require('@gatehouse/client').AdminClient)"], { cwd: app, encoding: "utf8" });
    assert.equal(cjs.stdout.trim(), "function", cjs.stderr);
  } finally {
    await d.stop();
    rmSync(fresh, { recursive: true, force: true });
  }
});
