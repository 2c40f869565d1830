import { END_USER_HEADER, MAX_END_USER_LENGTH } from '../billing/budgets.ts'
import { InvalidValue, PermissionDenied } from '../errors.ts'
import type { LiveOrg, Principal } from '../identity/live.ts'
import type { Payer } from '../pipeline/chat.ts'
import { DRY_RUN_HEADER } from '../pipeline/quote.ts'
import type { Services } from '../services.ts'

/**
 * The caller's credential as an Authorization value: that header, or else Anthropic's
 * `x-api-key: <key>` (Claude Code and Anthropic's 0.x SDKs send the key so), on any route.
 */
export function credentialOf(request: Request): string | null {
  const authorization = request.headers.get('authorization')
  if (authorization !== null) return authorization
  const apiKey = request.headers.get('x-api-key')
  return apiKey === null ? null : `Bearer ${apiKey}`
}

// The body parser authenticates first (401 before reading a body); derive then reuses it.
const seen = new WeakMap<Request, Principal>()

/** An Elysia `derive`: who is calling. Throws 401 before validation runs. */
export const authenticate =
  (svc: Services) =>
  async ({ request }: { request: Request }): Promise<{ principal: Principal }> => ({
    principal: seen.get(request) ?? (await svc.identity.authenticateShared(credentialOf(request))),
  })

/**
 * A request made on behalf of an already authenticated caller (the console's calls, signed in
 * by a session cookie): the routes' `authenticate` then sees that principal, exactly as if the
 * caller's own token had come in the Authorization header.
 */
export function actAs(request: Request, principal: Principal): void {
  seen.set(request, principal)
}

/** For body parsers: refuse an unauthenticated request before its body is read. */
export const authenticateFirst = (svc: Services) => async (request: Request) => {
  if (!seen.has(request)) seen.set(request, await svc.identity.authenticateShared(credentialOf(request)))
}

/** Deadline-aware admission (pipeline/dispatch.ts): the first token is wanted within this many ms. */
export const TTFT_BUDGET_HEADER = 'x-tropa-ttft-budget-ms'
const MAX_TTFT_BUDGET_MS = 3_600_000

function ttftBudgetOf(v: string): number {
  const ms = /^\d{1,7}$/.test(v.trim()) ? Number(v.trim()) : Number.NaN
  if (!(ms >= 1 && ms <= MAX_TTFT_BUDGET_MS))
    throw new InvalidValue(
      `${TTFT_BUDGET_HEADER} must be a whole number of ms from 1 to ${MAX_TTFT_BUDGET_MS}`,
      TTFT_BUDGET_HEADER,
    )
  return ms
}

/**
 * Model endpoints take API keys only: they need a key to bill. With the request's headers, the
 * payer carries `x-tropa-dry-run: 1` (unless `quotes` is false) and the end user: the
 * `x-tropa-end-user` header, else the body's field (`user`, Messages' `metadata.user_id`, given
 * as `user` with its name in `userParam`); empty is none, longer than 256 characters a 400.
 * And `x-tropa-ttft-budget-ms` (deadline-aware admission), a whole number of ms, else a 400.
 */
export function payerOf(
  p: Principal,
  headers?: Headers,
  o?: { readonly user?: string | null | undefined; readonly userParam?: string; readonly quotes?: false },
): Payer {
  if (p.kind === 'api') {
    if (headers === undefined) return p
    const quoteOnly = o?.quotes !== false && headers.get(DRY_RUN_HEADER) === '1'
    const header = headers.get(END_USER_HEADER)
    const named = header ?? o?.user ?? undefined
    const budget = headers.get(TTFT_BUDGET_HEADER)
    // The pass-through path without an end user, a quote or a budget: the principal itself, nothing built.
    if (!quoteOnly && !named && budget === null) return p
    if (named && named.length > MAX_END_USER_LENGTH)
      throw new InvalidValue(
        `an end user id may be at most ${MAX_END_USER_LENGTH} characters`,
        header !== null ? END_USER_HEADER : (o?.userParam ?? 'user'),
      )
    return {
      key: p.key,
      org: p.org,
      ...(quoteOnly && { quoteOnly: true }),
      ...(named && { endUser: named }),
      ...(budget !== null && { ttftBudgetMs: ttftBudgetOf(budget) }),
    }
  }
  throw new PermissionDenied(
    p.kind === 'master'
      ? 'a master key manages keys only; call model endpoints with an API key (sk-...)'
      : 'the admin token manages organizations and keys; call model endpoints with an API key (sk-...)',
  )
}

/** May list, read and call without billing (the catalogue): API keys and the admin token. */
export function requireReader(p: Principal): void {
  if (p.kind === 'master')
    throw new PermissionDenied('a master key manages keys only; use an API key (sk-...)')
}

/** The organization whose keys the caller manages: a master key's own, or any for the admin. */
export function keyManagerOrg(svc: Services, p: Principal, orgId: string | undefined): LiveOrg {
  if (p.kind === 'master') {
    // Not silently ignored: a master key that names another organization is told so.
    if (orgId !== undefined && orgId !== p.org.id)
      throw new InvalidValue(
        "org_id is for the admin token; a master key manages its own organization's keys",
        'org_id',
      )
    return p.org
  }
  if (p.kind === 'admin') {
    if (!orgId) throw new InvalidValue('with the admin token, name the organization with org_id', 'org_id')
    return svc.identity.org(orgId)
  }
  throw new PermissionDenied("this endpoint needs the organization's master key (mk-...), not an API key")
}

export function requireAdmin(p: Principal): void {
  if (p.kind !== 'admin') throw new PermissionDenied('this endpoint needs the admin token')
}

/**
 * Whose ledger the caller reads (GET /v1/activity, /v1/usage/series): a master key its own
 * organization's, the admin token any organization's (org_id), an API key its own key's rows only
 * (`key_id`, when given, must be that key: 403 otherwise).
 */
export function ledgerReader(
  svc: Services,
  p: Principal,
  orgId: string | undefined,
  keyId: string | undefined,
): { org: LiveOrg; keyId: string | undefined } {
  if (p.kind !== 'api') return { org: keyManagerOrg(svc, p, orgId), keyId }
  if (orgId !== undefined && orgId !== p.org.id)
    throw new InvalidValue("org_id is for the admin token; an API key reads its own key's rows", 'org_id')
  if (keyId !== undefined && keyId !== p.key.id)
    throw new PermissionDenied("an API key reads its own key's rows only; use the master key for others")
  return { org: p.org, keyId: p.key.id }
}
