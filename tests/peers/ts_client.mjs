#!/usr/bin/env node
// An MCP client built on the official TypeScript SDK (@modelcontextprotocol/sdk), driven by
// gatehouse's tests. Same contract as py_client.py:
//
//   node ts_client.mjs --transport {sse,streamable,client} --url URL --token TOKEN
//        [--call TOOL [--args JSON]] [--progress] [--cancel-after SECONDS] [--timeout SECONDS]
//
//   sse         SSEClientTransport (legacy HTTP+SSE)
//   streamable  StreamableHTTPClientTransport (handshake-era Streamable HTTP; this SDK speaks up
//               to 2025-11-25 and has no 2026-07-28 / server/discover support)
//   client      the SDK's documented backwards-compatible pattern: try Streamable HTTP, and on
//               failure fall back to SSE on the same URL
//
// Every HTTP request carries `Authorization: Bearer TOKEN` (requestInit.headers; in this SDK
// version SSEClientTransport also applies requestInit.headers to the EventSource GET).
//
// Prints ONE JSON object on stdout:
//   {"transport", "protocol_version", "server_name", "tools":[names],
//    "call": {"content", "isError", "structuredContent"} | null,
//    "progress":[{"progress","total","message"}], "logs":[{"level","logger","data"}], "cancelled"}
// Exit 0 on success, 1 with the error on stderr otherwise. Hard overall timeout (default 30 s).
//
// --cancel-after S aborts the call's AbortSignal after S seconds; the SDK then sends
// `notifications/cancelled` {requestId, reason} and rejects the call.

import { parseArgs } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CallToolResultSchema,
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  LoggingMessageNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js';

const CANCEL_FLUSH_MS = 500;

function fail(message) {
  process.stderr.write(`ts_client: error: ${message}\n`);
  process.exit(1);
}

let opts;
try {
  ({ values: opts } = parseArgs({
    options: {
      transport: { type: 'string' },
      url: { type: 'string' },
      token: { type: 'string' },
      call: { type: 'string' },
      args: { type: 'string', default: '{}' },
      progress: { type: 'boolean', default: false },
      'cancel-after': { type: 'string' },
      timeout: { type: 'string', default: '30' },
      batch: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  }));
} catch (e) {
  fail(e.message);
}
if (opts.help) {
  process.stdout.write(
    'usage: ts_client.mjs --transport {sse,streamable,client} --url URL --token TOKEN ' +
      '[--call TOOL --args JSON] [--progress] [--cancel-after SECONDS] [--timeout SECONDS]\n' +
      '       ts_client.mjs --batch JSON   (a list of cells, run one after another; see runCell)\n',
  );
  process.exit(0);
}
const batch = opts.batch !== undefined ? JSON.parse(opts.batch) : undefined;
if (batch !== undefined) {
  opts.transport = 'sse';
  opts.url = 'http://batch.invalid/';
  opts.token = '';
  opts.timeout = String(batch.reduce((t, c) => t + Number(c.timeout ?? 30), 0) + 10);
}
if (!['sse', 'streamable', 'client'].includes(opts.transport)) fail('--transport must be sse, streamable or client');
if (!opts.url) fail('--url is required');
if (opts.token === undefined) fail('--token is required');
const timeoutMs = Number(opts.timeout) * 1000;
if (!(timeoutMs > 0)) fail('--timeout must be a positive number');
const cancelAfterMs = opts['cancel-after'] !== undefined ? Number(opts['cancel-after']) * 1000 : undefined;
if (cancelAfterMs !== undefined && !(cancelAfterMs >= 0)) fail('--cancel-after must be a number of seconds');

const watchdog = setTimeout(() => fail(`hard timeout after ${opts.timeout}s`), timeoutMs);
watchdog.unref();

let headers = { Authorization: `Bearer ${opts.token}` };
let progress = [];
let logs = [];
let negotiatedVersion = null;

function makeClient() {
  const client = new Client(
    { name: 'gatehouse-ts-client', version: '1.0.0' },
    { capabilities: { sampling: {}, elicitation: {} } },
  );
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
    logs.push({ level: n.params.level, logger: n.params.logger ?? null, data: n.params.data });
  });
  client.setRequestHandler(CreateMessageRequestSchema, async () => ({
    role: 'assistant',
    content: { type: 'text', text: 'This is a test response from the client' },
    model: 'gatehouse-test-model',
    stopReason: 'endTurn',
  }));
  client.setRequestHandler(ElicitRequestSchema, async () => ({
    action: 'accept',
    content: { username: 'testuser', email: 'test@example.com' },
  }));
  return client;
}

function makeTransport(kind, url) {
  const transport =
    kind === 'sse'
      ? new SSEClientTransport(url, { requestInit: { headers } })
      : new StreamableHTTPClientTransport(url, { requestInit: { headers } });
  // The Client hands the negotiated version to HTTP transports; record it on the way.
  const original = transport.setProtocolVersion?.bind(transport);
  transport.setProtocolVersion = (version) => {
    negotiatedVersion = version;
    original?.(version);
  };
  return transport;
}

async function connect(transport = opts.transport, rawUrl = opts.url) {
  const url = new URL(rawUrl);
  const requestOptions = { timeout: timeoutMs };
  if (transport !== 'client') {
    const client = makeClient();
    await client.connect(makeTransport(transport, url), requestOptions);
    return { client, used: transport };
  }
  try {
    const client = makeClient();
    await client.connect(makeTransport('streamable', url), requestOptions);
    return { client, used: 'streamable' };
  } catch (e) {
    process.stderr.write(`ts_client: streamable HTTP failed (${e.message}); falling back to SSE\n`);
    const client = makeClient();
    await client.connect(makeTransport('sse', url), requestOptions);
    return { client, used: 'sse' };
  }
}

// SDK quirk (1.32.2): notification handlers, progress included, run in a microtask
// (Protocol._onnotification), but a response is handled synchronously and drops the request's
// progress handler at once. When the last notifications/progress and the response arrive in
// one chunk (often on SSE), that progress is lost ("unknown token"). Deliver responses one
// macrotask later so the notifications that preceded them on the wire are handled first;
// wire order is kept. Set TS_CLIENT_RAW_DISPATCH=1 to see the SDK's own behaviour.
function deferResponses(transport) {
  if (process.env.TS_CLIENT_RAW_DISPATCH) return;
  const inner = transport.onmessage;
  transport.onmessage = (message, extra) => {
    const isResponse = message && 'id' in message && ('result' in message || 'error' in message);
    if (isResponse) setImmediate(() => inner(message, extra));
    else inner(message, extra);
  };
}

// One tools/call: {call: result | null, cancelled}. Progress goes to the global `progress`.
async function callTool(client, name, callArgs, wantProgress, cancelAfter) {
  const out = { call: null, cancelled: false };
  const controller = new AbortController();
  const requestOptions = { timeout: timeoutMs, signal: controller.signal };
  if (wantProgress) {
    requestOptions.onprogress = (p) => {
      progress.push({ progress: p.progress, total: p.total ?? null, message: p.message ?? null });
    };
    requestOptions.resetTimeoutOnProgress = true;
  }
  let cancelTimer;
  if (cancelAfter !== undefined) {
    cancelTimer = setTimeout(() => controller.abort('cancelled by ts_client --cancel-after'), cancelAfter);
  }
  try {
    const result = await client.callTool({ name: name, arguments: callArgs }, CallToolResultSchema, requestOptions);
    out.call = {
      content: result.content ?? [],
      isError: result.isError === true,
      structuredContent: result.structuredContent ?? null,
    };
  } catch (e) {
    if (!controller.signal.aborted) throw e;
    out.cancelled = true;
    await new Promise((r) => setTimeout(r, CANCEL_FLUSH_MS));
  } finally {
    clearTimeout(cancelTimer);
  }
  await new Promise((r) => setTimeout(r, 50)); // let trailing notifications arrive
  return out;
}

async function openSession(transport, url) {
  const { client, used } = await connect(transport, url);
  if (process.env.TS_CLIENT_DEBUG) client.onerror = (e) => process.stderr.write(`ts_client: sdk: ${e}\n`);
  deferResponses(client.transport);
  const out = { transport };
  if (transport === 'client') out.used_transport = used;
  out.protocol_version = negotiatedVersion;
  out.server_name = client.getServerVersion()?.name ?? null;

  const tools = [];
  let cursor;
  for (let page = 0; page < 100; page++) {
    const res = await client.listTools(cursor ? { cursor } : undefined, { timeout: timeoutMs });
    tools.push(...res.tools.map((t) => t.name));
    cursor = res.nextCursor;
    if (!cursor) break;
  }
  out.tools = tools;
  return { client, out };
}

async function main() {
  const { client, out } = await openSession(opts.transport, opts.url);
  out.call = null;
  out.cancelled = false;

  if (opts.call) {
    let callArgs;
    try {
      callArgs = JSON.parse(opts.args);
    } catch (e) {
      throw new Error(`--args is not valid JSON: ${e.message}`);
    }
    if (callArgs === null || typeof callArgs !== 'object' || Array.isArray(callArgs)) {
      throw new Error('--args must be a JSON object');
    }
    Object.assign(out, await callTool(client, opts.call, callArgs, opts.progress, cancelAfterMs));
  }
  out.progress = progress;
  out.logs = logs;
  try {
    await client.close();
  } catch {
    // closing is best effort; the result is already known
  }
  return out;
}

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms / 1000}s`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// --batch: one connection per cell, then each step of `cell.steps` in order
// ({name, tool, args, progress?, cancel_after?, timeout?}); each step's outcome is recorded
// separately ({ok} or {error}) and a failed step does not stop the next.
async function runCell(cell) {
  headers = { Authorization: `Bearer ${cell.token}` };
  progress = [];
  logs = [];
  negotiatedVersion = null;
  const { client, out } = await openSession(cell.transport, cell.url);
  out.steps = {};
  for (const step of cell.steps ?? []) {
    progress = [];
    try {
      const cancelAfter = step.cancel_after !== undefined ? step.cancel_after * 1000 : undefined;
      const r = await withTimeout(
        callTool(client, step.tool, step.args ?? {}, Boolean(step.progress), cancelAfter),
        (step.timeout ?? 20) * 1000,
        step.name,
      );
      r.progress = progress;
      out.steps[step.name] = { ok: r };
    } catch (e) {
      out.steps[step.name] = { error: `${e?.name ?? 'Error'}: ${e?.message ?? e}` };
    }
  }
  out.logs = logs;
  try {
    await client.close();
  } catch {
    // best effort
  }
  return out;
}

async function runBatch(cells) {
  const results = [];
  for (const cell of cells) {
    try {
      results.push({ ok: await withTimeout(runCell(cell), (cell.timeout ?? 30) * 1000, 'cell') });
    } catch (e) {
      results.push({ error: `${e?.name ?? 'Error'}: ${e?.message ?? e}` });
    }
  }
  return results;
}

(batch !== undefined ? runBatch(batch) : main()).then(
  (out) => {
    process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
  },
  (e) => fail(e?.stack && process.env.TS_CLIENT_DEBUG ? e.stack : `${e?.name ?? 'Error'}: ${e?.message ?? e}`),
);
