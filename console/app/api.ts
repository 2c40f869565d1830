/** The console's calls: the public /v1 API under /console/api, signed in by the session cookie. */

export interface Session {
  readonly signed_in: true
  readonly role: 'organization' | 'operator'
  readonly organization: { id: string; name: string } | null
  readonly csrf_token: string
}

/** An answer other than 2xx, with the API's error message and code. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly code: string | null,
  ) {
    super(message)
  }
}

let csrf = ''
/** Called when a call finds the session gone (expired, signed out elsewhere). */
let onSignedOut: () => void = () => {}

export function useSession(s: Session | null, signedOut: () => void): void {
  csrf = s?.csrf_token ?? ''
  onSignedOut = signedOut
}

async function send<T>(
  url: string,
  method: string,
  body?: unknown,
  raw?: BodyInit,
  extra: Record<string, string> = {},
): Promise<T> {
  const headers: Record<string, string> = { ...extra }
  if (method !== 'GET') headers['x-csrf-token'] = csrf
  if (body !== undefined) headers['content-type'] = 'application/json'
  const r = await fetch(url, {
    method,
    headers,
    credentials: 'same-origin',
    body: raw ?? (body === undefined ? null : JSON.stringify(body)),
  })
  const text = await r.text()
  let json: unknown = null
  try {
    json = text ? JSON.parse(text) : null
  } catch {
    // not JSON: reported below with the status
  }
  if (!r.ok) {
    const err = (json as { error?: { message?: string; code?: string } } | null)?.error
    if (err?.code === 'session_required') onSignedOut()
    throw new ApiError(r.status, err?.message ?? `HTTP ${r.status}`, err?.code ?? null)
  }
  return json as T
}

/** A /v1 call as the signed-in organization or operator. */
export const api = <T>(path: string, method = 'GET', body?: unknown) =>
  send<T>(`/console/api/v1${path}`, method, body)

/** A /v1 call made with one of the organization's API keys (by id; its secret is never needed). */
export const apiAsKey = <T>(keyId: string, path: string, method = 'GET', body?: unknown, raw?: BodyInit) =>
  send<T>(`/console/api/v1${path}`, method, body, raw, { 'x-console-key-id': keyId })

/** A raw /v1 request with a key (a stream the caller reads itself). */
export function fetchAsKey(
  keyId: string,
  path: string,
  body: unknown,
  signal?: AbortSignal,
): Promise<Response> {
  return fetch(`/console/api/v1${path}`, {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json', 'x-csrf-token': csrf, 'x-console-key-id': keyId },
    body: JSON.stringify(body),
    ...(signal && { signal }),
  })
}

export const session = {
  current: () =>
    send<Session | { signed_in: false }>('/console/session', 'GET').then((s) => (s.signed_in ? s : null)),
  signIn: (token: string) => send<Session>('/console/session', 'POST', { token }),
  signOut: () => send<unknown>('/console/session', 'DELETE'),
}

/** A query string of the defined values. */
export function qs(params: Record<string, string | number | undefined | null>): string {
  const p = new URLSearchParams()
  for (const [k, v] of Object.entries(params))
    if (v !== undefined && v !== null && v !== '') p.set(k, String(v))
  const s = p.toString()
  return s ? `?${s}` : ''
}
