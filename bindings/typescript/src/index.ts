/**
 * @gatehouse/client: the TypeScript harness client of the gatehouse MCP gateway.
 *
 * ```ts
 * import { AdminClient } from "@gatehouse/client";
 * const admin = new AdminClient(); // GATEHOUSE_ADMIN_URL, GATEHOUSE_ADMIN_TOKEN
 * await using run = await admin.register({ agentId: "agent-7", tools: ["helpdesk.*"], ttlSeconds: 600 });
 * await run.probe(); // throws ProbeError with the reason if it is not healthy
 * // hand run.mcpUrl and run.token to the agent's MCP client
 * ```
 */

export {
  AdminClient,
  type AdminClientOptions,
  type AuditPage,
  type AuditQuery,
  type Created,
  type PendingApproval,
  type ProbeOptions,
  type RegisterOptions,
  type RegistrationInfo,
  type RegistrationSpec,
  type Renewed,
  type Root,
} from "./admin.js";
export { Execution } from "./execution.js";
export {
  AdminApiError,
  AdminAuthError,
  AdminUnreachableError,
  GatehouseError,
  InvalidRequestError,
  NotFoundError,
  ProbeError,
  UnavailableError,
} from "./errors.js";
export type {
  ProbeFailure,
  ProbeReason,
  ProbeResult,
  ToolsSeen,
  UpstreamSeen,
  UpstreamsSeen,
} from "./probe.js";
