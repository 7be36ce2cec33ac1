#!/usr/bin/env node
// MCP tasks (2025-11-25) through the official TypeScript SDK 1.x client
// (@modelcontextprotocol/sdk, experimental tasks), driven by gatehouse's tests/tasks.rs.
//
//   node ts_tasks_client.mjs --batch JSON
//
// Each cell {"transport": "sse"|"streamable", "url", "token", "tool", "args", "probe"?: [ids]}
// connects, lists tools, runs client.experimental.tasks.callToolStream with a task (the
// messages' types and statuses seen, the task id, the result), then listTasks, getTask of its
// task, and getTask of each id in "probe" (the error each gets). Prints a JSON list, one
// {"ok": {...}} or {"error": "..."} per cell. Hard timeout per cell ("timeout", 60 s).

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

async function runCell(cell) {
  const headers = { Authorization: `Bearer ${cell.token}` };
  const url = new URL(cell.url);
  const transport =
    cell.transport === 'sse'
      ? new SSEClientTransport(url, { requestInit: { headers } })
      : new StreamableHTTPClientTransport(url, { requestInit: { headers } });
  const client = new Client({ name: 'gatehouse-ts-tasks', version: '1.0.0' }, { capabilities: {} });
  await client.connect(transport);
  try {
    const out = { protocol_version: transport.protocolVersion ?? null };
    const tools = (await client.listTools()).tools;
    out.task_support = tools.find((t) => t.name === cell.tool)?.execution?.taskSupport ?? null;
    const seen = [];
    let taskId = null;
    let result = null;
    let error = null;
    const stream = client.experimental.tasks.callToolStream(
      { name: cell.tool, arguments: cell.args ?? {} },
      undefined,
      { task: { ttl: 60000 } },
    );
    for await (const m of stream) {
      if (m.type === 'taskCreated') {
        taskId = m.task.taskId;
        seen.push('taskCreated');
      } else if (m.type === 'taskStatus') {
        if (seen[seen.length - 1] !== m.task.status) seen.push(m.task.status);
      } else if (m.type === 'result') {
        result = m.result;
        seen.push('result');
      } else if (m.type === 'error') {
        error = String(m.error?.message ?? m.error);
        seen.push('error');
      }
    }
    out.seen = seen;
    out.task_id = taskId;
    out.result = result;
    out.error = error;
    out.listed = (await client.experimental.tasks.listTasks()).tasks.map((t) => t.taskId);
    out.final = taskId ? await client.experimental.tasks.getTask(taskId) : null;
    out.probes = {};
    for (const id of cell.probe ?? []) {
      try {
        await client.experimental.tasks.getTask(id);
        out.probes[id] = 'answered';
      } catch (e) {
        out.probes[id] = { code: e.code ?? null, message: String(e.message) };
      }
    }
    return out;
  } finally {
    await client.close();
  }
}

async function main() {
  const i = process.argv.indexOf('--batch');
  if (i < 0 || !process.argv[i + 1]) {
    process.stderr.write('usage: ts_tasks_client.mjs --batch JSON\n');
    process.exit(2);
  }
  const cells = JSON.parse(process.argv[i + 1]);
  const results = [];
  for (const cell of cells) {
    const ms = Number(cell.timeout ?? 60) * 1000;
    let timer;
    try {
      const ok = await Promise.race([
        runCell(cell),
        new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error(`cell timed out after ${ms} ms`)), ms);
        }),
      ]);
      results.push({ ok });
    } catch (e) {
      results.push({ error: String(e?.stack ?? e) });
    } finally {
      clearTimeout(timer);
    }
  }
  process.stdout.write(JSON.stringify(results) + '\n');
  process.exit(0);
}

main();
