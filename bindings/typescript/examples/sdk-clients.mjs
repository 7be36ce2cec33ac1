// An execution's URL and token, used by the official MCP TypeScript SDK's client and by the
// Vercel AI SDK's MCP client (@ai-sdk/mcp). The harness registers the run, probes it (the
// seed's "connect and list tools within N seconds" as one call), hands mcpUrl and token to the
// agent's client, and releases on dispose.
//
//   GATEHOUSE_ADMIN_URL=http://127.0.0.1:8788 GATEHOUSE_ADMIN_TOKEN=… node examples/sdk-clients.mjs [tool]
//
// `tool` (default `demo.echo`, the daemon's `--test-tools`) is granted and called with {text}.
// Needs @modelcontextprotocol/sdk and @ai-sdk/mcp installed beside @gatehouse/client.

import { AdminClient } from "@gatehouse/client";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { createMCPClient } from "@ai-sdk/mcp";

const tool = process.argv[2] ?? "demo.echo";
const admin = new AdminClient(); // GATEHOUSE_ADMIN_URL, GATEHOUSE_ADMIN_TOKEN
const run = await admin.register({ agentId: "example-agent", tools: [tool], label: "sdk-clients", ttlSeconds: 60 });
try {
  const probe = await run.probe({ timeoutMs: 5000 });
  console.log(`probe: ok in ${probe.elapsed_ms} ms, tools ${probe.tools.listed.join(", ")}`);

  // The official MCP TypeScript SDK.
  const transport = new StreamableHTTPClientTransport(new URL(run.mcpUrl), {
    requestInit: { headers: { Authorization: `Bearer ${run.token}` } },
  });
  const sdk = new Client({ name: "gatehouse-example", version: "1.0.0" });
  await sdk.connect(transport);
  const listed = (await sdk.listTools()).tools.map((t) => t.name);
  const called = await sdk.callTool({ name: tool, arguments: { text: "from the MCP SDK" } });
  await sdk.close();
  console.log(`mcp sdk: tools ${listed.join(", ")}; ${tool} -> ${called.content.map((c) => c.text).join("")}`);

  // The Vercel AI SDK's MCP client: its tools are AI SDK tools (as generateText takes them).
  const ai = await createMCPClient({
    transport: { type: "http", url: run.mcpUrl, headers: { Authorization: `Bearer ${run.token}` } },
  });
  try {
    const tools = await ai.tools();
    const out = await tools[tool].execute({ text: "from the AI SDK" }, { toolCallId: "example-1", messages: [] });
    console.log(`ai sdk: tools ${Object.keys(tools).join(", ")}; ${tool} -> ${out.content.map((c) => c.text).join("")}`);
  } finally {
    await ai.close();
  }
} finally {
  await run.close();
}
const after = await run.probe({ noThrow: true });
console.log(`after release: ${after.failure?.reason}`);
if (after.failure?.reason !== "released") process.exit(1);
