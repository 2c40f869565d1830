import type { RouteConfig } from '../../../config/load.ts'
import { UpstreamFailed, UpstreamTimeout } from '../../../errors.ts'
import type { UpstreamCall } from '../../adapter.ts'
import type { Watchdog } from '../../watchdog.ts'
import { readCapped } from '../http.ts'
import { DEFAULT_AUTH_URL, DEFAULT_SCOPE } from './auth.ts'
import { IMAGE_TYPES, type InlineImage } from './translate.ts'

// GigaChat takes images only as files in its storage: POST <base_url>/files (multipart: `file`,
// `purpose=general`) answers {id, object: "file", bytes, ...}; a chat message names the id in
// `attachments`. The ids are cached per credential and content, so an image sent again (every
// turn of a conversation carries it) is not uploaded again.

/** Uploads remembered (an LRU): enough for the images of the conversations in flight. */
const CACHE_ENTRIES = 1024
/** A remembered id is used this long; after that the image is uploaded anew. */
const CACHE_TTL_MS = 60 * 60_000

interface Cached {
  readonly id: string
  readonly until: number
}

/** What one attach pass did: the cache keys it took ids from (dropped if the chat refuses them). */
export interface Attached {
  readonly fromCache: string[]
  uploads: number
}

/**
 * Content hash -> file id, per GigaChat account (files are private to the account that uploaded
 * them): a bounded LRU with a TTL. The hash is SHA-256: a collision would attach one tenant's
 * image to another's request.
 */
export class UploadCache {
  private readonly entries = new Map<string, Cached>()

  key(route: RouteConfig, image: InlineImage): string {
    const hasher = new Bun.CryptoHasher('sha256')
    hasher.update(
      `${route.baseUrl}\n${route.authUrl ?? DEFAULT_AUTH_URL}\n${route.scope ?? DEFAULT_SCOPE}\n${route.apiKey ?? ''}\n${image.mime}\n`,
    )
    hasher.update(image.base64)
    return hasher.digest('base64')
  }

  get(key: string): string | undefined {
    const e = this.entries.get(key)
    if (!e) return undefined
    this.entries.delete(key)
    if (Date.now() >= e.until) return undefined
    this.entries.set(key, e)
    return e.id
  }

  set(key: string, id: string): void {
    this.entries.delete(key)
    this.entries.set(key, { id, until: Date.now() + CACHE_TTL_MS })
    if (this.entries.size > CACHE_ENTRIES) this.entries.delete(this.entries.keys().next().value!)
  }

  delete(key: string): void {
    this.entries.delete(key)
  }

  get size(): number {
    return this.entries.size
  }
}

/**
 * Uploads `image` with `token` and returns the file id. The upload runs under the attempt's
 * headers deadline and abort; a refusal is classified as the chat's (`classify`).
 */
export async function uploadImage(
  call: UpstreamCall,
  image: InlineImage,
  token: string,
  controller: AbortController,
  headersDeadlineMs: number,
  watchdog: Watchdog,
  classify: (call: UpstreamCall, status: number, body: string) => Error,
): Promise<string> {
  const node = call.route.node
  const signal = controller.signal
  if (signal.aborted) throw signal.reason
  const form = new FormData()
  const data = Buffer.from(image.base64, 'base64')
  form.append('file', new Blob([data], { type: image.mime }), `image.${IMAGE_TYPES[image.mime]}`)
  form.append('purpose', 'general')
  const headers: Record<string, string> = {}
  for (const [k, v] of Object.entries(call.route.headers ?? {}))
    if (k.toLowerCase() !== 'content-type') headers[k] = v
  headers.accept = 'application/json'
  headers.authorization = `Bearer ${token}`
  const d = watchdog.watch(headersDeadlineMs, () =>
    controller.abort(new UpstreamTimeout(`${node} did not answer the image upload in time`)),
  )
  let text = ''
  let status = 0
  try {
    let res: Response
    try {
      res = await fetch(`${call.route.baseUrl}/files`, {
        method: 'POST',
        headers,
        body: form,
        signal,
        ...(call.route.tlsCa !== undefined && { tls: { ca: call.route.tlsCa } }),
      })
    } catch (err) {
      if (signal.aborted) throw signal.reason
      throw new UpstreamFailed(
        `upstream node ${node} could not be reached`,
        'upstream_error',
        null,
        (err as Error).message,
      )
    }
    status = res.status
    try {
      text = await readCapped(res, 64 * 1024)
    } catch {
      if (signal.aborted) throw signal.reason
      // judged by the status, then by the (missing) id
    }
  } finally {
    watchdog.clear(d)
  }
  if (status < 200 || status > 299) throw classify(call, status, text)
  let id: unknown
  try {
    id = (JSON.parse(text) as { id?: unknown })?.id
  } catch {
    // below
  }
  if (typeof id !== 'string' || id === '')
    throw new UpstreamFailed(`${node} answered the image upload without a file id`, 'upstream_error')
  return id
}
