/**
 * Typed errors. The admin API answers a refusal with an HTTP status and `{"error": "…"}`
 * (src/admin.rs); {@link AdminApiError} carries both, and its subclasses name the statuses a
 * harness handles differently.
 */

import type { ProbeResult, ProbeReason } from "./probe.js";

/** The base class of every error this package throws. */
export class GatehouseError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The admin API cannot be reached (connection refused, DNS, TLS, timeout). */
export class AdminUnreachableError extends GatehouseError {}

/** The admin API refused a request: `status` and its `{"error": …}` body. */
export class AdminApiError extends GatehouseError {
  readonly status: number;
  /** The body's `error` message (or `HTTP <status>`). */
  readonly error: string;
  /** The parsed JSON body, or null. */
  readonly body: unknown;
  /** `Retry-After` in seconds, when the answer had one (503). */
  readonly retryAfter: number | null;

  constructor(what: string, status: number, body: unknown, retryAfter: number | null = null) {
    const error =
      body && typeof body === "object" && typeof (body as { error?: unknown }).error === "string"
        ? (body as { error: string }).error
        : `HTTP ${status}`;
    super(`${what}: ${error} (HTTP ${status})`);
    this.status = status;
    this.error = error;
    this.body = body;
    this.retryAfter = retryAfter;
  }
}

/** 400: the request is invalid (the message names the field at fault). */
export class InvalidRequestError extends AdminApiError {}
/** 401: the admin token was refused. */
export class AdminAuthError extends AdminApiError {}
/** 404: no such registration (released, expired, or never made), or no such route. */
export class NotFoundError extends AdminApiError {}
/** 503: nothing was stored or changed (store down, shutting down); retry. */
export class UnavailableError extends AdminApiError {}

/** The error class of an admin API status. */
export function adminError(
  what: string,
  status: number,
  body: unknown,
  retryAfter: number | null = null,
): AdminApiError {
  const cls =
    status === 400
      ? InvalidRequestError
      : status === 401
        ? AdminAuthError
        : status === 404
          ? NotFoundError
          : status === 503
            ? UnavailableError
            : AdminApiError;
  return new cls(what, status, body, retryAfter);
}

/**
 * A probe failed: `reason` is `refused` (401), `released` (404), `fenced` (503),
 * `upstream_down` (`probe.upstreams_down` names them), `timeout`, `unreachable` or `protocol`;
 * `probe` is everything it saw (the JSON shape every API's probe shares).
 */
export class ProbeError extends GatehouseError {
  readonly reason: ProbeReason;
  readonly status: number | null;
  readonly probe: ProbeResult;

  constructor(probe: ProbeResult) {
    const f = probe.failure ?? { reason: "protocol" as const, status: null, message: "failed" };
    const status = f.status ? ` (HTTP ${f.status})` : "";
    super(`probe of ${probe.id}: ${f.reason}${status}: ${f.message}`);
    this.reason = f.reason;
    this.status = f.status;
    this.probe = probe;
  }
}
