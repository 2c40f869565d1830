import { timingSafeEqual } from 'node:crypto'
import { Type } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { Elysia } from 'elysia'
import { fromValueError } from '../../api/value-error.ts'
import { keyNotFound, PermissionDenied, TropaError, UnsupportedMediaType, unknownPath } from '../../errors.ts'
import type { Principal } from '../../identity/live.ts'
import type { ConsoleSession } from '../../identity/sessions.ts'
import type { Services } from '../../services.ts'
import { actAs } from '../auth.ts'
import { readJson } from '../body.ts'
import { type ConsoleAssets, consoleAssets } from './console-assets.ts'

/** The session cookie: HttpOnly, SameSite=Strict, sent only to /console (the page, its API calls). */
export const SESSION_COOKIE = 'tropa_console'

/**
 * The console's Content-Security-Policy: its own script and styles only (no inline script or
 * style), requests to this origin only, no frames, plugins, forms or base URL.
 */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ')

const SECURITY_HEADERS = {
  'content-security-policy': CONSOLE_CSP,
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
}

const SignIn = TypeCompiler.Compile(
  Type.Object({ token: Type.String({ minLength: 1, maxLength: 256 }) }, { additionalProperties: false }),
)

const SAFE_METHODS = new Set(['GET', 'HEAD'])

function cookieOf(request: Request): string | undefined {
  const header = request.headers.get('cookie')
  if (!header) return undefined
  for (const part of header.split(';')) {
    const eq = part.indexOf('=')
    if (eq > 0 && part.slice(0, eq).trim() === SESSION_COOKIE) return part.slice(eq + 1).trim()
  }
  return undefined
}

/** Secure when the request came over TLS, or through a proxy that says it did. */
function overTls(request: Request): boolean {
  return (
    new URL(request.url).protocol === 'https:' ||
    (request.headers.get('x-forwarded-proto') ?? '').split(',')[0]?.trim().toLowerCase() === 'https'
  )
}

function setCookie(request: Request, value: string, maxAgeSec: number): string {
  const secure = overTls(request) ? '; Secure' : ''
  return `${SESSION_COOKIE}=${value}; Path=/console; Max-Age=${maxAgeSec}; HttpOnly; SameSite=Strict${secure}`
}

/**
 * A state-changing call must echo the session's CSRF value in `x-csrf-token`; a page of another
 * origin can neither read that value nor (SameSite=Strict) send the cookie. An Origin header, when
 * the browser sends one, must be this origin as well.
 */
function checkCsrf(request: Request, session: ConsoleSession): void {
  checkOrigin(request)
  const sent = Buffer.from(request.headers.get('x-csrf-token') ?? '')
  const want = Buffer.from(session.record.csrf)
  if (sent.length !== want.length || !timingSafeEqual(sent, want))
    throw new PermissionDenied('missing or wrong x-csrf-token (the value GET /console/session returns)')
}

/** A browser's Origin header, when sent, must be this origin (no page elsewhere signs anyone in or out). */
function checkOrigin(request: Request): void {
  const origin = request.headers.get('origin')
  const host = request.headers.get('host')
  if (origin !== null && host !== null) {
    let ok = false
    try {
      ok = new URL(origin).host === host
    } catch {
      // not a URL: refused below
    }
    if (!ok) throw new PermissionDenied('a console call from another origin is refused')
  }
}

function sessionView(s: ConsoleSession, idleSec: number) {
  const p = s.principal
  return {
    object: 'console.session' as const,
    signed_in: true,
    role: p.kind === 'admin' ? ('operator' as const) : ('organization' as const),
    organization: p.kind === 'admin' ? null : { id: p.org.id, name: p.org.name },
    csrf_token: s.record.csrf,
    idle_timeout_sec: idleSec,
  }
}

/** Console calls of /v1 that a session may make besides what its principal may: none but reading the catalogue. */
function catalogueRead(method: string, path: string): boolean {
  return method === 'GET' && (path === '/v1/models' || path.startsWith('/v1/models/'))
}

/** The header naming one of the organization's API keys to call with (Playground, Batches). */
export const ACT_AS_KEY = 'x-console-key-id'

/**
 * Whom a console call acts as: the session's principal, or, when an organization's session names
 * one of its own API keys in x-console-key-id, that key (model endpoints and batches need a key
 * to bill; the master key could create one anyway). Another organization's key, or a master
 * key, is not found; a revoked or disabled one gets its usual 401.
 */
async function actingAs(svc: Services, session: ConsoleSession, keyId: string | null): Promise<Principal> {
  const p = session.principal
  if (keyId === null) return p
  if (p.kind !== 'master')
    throw new PermissionDenied(
      `${ACT_AS_KEY} is for an organization's session (the operator has no API keys)`,
    )
  const known = svc.identity.keyById(keyId) ?? (await svc.store.getKey(keyId))
  if (!known || known.orgId !== p.org.id || known.kind !== 'api') throw keyNotFound(keyId)
  return svc.identity.principalOfKey(keyId)
}

/**
 * The web console: the page and its assets at /console, sign-in at /console/session, and
 * /console/api/v1/* — the public /v1 API called with the session cookie instead of a Bearer
 * token (the call is handed to the same routes, as the session's principal). `/` redirects here.
 * Nothing of this runs on the /v1 routes themselves.
 */
export const consoleRoutes = (svc: Services, handle: (request: Request) => Promise<Response>) => {
  const sessions = svc.consoleSessions
  const idle = sessions.idleSec
  const hide = { detail: { hide: true } }
  let assets: Promise<ConsoleAssets> | undefined
  const loaded = () => {
    assets ??= consoleAssets().catch((err) => {
      assets = undefined
      throw err
    })
    return assets
  }
  return new Elysia({ name: 'routes.console' })
    .get('/', ({ redirect }) => redirect('/console', 302), hide)
    .get(
      '/console',
      async () =>
        new Response((await loaded()).page, {
          headers: {
            ...SECURITY_HEADERS,
            'content-type': 'text/html; charset=utf-8',
            'cache-control': 'no-cache',
          },
        }),
      hide,
    )
    .get(
      '/console/assets/:file',
      async ({ params, request }) => {
        const asset = (await loaded()).files.get(params.file)
        if (!asset) throw unknownPath(request.method, new URL(request.url).pathname)
        return new Response(asset.body, {
          headers: {
            ...SECURITY_HEADERS,
            'content-type': asset.type,
            'cache-control': 'public, max-age=31536000, immutable',
          },
        })
      },
      hide,
    )
    .post(
      '/console/session',
      async ({ request }) => {
        // A page elsewhere could post a body without a type (a Blob) or from its own origin to sign
        // this browser in to an account of its choosing: both are refused.
        checkOrigin(request)
        if (request.headers.get('content-type') === null) throw new UnsupportedMediaType('none')
        const body = await readJson(request, 4096)
        if (!SignIn.Check(body)) throw fromValueError(SignIn.Errors(body).First())
        const { cookie, session } = await sessions.create(body.token)
        return Response.json(sessionView(session, idle), {
          status: 201,
          headers: { 'set-cookie': setCookie(request, cookie, idle), 'cache-control': 'no-store' },
        })
      },
      {
        parse: 'none',
        detail: {
          tags: ['console'],
          summary: 'Sign in to the console with a master key or the admin token (sets the session cookie)',
        },
      },
    )
    .get(
      '/console/session',
      async ({ request, set }) => {
        set.headers['cache-control'] = 'no-store'
        // Not signed in is an answer here, not an error: the page asks this on every load.
        const session = await sessions.resolve(cookieOf(request)).catch((err: unknown) => {
          if (err instanceof TropaError && err.code === 'session_required') return null
          throw err
        })
        return session ? sessionView(session, idle) : { object: 'console.session' as const, signed_in: false }
      },
      { detail: { tags: ['console'], summary: 'The console session of this browser and its CSRF token' } },
    )
    .delete(
      '/console/session',
      async ({ request }) => {
        const cookie = cookieOf(request)
        const session = await sessions.resolve(cookie)
        checkCsrf(request, session)
        await sessions.end(cookie!)
        return Response.json(
          { object: 'console.session', deleted: true },
          { headers: { 'set-cookie': setCookie(request, '', 0), 'cache-control': 'no-store' } },
        )
      },
      { detail: { tags: ['console'], summary: 'Sign out: the session is revoked on every node' } },
    )
    .all(
      '/console/api/*',
      async ({ request }) => {
        const url = new URL(request.url)
        const path = url.pathname.slice('/console/api'.length)
        if (!path.startsWith('/v1/')) throw unknownPath(request.method, url.pathname)
        const session = await sessions.resolve(cookieOf(request))
        if (!SAFE_METHODS.has(request.method)) checkCsrf(request, session)
        const principal = await actingAs(svc, session, request.headers.get(ACT_AS_KEY))
        const headers = new Headers(request.headers)
        for (const h of ['cookie', 'authorization', 'x-api-key', 'x-csrf-token', ACT_AS_KEY])
          headers.delete(h)
        const inner = new Request(new URL(path + url.search, url.origin), {
          method: request.method,
          headers,
          body: SAFE_METHODS.has(request.method) ? null : request.body,
          signal: request.signal,
          duplex: 'half',
        })
        // The catalogue (public prices) is read for an organization's session as the admin
        // token reads it: a master key itself is refused on /v1/models, by the roles table.
        actAs(inner, catalogueRead(request.method, path) ? { kind: 'admin' } : principal)
        const reply = await handle(inner)
        const out = new Response(reply.body, reply)
        // The route's own caching rule when it has one: an event stream keeps its no-cache (with
        // no-store, Chromium reports the finished stream as an aborted request).
        if (!out.headers.has('cache-control')) out.headers.set('cache-control', 'no-store')
        return out
      },
      { parse: 'none', ...hide },
    )
}
