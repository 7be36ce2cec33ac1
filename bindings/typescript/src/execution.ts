/**
 * `Execution`: one agent run's registration. Hand `mcpUrl` (or `sseUrl`) and `token` to the
 * agent's MCP client. It renews its lease in the background while held and releases on
 * dispose: `await using run = await admin.register(…)`, or `try { … } finally { await run.close() }`.
 */

import type { AdminClient, Created, ProbeOptions, RegisterOptions, RegistrationSpec, Renewed } from "./admin.js";
import { GatehouseError, NotFoundError } from "./errors.js";
import type { ProbeResult } from "./probe.js";

export class Execution {
  readonly id: string;
  /** The bearer token of this registration: shown once by the daemon, never logged. */
  readonly token: string;
  readonly agentId: string;
  readonly label: string | null;
  readonly tools: string[];
  /** Streamable HTTP endpoint. */
  readonly mcpUrl: string;
  /** Legacy HTTP+SSE endpoint. */
  readonly sseUrl: string;
  expiresAt: string | null;
  readonly ttlSeconds: number | null;
  /** Background renewals that succeeded. */
  renewals = 0;
  /** The last background renewal's error, if any. */
  renewError: Error | null = null;
  readonly #admin: AdminClient;
  #timer: NodeJS.Timeout | null = null;
  #released: Promise<boolean> | null = null;

  constructor(admin: AdminClient, created: Created, ttlSeconds: number | null, renew: boolean) {
    this.#admin = admin;
    this.id = created.id;
    this.token = created.token;
    this.agentId = created.agent_id;
    this.label = created.label ?? null;
    this.tools = created.tools ?? [];
    this.mcpUrl = created.mcp_url;
    this.sseUrl = created.sse_url;
    this.expiresAt = created.expires_at ?? null;
    this.ttlSeconds = ttlSeconds;
    if (renew && ttlSeconds) {
      const every = Math.max((ttlSeconds * 1000) / 3, 200);
      this.#timer = setInterval(() => void this.#renewInBackground(), every);
      // The lease never keeps the process alive on its own.
      this.#timer.unref();
    }
  }

  async #renewInBackground(): Promise<void> {
    try {
      await this.renew();
      this.renewals += 1;
      this.renewError = null;
    } catch (e) {
      this.renewError = e as Error;
      // Gone (released elsewhere, expired): nothing left to renew.
      if (e instanceof NotFoundError) this.#stopRenewing();
    }
  }

  #stopRenewing(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
  }

  /** Whether `release()` (or dispose) was called. */
  get released(): boolean {
    return this.#released !== null;
  }

  /** Extends the lease by `ttlSeconds` (default: its own). */
  async renew(ttlSeconds?: number): Promise<Renewed> {
    const r = await this.#admin.renew(this.id, ttlSeconds);
    this.expiresAt = r.expires_at;
    return r;
  }

  /** A child registration (a sub-agent) of this one: its tools a subset of these. */
  child(spec: Omit<RegistrationSpec, "parent">, options?: RegisterOptions): Promise<Execution> {
    if (this.released) return Promise.reject(new GatehouseError(`execution ${this.id} was released`));
    return this.#admin.child(this.id, spec, options);
  }

  /**
   * The probe: the MCP round trip with this execution's token, its tools against its grant,
   * its upstreams pinged, within `timeoutMs` (default 5000). Throws `ProbeError` with the
   * reason (refused, released, fenced, upstream_down, timeout) unless `noThrow`.
   */
  probe(options: Omit<ProbeOptions, "mcpUrl"> = {}): Promise<ProbeResult> {
    return this.#admin.probe(this.id, this.token, { ...options, mcpUrl: this.mcpUrl });
  }

  /** Stops renewing and releases (idempotent; false if the daemon had it gone already). */
  release(): Promise<boolean> {
    this.#stopRenewing();
    this.#released ??= this.#admin.release(this.id);
    return this.#released;
  }

  /** `release()`, for `try { … } finally { await execution.close() }`. */
  async close(): Promise<void> {
    await this.release();
  }

  /** `await using execution = await admin.register(…)`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  toJSON(): Record<string, unknown> {
    // Never the token.
    return { id: this.id, agentId: this.agentId, label: this.label, tools: this.tools, mcpUrl: this.mcpUrl, sseUrl: this.sseUrl, expiresAt: this.expiresAt };
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Execution { id: ${this.id}, agentId: ${JSON.stringify(this.agentId)}, mcpUrl: ${this.mcpUrl} }`;
  }
}
