// AdminClient's approvals (issue 49) against a real daemon: a call an `approve` rule holds is
// listed by approvals(wait), approved (the call runs) or denied (the call gets the reason).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { AdminClient, NotFoundError } from "../dist/esm/index.js";
import { startDaemon } from "./daemon.mjs";

/** One stateless 2026-07-28 tools/call of the execution: the JSON-RPC answer. */
async function call(run, tool, args) {
  const r = await fetch(run.mcpUrl, {
    method: "POST",
    headers: {
      authorization: `Bearer ${run.token}`,
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": "2026-07-28",
      "mcp-method": "tools/call",
      "mcp-name": tool,
    },
    body: JSON.stringify({
      jsonrpc: "2.0", id: 1, method: "tools/call",
      params: {
        name: tool, arguments: args,
        _meta: { "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} },
      },
    }),
  });
  assert.equal(r.status, 200);
  const text = await r.text();
  // JSON, or an event stream whose last data line is the answer.
  if (text.trimStart().startsWith("{")) return JSON.parse(text);
  const data = text.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).filter(Boolean);
  return JSON.parse(data[data.length - 1]);
}

describe("approvals", () => {
  let d;
  let admin;
  before(async () => {
    d = await startDaemon();
    admin = new AdminClient({ url: d.url, token: d.token });
  });
  after(async () => d?.stop());

  test("a held call is listed, approved and run; another denied with the reason", async () => {
    const run = await admin.register({
      agentId: "ts-payer", tools: ["demo.echo"],
      policy: [{ id: "pay", when: "args.text.startsWith('pay')", effect: "approve", approver: "harness", timeout_s: 30 }],
    });
    const first = call(run, "demo.echo", { text: "pay 10" });
    const [held] = await admin.approvals(10);
    assert.equal(held.tool, "demo.echo");
    assert.equal(held.agent_id, "ts-payer");
    assert.equal(held.rule, "pay");
    assert.deepEqual(held.arguments, { text: "pay 10" });
    await admin.approve(held.id);
    const ok = await first;
    assert.equal(ok.result.isError ?? false, false, JSON.stringify(ok));
    assert.equal(ok.result.content[0].text, "ts-payer:pay 10");
    // Single use: deciding it again is a 409, an unknown id a 404.
    await assert.rejects(admin.approve(held.id), (e) => e.status === 409);
    await assert.rejects(admin.deny("no-such-approval"), (e) => e instanceof NotFoundError && e.status === 404);

    const second = call(run, "demo.echo", { text: "pay 20" });
    const [again] = await admin.approvals(10);
    await admin.deny(again.id, "over budget");
    const no = await second;
    assert.equal(no.result.isError, true);
    assert.match(no.result.content[0].text, /over budget/);
    assert.deepEqual(await admin.approvals(), []);
    await run.release();
  });
});
