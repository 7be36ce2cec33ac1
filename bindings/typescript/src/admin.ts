/**
 * `AdminClient`: the gatehouse daemon's admin API (DESIGN.md §4) over Node's `fetch`.
 */

import {
  AdminUnreachableError,
  ProbeError,
  adminError,
} from "./errors.js";
import {
  DEFAULT_PROBE_TIMEOUT_MS,
  Failed,
  failedProbe,
  failureOfStatus,
  runProbe,
  type ProbeResult,
  type UpstreamsSeen,
} from "./probe.js";
import { Execution } from "./execution.js";

export interface AdminClientOptions {
  /** The admin API's base URL. Default: `GATEHOUSE_ADMIN_URL`. */
  url?: string;
  /** The admin token. Default: `GATEHOUSE_ADMIN_TOKEN`. */
  token?: string;
  /** Each admin request's timeout, ms (default 30 000). */
  timeoutMs?: number;
}

/** A filesystem root the registration's upstreams see (`roots/list`). */
export interface Root {
  uri: string;
  name?: string;
}

/** What `register` and `child` take (the admin API's body, camel-cased). */
export interface RegistrationSpec {
  /** Who acts; copied into every audit record. */
  agentId: string;
  /** Grants: `upstream.tool`, `upstream.*`, or in-process tool names. */
  tools: string[];
  label?: string;
  /** Lease length; the registration expires unless renewed (the Execution renews it). */
  ttlSeconds?: number;
  /** Limits (`max_calls`, `max_in_flight`, …), as the admin API takes them. */
  limits?: Record<string, unknown>;
  roots?: Root[];
  /** Make a child (a sub-agent) of this live registration. */
  parent?: string;
  /** Its policy rules (`[{id, when, effect, reason?, approver?, timeout_s?}]`, docs/policy.md). */
  policy?: Record<string, unknown>[];
}

export interface RegisterOptions {
  /** Renew the lease in the background (every third of `ttlSeconds`). Default true. */
  renew?: boolean;
}

/** The 201 of `POST /v1/registrations` (the only answer that carries a token). */
export interface Created {
  id: string;
  token: string;
  agent_id: string;
  label: string | null;
  tools: string[];
  sse_url: string;
  mcp_url: string;
  expires_at: string | null;
}

/** One registration as `GET /v1/registrations[/<id>]` shows it (never a token). */
export interface RegistrationInfo {
  id: string;
  agent_id: string;
  label: string | null;
  tools: string[];
  pins_digest: unknown;
  created_at: string;
  ttl_s: number | null;
  roots: Root[] | null;
  expires_at: string | null;
  sessions: number;
  calls_started: number;
  calls_in_flight: number;
  parent: string | null;
  children: string[];
  agent_path: unknown;
  [more: string]: unknown;
}

export interface Renewed {
  id: string;
  expires_at: string | null;
}

/** `GET /v1/audit` filters (DESIGN.md §6). */
export interface AuditQuery {
  agent_id?: string;
  tool?: string;
  registration_id?: string;
  event?: string;
  trace_id?: string;
  outcome?: string;
  limit?: number;
  max_bytes?: number;
}

export interface AuditPage {
  records: Record<string, unknown>[];
  verify: unknown;
  limit: number;
  max_bytes: number;
}

/** A call held for approval (`GET /v1/approvals`). */
export interface PendingApproval {
  id: string;
  registration_id: string;
  agent_id: string;
  agent_path?: string[];
  label?: string;
  tool: string;
  upstream?: string;
  rule: string;
  approver: "harness" | "client";
  /** With the daemon's `redact_keys` applied. */
  arguments: Record<string, unknown>;
  args_digest: string;
  definition_digest: string;
  requested_at: string;
  expires_at: string;
}

export interface ProbeOptions {
  /** The deadline of the whole probe, ms (default 5000). */
  timeoutMs?: number;
  /** Where the registration is served; default: where the daemon says it is. */
  mcpUrl?: string;
  /** Resolve with the failed result instead of throwing {@link ProbeError}. */
  noThrow?: boolean;
}

function env(name: string): string | undefined {
  const v = process.env[name];
  return v && v.trim() ? v.trim() : undefined;
}

function retryAfter(h: Headers): number | null {
  const v = h.get("retry-after");
  const n = v === null ? NaN : Number(v);
  return Number.isFinite(n) ? n : null;
}

export class AdminClient {
  readonly url: string;
  readonly #token: string;
  readonly timeoutMs: number;

  constructor(options: AdminClientOptions = {}) {
    const url = options.url ?? env("GATEHOUSE_ADMIN_URL");
    const token = options.token ?? env("GATEHOUSE_ADMIN_TOKEN");
    if (!url) throw new TypeError("AdminClient: no admin URL (pass {url} or set GATEHOUSE_ADMIN_URL)");
    if (!token) {
      throw new TypeError("AdminClient: no admin token (pass {token} or set GATEHOUSE_ADMIN_TOKEN)");
    }
    this.url = url.replace(/\/+$/, "");
    this.#token = token;
    this.timeoutMs = options.timeoutMs ?? 30_000;
  }

  /** One admin request: the status, the parsed body (null when empty) and the headers. */
  async request(
    method: string,
    path: string,
    body?: unknown,
    timeoutMs = this.timeoutMs,
  ): Promise<{ status: number; body: unknown; headers: Headers }> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.#token}` };
    if (body !== undefined) headers["content-type"] = "application/json";
    let resp: Response;
    try {
      resp = await fetch(this.url + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(Math.max(1, Math.ceil(timeoutMs))),
      });
    } catch (e) {
      const cause = (e as { cause?: { code?: string } }).cause;
      throw new AdminUnreachableError(
        `cannot reach the admin API at ${this.url} (${cause?.code ?? (e as Error).message}): is \`gatehouse serve\` running?`,
        { cause: e },
      );
    }
    const text = await resp.text();
    let parsed: unknown = null;
    if (text.trim()) {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = null;
      }
    }
    return { status: resp.status, body: parsed, headers: resp.headers };
  }

  async #expect(what: string, method: string, path: string, ok: number, body?: unknown): Promise<unknown> {
    const r = await this.request(method, path, body);
    if (r.status !== ok) throw adminError(what, r.status, r.body, retryAfter(r.headers));
    return r.body;
  }

  /** `POST /v1/registrations`: an {@link Execution} (renewed in the background, released on dispose). */
  async register(spec: RegistrationSpec, options: RegisterOptions = {}): Promise<Execution> {
    const body: Record<string, unknown> = { agent_id: spec.agentId, tools: spec.tools };
    if (spec.label !== undefined) body.label = spec.label;
    if (spec.ttlSeconds !== undefined) body.ttl_s = spec.ttlSeconds;
    if (spec.limits !== undefined) body.limits = spec.limits;
    if (spec.roots !== undefined) body.roots = spec.roots;
    if (spec.parent !== undefined) body.parent = spec.parent;
    if (spec.policy !== undefined) body.policy = spec.policy;
    const created = (await this.#expect("register", "POST", "/v1/registrations", 201, body)) as Created;
    return new Execution(this, created, spec.ttlSeconds ?? null, options.renew ?? true);
  }

  /** A child registration (a sub-agent) of live registration `parentId`. */
  child(parentId: string, spec: Omit<RegistrationSpec, "parent">, options?: RegisterOptions): Promise<Execution> {
    return this.register({ ...spec, parent: parentId }, options);
  }

  /** `GET /v1/registrations/<id>` (never the token). */
  async get(id: string): Promise<RegistrationInfo> {
    return (await this.#expect(`get ${id}`, "GET", `/v1/registrations/${encodeURIComponent(id)}`, 200)) as RegistrationInfo;
  }

  /** `GET /v1/registrations` (never tokens). */
  async list(): Promise<RegistrationInfo[]> {
    return (await this.#expect("list", "GET", "/v1/registrations", 200)) as RegistrationInfo[];
  }

  /** `POST /v1/registrations/<id>/renew`: a new lease of `ttlSeconds` (default: its own). */
  async renew(id: string, ttlSeconds?: number): Promise<Renewed> {
    const body = ttlSeconds === undefined ? undefined : { ttl_s: ttlSeconds };
    return (await this.#expect(`renew ${id}`, "POST", `/v1/registrations/${encodeURIComponent(id)}/renew`, 200, body)) as Renewed;
  }

  /** `DELETE /v1/registrations/<id>`: cancel its calls, then release. False if it was gone (404). */
  async release(id: string): Promise<boolean> {
    const r = await this.request("DELETE", `/v1/registrations/${encodeURIComponent(id)}`);
    if (r.status === 204 || r.status === 200) return true;
    if (r.status === 404) return false;
    throw adminError(`release ${id}`, r.status, r.body, retryAfter(r.headers));
  }

  /**
   * `PUT /v1/registrations/<id>/credentials`: replaces the registration's own credentials for
   * remote MCP servers (issue 47): `{"<upstream>": {bearer: "…"} | {headers: {…}}}`, for HTTP
   * upstreams its grant names. Same URL and token; calls in flight finish, the next upstream
   * request uses the new ones. Answers `{id, upstream_credentials: {"<upstream>": "set"}}`.
   */
  async rotateCredentials(id: string, credentials: Record<string, unknown>): Promise<unknown> {
    return this.#expect(`rotate credentials of ${id}`, "PUT", `/v1/registrations/${encodeURIComponent(id)}/credentials`, 200, credentials);
  }

  /** `GET /v1/audit?…`: the newest audit records matching `query`, and the chain's check. */
  async audit(query: AuditQuery = {}): Promise<AuditPage> {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined) q.set(k, String(v));
    const qs = q.toString();
    return (await this.#expect("audit", "GET", `/v1/audit${qs ? `?${qs}` : ""}`, 200)) as AuditPage;
  }

  /**
   * `GET /v1/approvals` (issue 49): the calls an `approve` rule holds, oldest first. With
   * `waitSeconds` (at most 60) the daemon answers once one is held, or when the wait ends.
   */
  async approvals(waitSeconds?: number): Promise<PendingApproval[]> {
    const qs = waitSeconds === undefined ? "" : `?wait=${Number(waitSeconds)}`;
    const timeout = waitSeconds === undefined ? this.timeoutMs : Math.max(this.timeoutMs, (Number(waitSeconds) + 10) * 1000);
    const r = await this.request("GET", `/v1/approvals${qs}`, undefined, timeout);
    if (r.status !== 200) throw adminError("approvals", r.status, r.body, retryAfter(r.headers));
    return ((r.body as { approvals?: PendingApproval[] }).approvals ?? []) as PendingApproval[];
  }

  /** `POST /v1/approvals/<id>` `{decision: "approve"}`: the held call runs, once, as held. */
  async approve(id: string, reason?: string): Promise<unknown> {
    return this.#decide(id, "approve", reason);
  }

  /** `POST /v1/approvals/<id>` `{decision: "deny"}`: the call gets a tool error with `reason`. */
  async deny(id: string, reason?: string): Promise<unknown> {
    return this.#decide(id, "deny", reason);
  }

  async #decide(id: string, decision: "approve" | "deny", reason?: string): Promise<unknown> {
    const body: Record<string, unknown> = { decision, by: "harness" };
    if (reason !== undefined) body.reason = reason;
    return this.#expect(`${decision} ${id}`, "POST", `/v1/approvals/${encodeURIComponent(id)}`, 200, body);
  }

  /** `GET /v1/upstreams`. */
  async upstreams(): Promise<Record<string, unknown>[]> {
    return (await this.#expect("upstreams", "GET", "/v1/upstreams", 200)) as Record<string, unknown>[];
  }

  /**
   * Probes registration `id` as its agent would reach it: the MCP round trip with its `token`
   * (the daemon keeps only a digest), its tools against its grant, each upstream pinged; all
   * within `timeoutMs`. Throws {@link ProbeError} with the reason when it failed.
   */
  async probe(id: string, token: string, options: ProbeOptions = {}): Promise<ProbeResult> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS;
    const path = `/v1/registrations/${encodeURIComponent(id)}/probe`;
    const daemon = async (left: number): Promise<UpstreamsSeen | null> => {
      let r;
      try {
        // A fifth kept for the answer: a hanging upstream is named, not a timeout.
        r = await this.request("POST", path, { timeout_ms: Math.max(1, Math.floor(left * 0.8)) }, Math.max(1, left));
      } catch (e) {
        throw new Failed({ reason: "unreachable", status: null, message: (e as Error).message });
      }
      if (r.status === 404) return null;
      if (r.status !== 200) {
        const err = (r.body as { error?: string } | null)?.error ?? `HTTP ${r.status}`;
        throw new Failed(failureOfStatus(r.status, `admin API: ${err}`));
      }
      return r.body as UpstreamsSeen;
    };
    let result: ProbeResult;
    let url = options.mcpUrl;
    if (url === undefined) {
      try {
        const seen = await daemon(timeoutMs);
        url = seen?.mcp_url ?? undefined;
        if (!url) result = failedProbe(id, failureOfStatus(404, "no such registration"));
      } catch (e) {
        result = failedProbe(id, (e as Failed).failure);
      }
    }
    result ??= await runProbe(id, url as string, token, timeoutMs, daemon);
    if (!result.ok && !options.noThrow) throw new ProbeError(result);
    return result;
  }
}
