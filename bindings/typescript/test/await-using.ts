// Compiled by tsc (tsconfig.test.json): `await using` releases the execution at the block's end.
import type { AdminClient } from "../src/index.js";

export async function runScoped(admin: AdminClient): Promise<string> {
  await using run = await admin.register({ agentId: "ts-scoped", tools: ["demo.echo"] });
  const p = await run.probe();
  if (!p.ok) throw new Error("probe failed");
  return run.id;
}
