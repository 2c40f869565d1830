import type { RouteConfig } from '../../../config/load.ts'
import { UpstreamFailed, UpstreamTimeout } from '../../../errors.ts'
import { readCapped } from '../http.ts'

export const DEFAULT_AUTH_URL = 'https://ngw.devices.sberbank.ru:9443/api/v2/oauth'
export const DEFAULT_SCOPE = 'GIGACHAT_API_PERS'
/** How long one OAuth exchange may take. */
const EXCHANGE_TIMEOUT_MS = 10_000
/** A token is renewed this long before its expiry (at most; a tenth of its lifetime if shorter). */
const MAX_MARGIN_MS = 60_000

interface Token {
  readonly value: string
  /** When to stop using it: its expires_at less the margin, ms epoch. */
  readonly renewAt: number
}

interface Entry {
  token: Token | undefined
  /** The exchange in flight, if any: every caller that needs a token awaits this one. */
  inflight: Promise<Token> | undefined
}

/**
 * GigaChat's OAuth client-credentials exchange and its token cache. One cache entry per
 * credential, auth URL and scope (so per configured route family, a fixed number): the token is
 * shared by all requests, at most one exchange is in flight per entry (concurrent callers await
 * the same promise), and it is renewed before expiry. A failed exchange (the OAuth endpoint
 * refusing the key, failing or unreachable) is the node's failure: the request fails over.
 */
export class GigaChatAuth {
  private readonly entries = new Map<string, Entry>()

  /** A valid access token for the route, from the cache or a (shared) exchange. */
  async token(route: RouteConfig, signal: AbortSignal): Promise<string> {
    const entry = this.entry(route)
    if (entry.token && Date.now() < entry.token.renewAt) return entry.token.value
    if (!entry.inflight) {
      const p = this.exchange(route)
      entry.inflight = p
      p.then(
        (t) => {
          entry.token = t
          entry.inflight = undefined
        },
        () => {
          entry.inflight = undefined
        },
      )
    }
    return (await abortable(entry.inflight, signal)).value
  }

  /**
   * The API refused `token` (401): drop it so the next caller exchanges anew. A token already
   * replaced (another request saw the 401 first) is left alone: one refresh, not one per request.
   */
  invalidate(route: RouteConfig, token: string): void {
    const entry = this.entry(route)
    if (entry.token?.value === token) entry.token = undefined
  }

  private entry(route: RouteConfig): Entry {
    const key = `${route.authUrl ?? DEFAULT_AUTH_URL}\n${route.scope ?? DEFAULT_SCOPE}\n${route.apiKey ?? ''}`
    let entry = this.entries.get(key)
    if (!entry) {
      entry = { token: undefined, inflight: undefined }
      this.entries.set(key, entry)
    }
    return entry
  }

  private async exchange(route: RouteConfig): Promise<Token> {
    const url = route.authUrl ?? DEFAULT_AUTH_URL
    const signal = AbortSignal.timeout(EXCHANGE_TIMEOUT_MS)
    let res: Response
    try {
      res = await fetch(url, {
        method: 'POST',
        headers: {
          authorization: `Basic ${route.apiKey ?? ''}`,
          rquid: crypto.randomUUID(),
          'content-type': 'application/x-www-form-urlencoded',
          accept: 'application/json',
        },
        body: new URLSearchParams({ scope: route.scope ?? DEFAULT_SCOPE }).toString(),
        signal,
        ...(route.tlsCa !== undefined && { tls: { ca: route.tlsCa } }),
      })
    } catch (err) {
      if (signal.aborted)
        throw new UpstreamTimeout(`${route.node}: the GigaChat OAuth endpoint did not answer in time`)
      throw new UpstreamFailed(
        `${route.node}: the GigaChat OAuth endpoint could not be reached`,
        'upstream_error',
        null,
        (err as Error).message,
      )
    }
    let text = ''
    try {
      text = await readCapped(res, 64 * 1024)
    } catch {
      // judged by status, then by the (missing) token
    }
    if (!res.ok)
      throw new UpstreamFailed(
        `${route.node}: the GigaChat OAuth endpoint answered ${res.status}`,
        'upstream_error',
        res.status,
        text.slice(0, 1024),
      )
    let parsed: { access_token?: unknown; expires_at?: unknown } | undefined
    try {
      parsed = JSON.parse(text)
    } catch {
      // below
    }
    const value = parsed?.access_token
    const expiresAt = parsed?.expires_at
    if (
      typeof value !== 'string' ||
      value === '' ||
      typeof expiresAt !== 'number' ||
      !Number.isFinite(expiresAt)
    )
      throw new UpstreamFailed(
        `${route.node}: the GigaChat OAuth endpoint sent no usable token`,
        'upstream_error',
      )
    const now = Date.now()
    const margin = Math.min(MAX_MARGIN_MS, Math.max(0, (expiresAt - now) / 10))
    return { value, renewAt: expiresAt - margin }
  }
}

/** The promise, or the signal's reason if it aborts first (the shared exchange goes on). */
function abortable<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason)
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason)
    signal.addEventListener('abort', onAbort, { once: true })
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort)
        resolve(v)
      },
      (e) => {
        signal.removeEventListener('abort', onAbort)
        reject(e)
      },
    )
  })
}
