// Preloaded into the conformance suite (NODE_OPTIONS="--import .../add-auth.mjs") so that every
// request it makes carries `Authorization: Bearer $CONFORMANCE_BEARER_TOKEN`. The suite has no
// option to add a header, and gatehouse must keep its token check strict.
//  - globalThis.fetch covers the suite's MCP client (StreamableHTTPClientTransport) and its raw
//    SSE probes;
//  - undici.request covers dns-rebinding-protection, which uses undici directly. Patching the
//    CommonJS exports before the suite is imported makes its `import { request } from "undici"`
//    pick up the wrapper.
import { createRequire } from 'node:module';

const token = process.env.CONFORMANCE_BEARER_TOKEN;
if (token) {
  const value = `Bearer ${token}`;

  const originalFetch = globalThis.fetch;
  globalThis.fetch = (input, init = undefined) => {
    if (input instanceof Request) {
      const headers = new Headers(input.headers);
      if (!headers.has('authorization')) headers.set('authorization', value);
      return originalFetch(new Request(input, { headers }), init);
    }
    const headers = new Headers(init?.headers ?? {});
    if (!headers.has('authorization')) headers.set('authorization', value);
    return originalFetch(input, { ...(init ?? {}), headers });
  };

  let undici = null;
  try {
    // The suite's own undici: next to this file, or in CONFORMANCE_SUITE_DIR (another install of
    // the suite, e.g. ../conformance-next). Present once `setup.sh --conformance` ran.
    const base = process.env.CONFORMANCE_SUITE_DIR
      ? `${process.env.CONFORMANCE_SUITE_DIR.replace(/\/$/, '')}/package.json`
      : import.meta.url;
    undici = createRequire(base)('undici');
  } catch {
    // no npm undici next to this file: only fetch is wrapped (enough for e.g. mcp-inspector --cli)
  }
  if (undici) {
    const originalRequest = undici.request;
    undici.request = (url, opts = {}, ...rest) => {
      let headers = opts.headers ?? {};
      if (headers instanceof Headers || Array.isArray(headers)) headers = Object.fromEntries(new Headers(headers));
      const hasAuth = Object.keys(headers).some((k) => k.toLowerCase() === 'authorization');
      return originalRequest(url, { ...opts, headers: hasAuth ? headers : { ...headers, authorization: value } }, ...rest);
    };
  }
}
