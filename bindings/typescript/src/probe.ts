/**
 * The probe (issue 48): the MCP round trip with the registration's own token (`initialize`,
 * `notifications/initialized`, `tools/list` on Streamable HTTP, then the session closed), then
 * the daemon's half (`POST /v1/registrations/<id>/probe`: the grant, each upstream pinged); all
 * within one deadline. The result has the JSON shape of Rust's `Registration::probe`, the CLI's
 * `gatehouse probe --json` and Python's `probe()`.
 */

/** Why a probe failed. */
export type ProbeReason =
  | "refused"
  | "released"
  | "fenced"
  | "upstream_down"
  | "timeout"
  | "unreachable"
  | "protocol";

export interface ProbeFailure {
  reason: ProbeReason;
  status: number | null;
  message: string;
}

/** The tools the registration listed, against its grant. */
export interface ToolsSeen {
  equal: boolean;
  granted: string[];
  listed: string[];
  /** Granted but not listed. */
  missing: string[];
  /** Listed but not granted. */
  unexpected: string[];
}

export interface UpstreamSeen {
  id: string;
  answered: boolean;
  latency_ms: number;
  error: string | null;
}

/** What a probe saw (the same JSON in every API). */
export interface ProbeResult {
  id: string;
  /** Reachable, tools listed, every upstream answered. */
  ok: boolean;
  /** The MCP round trip completed. */
  reachable: boolean;
  /** The round trip's time (initialize → tools/list answered), ms. */
  latency_ms: number | null;
  protocol_version: string | null;
  tools: ToolsSeen;
  upstreams: UpstreamSeen[];
  /** The ids of the upstreams that did not answer. */
  upstreams_down: string[];
  failure: ProbeFailure | null;
  /** The whole probe's time, ms. */
  elapsed_ms: number;
}

/** The daemon's half: `POST /v1/registrations/<id>/probe`. */
export interface UpstreamsSeen {
  id: string;
  mcp_url: string | null;
  tools: string[];
  upstreams: UpstreamSeen[];
}

export const PROTOCOL_VERSION = "2025-11-25";
export const DEFAULT_PROBE_TIMEOUT_MS = 5000;
const MAX_ANSWER = 4 << 20;

/** A failure as thrown inside the probe. */
export class Failed extends Error {
  constructor(readonly failure: ProbeFailure) {
    super(failure.message);
  }
}

export function failureOfStatus(status: number, message: string): ProbeFailure {
  const reason: ProbeReason =
    status === 401 || status === 403
      ? "refused"
      : status === 404
        ? "released"
        : status === 503
          ? "fenced"
          : "protocol";
  return { reason, status, message };
}

const ms = (t: number) => Math.round(t * 1000) / 1000;

function emptyTools(): ToolsSeen {
  return { equal: false, granted: [], listed: [], missing: [], unexpected: [] };
}

export function compareTools(granted: string[], listed: string[]): ToolsSeen {
  const missing = granted.filter((g) => !listed.includes(g));
  const unexpected = listed.filter((l) => !granted.includes(l));
  return { equal: missing.length === 0 && unexpected.length === 0, granted, listed, missing, unexpected };
}

export function failedProbe(id: string, failure: ProbeFailure): ProbeResult {
  return {
    id,
    ok: false,
    reachable: false,
    latency_ms: null,
    protocol_version: null,
    tools: emptyTools(),
    upstreams: [],
    upstreams_down: [],
    failure,
    elapsed_ms: 0,
  };
}

interface Post {
  headers: Headers;
  answer: Record<string, unknown> | null;
}

async function post(
  url: string,
  token: string,
  body: Record<string, unknown>,
  signal: AbortSignal,
  session?: string | null,
  version?: string | null,
): Promise<Post> {
  const headers: Record<string, string> = {
    authorization: `Bearer ${token}`,
    accept: "application/json, text/event-stream",
    "content-type": "application/json",
  };
  if (session) headers["mcp-session-id"] = session;
  if (version) headers["mcp-protocol-version"] = version;
  let resp: Response;
  try {
    resp = await fetch(url, { method: "POST", headers, body: JSON.stringify(body), signal });
  } catch (e) {
    if (signal.aborted) throw new Failed({ reason: "timeout", status: null, message: "no answer within the deadline" });
    const cause = (e as { cause?: { code?: string; message?: string } }).cause;
    throw new Failed({
      reason: "unreachable",
      status: null,
      message: `cannot reach the gateway: ${cause?.code ?? cause?.message ?? String(e)}`,
    });
  }
  let text: string;
  try {
    text = await readBounded(resp);
  } catch (e) {
    if (e instanceof Failed) throw e;
    if (signal.aborted) throw new Failed({ reason: "timeout", status: null, message: "no answer within the deadline" });
    throw new Failed({ reason: "protocol", status: null, message: `the answer was cut: ${String(e)}` });
  }
  if (resp.status < 200 || resp.status >= 300) {
    let message = `HTTP ${resp.status}`;
    try {
      const v = JSON.parse(text) as { error?: unknown };
      if (v && typeof v.error === "object" && v.error && typeof (v.error as { message?: unknown }).message === "string") {
        message = (v.error as { message: string }).message;
      } else if (typeof v.error === "string") {
        message = v.error;
      }
    } catch {
      /* not JSON: the status says it */
    }
    throw new Failed(failureOfStatus(resp.status, message));
  }
  if (!("id" in body)) return { headers: resp.headers, answer: null };
  let answer: unknown = null;
  if ((resp.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
    for (const line of text.split(/\r?\n/)) {
      if (!line.startsWith("data:")) continue;
      try {
        const m = JSON.parse(line.slice(5).trim()) as { id?: unknown };
        if (m && m.id === body.id) {
          answer = m;
          break;
        }
      } catch {
        /* another event */
      }
    }
  } else {
    try {
      answer = JSON.parse(text);
    } catch {
      answer = null;
    }
  }
  if (!answer || typeof answer !== "object") {
    throw new Failed({ reason: "protocol", status: null, message: "the gateway's answer is not JSON-RPC" });
  }
  return { headers: resp.headers, answer: answer as Record<string, unknown> };
}

async function readBounded(resp: Response): Promise<string> {
  if (!resp.body) return "";
  const reader = resp.body.getReader();
  const chunks: Uint8Array[] = [];
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    n += value.byteLength;
    if (n > MAX_ANSWER) {
      await reader.cancel();
      throw new Failed({ reason: "protocol", status: null, message: "the gateway's answer is too large" });
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString("utf8");
}

function resultOf(answer: Record<string, unknown> | null, method: string): Record<string, unknown> {
  if (!answer) throw new Failed({ reason: "protocol", status: null, message: `${method}: no answer` });
  if ("error" in answer) {
    const m = (answer.error as { message?: string } | null)?.message ?? "";
    throw new Failed({ reason: "protocol", status: null, message: `${method} answered an error: ${m}` });
  }
  const r = answer.result;
  if (!r || typeof r !== "object") {
    throw new Failed({ reason: "protocol", status: null, message: `${method}: an answer without a result` });
  }
  return r as Record<string, unknown>;
}

/** initialize → notifications/initialized → tools/list, then the session closed. */
export async function roundTrip(
  mcpUrl: string,
  token: string,
  signal: AbortSignal,
): Promise<{ listed: string[]; version: string | null; latency: number }> {
  const began = performance.now();
  const init = {
    jsonrpc: "2.0",
    id: 1,
    method: "initialize",
    params: {
      protocolVersion: PROTOCOL_VERSION,
      capabilities: {},
      clientInfo: { name: "gatehouse-probe-ts", version: "0.1.0" },
    },
  };
  const first = await post(mcpUrl, token, init, signal);
  const version = (resultOf(first.answer, "initialize").protocolVersion as string | undefined) ?? null;
  const session = first.headers.get("mcp-session-id");
  await post(mcpUrl, token, { jsonrpc: "2.0", method: "notifications/initialized" }, signal, session, version);
  const list = await post(mcpUrl, token, { jsonrpc: "2.0", id: 2, method: "tools/list", params: {} }, signal, session, version);
  const tools = resultOf(list.answer, "tools/list").tools;
  const latency = performance.now() - began;
  if (!Array.isArray(tools)) {
    throw new Failed({ reason: "protocol", status: null, message: "tools/list answered without a tools array" });
  }
  const listed = tools
    .map((t) => (t && typeof t === "object" ? (t as { name?: unknown }).name : undefined))
    .filter((n): n is string => typeof n === "string");
  if (session) {
    // Best effort: an unclosed session ends with the registration anyway.
    try {
      const r = await fetch(mcpUrl, {
        method: "DELETE",
        headers: { authorization: `Bearer ${token}`, "mcp-session-id": session, "mcp-protocol-version": version ?? PROTOCOL_VERSION },
        signal,
      });
      await r.body?.cancel();
    } catch {
      /* closed with the registration */
    }
  }
  return { listed, version, latency };
}

/**
 * A probe: the round trip, then `daemon(msLeft)` (the daemon's half: `null` for a 404; throws
 * {@link Failed}); all within `timeoutMs`.
 */
export async function runProbe(
  id: string,
  mcpUrl: string,
  token: string,
  timeoutMs: number,
  daemon: (msLeft: number, signal: AbortSignal) => Promise<UpstreamsSeen | null>,
): Promise<ProbeResult> {
  const began = performance.now();
  const signal = AbortSignal.timeout(Math.max(1, Math.ceil(timeoutMs)));
  const p: ProbeResult = failedProbe(id, { reason: "protocol", status: null, message: "" });
  const finish = (failure: ProbeFailure | null): ProbeResult => {
    p.ok = failure === null;
    p.failure = failure;
    p.elapsed_ms = ms(performance.now() - began);
    return p;
  };
  const asFailure = (e: unknown): ProbeFailure =>
    e instanceof Failed
      ? e.failure
      : signal.aborted
        ? { reason: "timeout", status: null, message: `no answer within ${timeoutMs} ms` }
        : { reason: "protocol", status: null, message: String(e) };
  let seen;
  try {
    seen = await roundTrip(mcpUrl, token, signal);
  } catch (e) {
    return finish(asFailure(e));
  }
  p.reachable = true;
  p.latency_ms = ms(seen.latency);
  p.protocol_version = seen.version;
  const left = timeoutMs - (performance.now() - began);
  if (left <= 0) return finish({ reason: "timeout", status: null, message: `no answer within ${timeoutMs} ms` });
  let d: UpstreamsSeen | null;
  try {
    d = await daemon(left, signal);
  } catch (e) {
    p.tools = compareTools([], seen.listed);
    return finish(asFailure(e));
  }
  if (d === null) {
    p.tools = compareTools([], seen.listed);
    return finish({ reason: "released", status: 404, message: "released while it was probed" });
  }
  p.tools = compareTools(d.tools ?? [], seen.listed);
  p.upstreams = d.upstreams ?? [];
  const down = p.upstreams.filter((u) => !u.answered);
  p.upstreams_down = down.map((u) => u.id);
  if (down.length > 0) {
    const named = down.map((u) => `${u.id} (${u.error ?? "no answer"})`).join(", ");
    return finish({ reason: "upstream_down", status: null, message: `did not answer: ${named}` });
  }
  return finish(null);
}
