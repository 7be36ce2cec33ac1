// @gatehouse/client against a real daemon (node --test). Every test starts its own
// `gatehouse serve` (test/daemon.mjs); nothing is mocked.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  AdminAuthError,
  AdminClient,
  AdminUnreachableError,
  Execution,
  InvalidRequestError,
  NotFoundError,
  ProbeError,
} from "../dist/esm/index.js";
import { flakyHelpdesk, startDaemon } from "./daemon.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const PROBE_KEYS = [
  "elapsed_ms", "failure", "id", "latency_ms", "ok", "protocol_version", "reachable", "tools",
  "upstreams", "upstreams_down",
].sort();

describe("AdminClient and Execution", () => {
  let d;
  let admin;
  before(async () => {
    d = await startDaemon(`[[upstreams]]\nid = "helpdesk"\ncommand = "@self"\nargs = ["demo-upstream"]\nsharing = "shared"\n`);
    admin = new AdminClient({ url: d.url, token: d.token });
  });
  after(async () => d?.stop());

  test("register, get, list, renew, probe, child, release", async () => {
    const run = await admin.register({ agentId: "ts-agent", tools: ["demo.echo", "helpdesk.*"], label: "run-1", ttlSeconds: 600 });
    assert.ok(run instanceof Execution);
    assert.match(run.mcpUrl, new RegExp(`/gw/${run.id}/mcp$`));
    assert.match(run.sseUrl, new RegExp(`/gw/${run.id}/sse$`));
    assert.ok(run.token.length > 20);
    assert.ok(!JSON.stringify(run).includes(run.token), "toJSON never carries the token");
    const info = await admin.get(run.id);
    assert.equal(info.agent_id, "ts-agent");
    assert.equal(info.label, "run-1");
    assert.deepEqual(info.tools, run.tools);
    assert.ok((await admin.list()).some((r) => r.id === run.id));
    const renewed = await run.renew(1200);
    assert.equal(renewed.id, run.id);
    assert.ok(renewed.expires_at);

    const p = await run.probe({ timeoutMs: 10_000 });
    assert.deepEqual(Object.keys(p).sort(), PROBE_KEYS);
    assert.equal(p.ok, true);
    assert.equal(p.reachable, true);
    assert.equal(p.tools.equal, true);
    assert.deepEqual(p.tools.listed, run.tools);
    assert.deepEqual(p.upstreams.map((u) => [u.id, u.answered]), [["helpdesk", true]]);
    assert.ok(p.latency_ms > 0);
    assert.ok(!JSON.stringify(p).includes(run.token));

    const kid = await run.child({ agentId: "ts-sub-agent", tools: ["demo.echo"] });
    assert.equal((await admin.get(kid.id)).parent, run.id);

    assert.equal(await run.release(), true);
    assert.equal(await run.release(), true, "idempotent");
    await assert.rejects(admin.get(run.id), (e) => e instanceof NotFoundError && e.status === 404);
    await assert.rejects(admin.get(kid.id), NotFoundError, "the child goes with its parent");
    assert.equal(await admin.release(run.id), false);
    await assert.rejects(run.probe({ timeoutMs: 10_000 }), (e) => {
      assert.ok(e instanceof ProbeError);
      assert.equal(e.reason, "released");
      assert.equal(e.status, 404);
      assert.equal(e.probe.reachable, false);
      return true;
    });
  });

  test("the lease is renewed in the background, and dispose releases", async () => {
    const run = await admin.register({ agentId: "ts-renewing", tools: ["demo.echo"], ttlSeconds: 1 });
    await sleep(2500);
    assert.ok(run.renewals >= 2, `renewals: ${run.renewals} (${run.renewError})`);
    assert.equal((await admin.get(run.id)).id, run.id, "alive after twice its ttl");
    await run[Symbol.asyncDispose]();
    assert.equal(run.released, true);
    await assert.rejects(admin.get(run.id), NotFoundError);

    const unrenewed = await admin.register({ agentId: "ts-lapsing", tools: ["demo.echo"], ttlSeconds: 1 }, { renew: false });
    await sleep(2500);
    await assert.rejects(admin.get(unrenewed.id), NotFoundError, "without renewal it expires");
    await unrenewed.close();
  });

  test("`await using` (compiled by tsc) releases at the end of the block", async () => {
    const { runScoped } = await import("../dist-test/test/await-using.js");
    const id = await runScoped(admin);
    await assert.rejects(admin.get(id), NotFoundError);
  });

  test("typed errors mirror the admin API", async () => {
    await assert.rejects(admin.register({ agentId: "", tools: ["demo.echo"] }), (e) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.status, 400);
      assert.match(e.error, /agent_id/);
      return true;
    });
    await assert.rejects(admin.register({ agentId: "x", tools: ["nosuch.*"] }), InvalidRequestError);
    const wrong = new AdminClient({ url: d.url, token: "not-the-admin-token" });
    await assert.rejects(wrong.list(), (e) => e instanceof AdminAuthError && e.status === 401);
    const nowhere = new AdminClient({ url: "http://127.0.0.1:9", token: "t" });
    await assert.rejects(nowhere.list(), AdminUnreachableError);
    // Issue 47's endpoint: credentials for an upstream that is not configured are refused
    // naming it (400); an unknown registration is 404.
    const run = await admin.register({ agentId: "ts-creds", tools: ["demo.echo"] });
    await assert.rejects(admin.rotateCredentials(run.id, { github: { bearer: "x" } }), (e) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.match(e.error, /upstream_credentials\.github/);
      return true;
    });
    await assert.rejects(admin.rotateCredentials("nosuch", { github: { bearer: "x" } }), NotFoundError);
    await run.close();
  });

  test("from GATEHOUSE_ADMIN_URL and GATEHOUSE_ADMIN_TOKEN", async () => {
    const saved = { ...process.env };
    try {
      delete process.env.GATEHOUSE_ADMIN_URL;
      assert.throws(() => new AdminClient({ token: "t" }), /GATEHOUSE_ADMIN_URL/);
      process.env.GATEHOUSE_ADMIN_URL = d.url;
      process.env.GATEHOUSE_ADMIN_TOKEN = d.token;
      assert.ok(Array.isArray(await new AdminClient().list()));
    } finally {
      process.env = saved;
    }
  });

  test("audit query", async () => {
    const run = await admin.register({ agentId: "ts-audited", tools: ["demo.echo"] });
    await run.close();
    let page;
    for (let i = 0; i < 50; i++) {
      page = await admin.audit({ registration_id: run.id, limit: 10 });
      if (page.records.some((r) => r.event === "registration_released")) break;
      await sleep(100);
    }
    const events = page.records.map((r) => r.event);
    assert.ok(events.includes("registration_created"), events.join(","));
    assert.ok(events.includes("registration_released"), events.join(","));
    assert.ok(page.records.every((r) => r.registration_id === run.id));
    await assert.rejects(admin.audit({ outcome: "maybe" }), InvalidRequestError);
  });

  test("probe: a wrong token is refused", async () => {
    const run = await admin.register({ agentId: "ts-refused", tools: ["demo.echo"] });
    await assert.rejects(admin.probe(run.id, "not-the-token", { mcpUrl: run.mcpUrl }), (e) => {
      assert.ok(e instanceof ProbeError);
      assert.equal(e.reason, "refused");
      assert.equal(e.status, 401);
      return true;
    });
    // Without the URL, the daemon says where the registration is served.
    const p = await admin.probe(run.id, run.token);
    assert.equal(p.ok, true);
    await run.close();
  });
});

test("probe: an upstream that cannot answer is named", async () => {
  const { mkdtempSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const down = join(mkdtempSync(join(tmpdir(), "gatehouse-down-")), "down");
  const d = await startDaemon(flakyHelpdesk(down));
  try {
    const admin = new AdminClient({ url: d.url, token: d.token });
    const run = await admin.register({ agentId: "ts-flaky", tools: ["helpdesk.*"] });
    assert.equal((await run.probe({ timeoutMs: 10_000 })).ok, true);
    writeFileSync(down, "");
    const pids = (await admin.upstreams()).flatMap((u) => u.connections.map((c) => c.pid)).filter(Boolean);
    assert.equal(pids.length, 1, JSON.stringify(pids));
    process.kill(pids[0], "SIGKILL");
    const p = await run.probe({ timeoutMs: 10_000, noThrow: true });
    assert.equal(p.ok, false);
    assert.equal(p.failure.reason, "upstream_down");
    assert.deepEqual(p.upstreams_down, ["helpdesk"]);
    assert.equal(p.reachable, true);
    assert.match(p.failure.message, /helpdesk/);
    await run.close();
  } finally {
    await d.stop();
  }
});

test("the CommonJS build exports the same client", () => {
  const out = execFileSync(process.execPath, ["-e", "const c = require('@gatehouse/client'); console.log(typeof c.AdminClient, typeof c.ProbeError)"], {
    cwd: join(import.meta.dirname ?? ".", ".."),
    encoding: "utf8",
  });
  assert.equal(out.trim(), "function function");
});
