#!/usr/bin/env node
// A real OAuth 2 authorization server for tests/oauth_upstream.rs (issue 47): panva's
// `oidc-provider` (a certified OpenID provider), with
//   - client credentials (features.clientCredentials),
//   - RFC 8707 resource indicators: every token is a JWT access token (RS256, the provider's
//     JWKS) whose `aud` is the resource asked for, its lifetime ACCESS_TTL seconds,
//   - RFC 7009 revocation (features.revocation),
//   - RFC 8693 token exchange, registered with registerGrantType: the subject token is one
//     of OAUTH_SUBJECTS (a JSON map of opaque access tokens to users, standing in for the
//     tokens an identity provider gave the users); the actor token, when sent, has the type
//     urn:io.gatehouse:params:oauth:token-type:agent-path and is an agent path
//     ("root/child": agent ids from the root down, each form-encoded, joined by "/"), which this server turns into the RFC 8693 `act` chain
//     ({"sub": "child", "act": {"sub": "root"}}: the current actor outermost). Only the
//     authenticated client may assert an actor (the gateway is a confidential client).
//
// Usage: node oauth_as.mjs   (env: OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET, OAUTH_SUBJECTS,
//                              ACCESS_TTL, PORT (0: any))
// Prints {"listening": PORT, "issuer": URL} once it accepts. GET /_stats answers the requests
// it served: {"token": {"<grant_type>": n}, "revocation": n} (counts only, never a token).
import * as crypto from 'node:crypto';
import * as http from 'node:http';

import Provider, { errors } from 'oidc-provider';

// stdout carries the one line announcing the port (its reader may close it then): the
// provider's notices go to stderr.
console.log = console.error;
console.info = console.error;

const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';
const AGENT_PATH = 'urn:io.gatehouse:params:oauth:token-type:agent-path';

const clientId = process.env.OAUTH_CLIENT_ID || 'gatehouse';
const clientSecret = process.env.OAUTH_CLIENT_SECRET;
if (!clientSecret) throw new Error('OAUTH_CLIENT_SECRET is not set');
const subjects = JSON.parse(process.env.OAUTH_SUBJECTS || '{}');
const ttl = Number(process.env.ACCESS_TTL || '300');

const stats = { token: {}, revocation: 0 };
/** The `act` claim of tokens being issued (read by extraTokenClaims). */
const actOf = new WeakMap();

const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid: 'k1', use: 'sig', alg: 'RS256' };

const server = http.createServer();
await new Promise((resolve) => server.listen(Number(process.env.PORT || 0), '127.0.0.1', resolve));
const { port } = server.address();
const issuer = `http://127.0.0.1:${port}`;

const resourceInfo = (resource) => ({
  scope: 'tools',
  audience: resource,
  accessTokenTTL: ttl,
  accessTokenFormat: 'jwt',
  jwt: { sign: { alg: 'RS256' } },
});

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    grant_types: ['client_credentials', TOKEN_EXCHANGE],
    redirect_uris: [],
    response_types: [],
    token_endpoint_auth_method: 'client_secret_basic',
    scope: 'tools',
  }],
  jwks: { keys: [jwk] },
  scopes: ['tools'],
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource) => resourceInfo(resource),
    },
  },
  extraTokenClaims: (ctx, token) => {
    const act = actOf.get(token);
    return act ? { act } : undefined;
  },
});
provider.proxy = false;

/** "root/child" -> {sub: "child", act: {sub: "root"}} */
function actChain(path) {
  const ids = path.split('/').filter(Boolean)
    .map((id) => decodeURIComponent(id.replaceAll('+', ' ')));
  let act;
  for (const id of ids) act = act ? { sub: id, act } : { sub: id };
  return act;
}

provider.registerGrantType(TOKEN_EXCHANGE, async (ctx) => {
  const { params, client } = ctx.oidc;
  if (params.subject_token_type !== ACCESS_TOKEN) {
    throw new errors.InvalidRequest('unsupported subject_token_type');
  }
  const user = subjects[params.subject_token];
  if (!user) throw new errors.InvalidGrant('subject_token is not valid');
  let act;
  if (params.actor_token !== undefined) {
    if (params.actor_token_type !== AGENT_PATH) {
      throw new errors.InvalidRequest('unsupported actor_token_type');
    }
    act = actChain(params.actor_token);
    if (!act) throw new errors.InvalidRequest('empty agent path');
  }
  const resource = params.resource;
  if (!resource) throw new errors.InvalidTarget('a resource indicator is required');
  const grant = new provider.Grant({ accountId: user, clientId: client.clientId });
  grant.addResourceScope(resource, 'tools');
  const grantId = await grant.save();
  const token = new provider.AccessToken({
    accountId: user,
    client,
    grantId,
    gty: 'token_exchange',
    scope: 'tools',
  });
  token.resourceServer = new provider.ResourceServer(resource, resourceInfo(resource));
  if (act) actOf.set(token, act);
  const value = await token.save();
  ctx.body = {
    access_token: value,
    issued_token_type: ACCESS_TOKEN,
    token_type: 'Bearer',
    expires_in: token.expiration,
    scope: 'tools',
  };
}, ['subject_token', 'subject_token_type', 'actor_token', 'actor_token_type', 'requested_token_type', 'resource', 'scope', 'audience']);

provider.use(async (ctx, next) => {
  if (ctx.path === '/_stats') {
    ctx.body = stats;
    return;
  }
  if (ctx.method === 'POST' && ctx.path === '/token/revocation') {
    stats.revocation += 1;
  }
  await next();
  if (ctx.method === 'POST' && ctx.path === '/token') {
    // Counted once answered (refused requests too), by the grant type the provider parsed.
    const grant = ctx.oidc?.params?.grant_type || '-';
    stats.token[grant] = (stats.token[grant] || 0) + 1;
  }
});

server.on('request', provider.callback());
process.stdout.write(`${JSON.stringify({ listening: port, issuer })}\n`);
