// A headless MCP Apps host (issue 52 item 1, tests/apps.rs): the ext-apps SDK's host side
// (`AppBridge`, over the official TypeScript client 2.x) talks to the gateway over Streamable
// HTTP, and its app side (`App`) stands in for the view, linked in memory as an iframe's
// postMessage would link them. The app's `callServerTool` goes through the bridge to the
// gateway, as a rendered view's would.
//
//   node apps_host.mjs MCP_URL TOKEN APP_TOOL ARGS_JSON
//
// Prints one JSON line: the server's `extensions`, the tools with a view, the first view read
// (uri, mimeType, length), and the app's call result.
import { Client, InMemoryTransport, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { App } from "@modelcontextprotocol/ext-apps";
import { AppBridge, RESOURCE_MIME_TYPE } from "@modelcontextprotocol/ext-apps/app-bridge";

const [url, token, appTool, argsJson] = process.argv.slice(2);
const EXT = "io.modelcontextprotocol/ui";

const client = new Client(
  { name: "gatehouse-apps-host", version: "0.0.0" },
  { capabilities: { extensions: { [EXT]: { mimeTypes: [RESOURCE_MIME_TYPE] } } } },
);
await client.connect(
  new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  }),
);
const out = { extensions: client.getServerCapabilities()?.extensions ?? null };

const { tools } = await client.listTools();
out.views = tools
  .filter((t) => t._meta?.ui?.resourceUri)
  .map((t) => ({ name: t.name, uri: t._meta.ui.resourceUri }));
const first = out.views[0];
if (first) {
  const r = await client.readResource({ uri: first.uri });
  const c = r.contents[0];
  out.read = { uri: c.uri, mimeType: c.mimeType, length: (c.text ?? "").length };
}

const bridge = new AppBridge(
  client,
  { name: "gatehouse-apps-host", version: "0.0.0" },
  { serverTools: {}, serverResources: {} },
);
// No DOM here: the view's size is not watched.
const app = new App({ name: "headless-view", version: "0.0.0" }, {}, { autoResize: false });
const [hostSide, viewSide] = InMemoryTransport.createLinkedPair();
await bridge.connect(hostSide);
await app.connect(viewSide);
const result = await app.callServerTool({ name: appTool, arguments: JSON.parse(argsJson) });
out.call = { isError: result.isError ?? false, structuredContent: result.structuredContent ?? null };
console.log(JSON.stringify(out));
await app.close();
await bridge.close();
await client.close();
