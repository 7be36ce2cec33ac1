// A real `gatehouse serve` (target/debug/gatehouse, or $GATEHOUSE_BIN) on 127.0.0.1:0 with a
// temporary config, admin token file and audit log; stopped by `stop()`.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const ROOT = resolve(here, "../../..");

export function gatehouseBin() {
  const bin = process.env.GATEHOUSE_BIN ?? join(ROOT, "target/debug/gatehouse");
  if (!existsSync(bin)) throw new Error(`the gatehouse binary is missing (${bin}): run cargo build first`);
  return bin;
}

export async function startDaemon(upstreams = "") {
  const dir = mkdtempSync(join(tmpdir(), "gatehouse-ts-"));
  const config = join(dir, "gatehouse.toml");
  writeFileSync(
    config,
    `listen = "127.0.0.1:0"\nadmin_listen = "127.0.0.1:0"\nadmin_token_file = ${JSON.stringify(join(dir, "admin.token"))}\n` +
      `linger_ms = 0\n${upstreams}\n[audit]\npath = ${JSON.stringify(join(dir, "audit.jsonl"))}\nfsync = "never"\n`,
  );
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("GATEHOUSE_")));
  env.RUST_LOG = "warn";
  const child = spawn(gatehouseBin(), ["serve", "--test-tools", "--config", config], {
    env,
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  const url = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`gatehouse serve did not start:\n${stderr}`)), 30_000);
    let admin = null;
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d) => {
      stderr += d;
      admin ??= /admin listener on (http:\/\/\S+)/.exec(stderr)?.[1] ?? null;
      if (admin && stderr.includes("gatehouse: ready")) {
        clearTimeout(timer);
        ok(admin);
      }
    });
    child.on("exit", (code) => fail(new Error(`gatehouse serve exited (${code}):\n${stderr}`)));
  });
  const token = readFileSync(join(dir, "admin.token"), "utf8").trim();
  return {
    url,
    token,
    dir,
    stderr: () => stderr,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The helpdesk demo upstream, made unable to start again once `down` exists. */
export function flakyHelpdesk(down) {
  const script = `if [ -e '${down}' ]; then exit 1; fi; exec '${gatehouseBin()}' demo-upstream`;
  return `[[upstreams]]\nid = "helpdesk"\ncommand = "sh"\nargs = ["-c", ${JSON.stringify(script)}]\nsharing = "shared"\ncall_timeout_s = 5\n`;
}
