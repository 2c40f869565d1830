import { InvalidValue, UpstreamFailed, UpstreamRejected, UpstreamTimeout } from '../../../errors.ts'
import type { UpstreamAdapter, UpstreamCall, UpstreamReply } from '../../adapter.ts'
import { cleanUpstreamMessage } from '../../redact.ts'
import type { Watchdog } from '../../watchdog.ts'
import { internalBody, readCapped, sendHttp } from '../http.ts'
import { floatsToBase64, lineSplitter, randomId, SSE_DONE, sseEvent, translatedJson } from '../lines.ts'
import { GigaChatAuth } from './auth.ts'
import { type InlineImage, toGigaChatRequest, toOpenAIChunks, toOpenAICompletion } from './translate.ts'
import { type Attached, UploadCache, uploadImage } from './upload.ts'

/** The API refused the access token: the adapter exchanges a new one and retries once. */
class TokenRefused extends UpstreamFailed {}

/** GigaChat's error bodies: {status, message} (the OAuth endpoint's: {code, message}). */
function gigaChatError(body: string): string {
  try {
    const parsed = JSON.parse(body) as { message?: unknown; error?: { message?: unknown } }
    const m = parsed?.message ?? parsed?.error?.message
    if (typeof m === 'string') return m
  } catch {
    // the text
  }
  return body.slice(0, 4096)
}

/**
 * 400 and 422 are the request refused (the client's 400, cleaned); 401 is the token refused (one
 * refresh-and-retry, then failover); 429, 5xx and the other statuses fail the node over.
 */
function classify(call: UpstreamCall, status: number, body: string): Error {
  if (status === 401)
    return new TokenRefused(`${call.route.node} refused the access token`, 'upstream_error', 401)
  if (status === 400 || status === 422 || status === 413 || status === 415) {
    const message = gigaChatError(body)
    return new UpstreamRejected(
      `upstream rejected the request: ${cleanUpstreamMessage(message)}`,
      status === 413 ? 413 : 400,
      null,
      message.slice(0, 4096),
    )
  }
  return new UpstreamFailed(`${call.route.node} answered ${status}`, 'upstream_error', status)
}

/**
 * Sber's GigaChat: an OAuth token (auth.ts) as Bearer, chat with `functions` for tools, its SSE
 * translated into OpenAI's chunks, and embeddings. See README.md.
 */
export class GigaChatAdapter implements UpstreamAdapter {
  readonly auth = new GigaChatAuth()
  /** The ids of images uploaded to GigaChat's storage, per account and content (upload.ts). */
  readonly uploads = new UploadCache()

  constructor(private readonly watchdog: Watchdog) {}

  async send(
    call: UpstreamCall,
    controller: AbortController,
    headersDeadlineMs: number,
  ): Promise<UpstreamReply> {
    const body = internalBody(call)
    const images: InlineImage[] = []
    const gigaRequest =
      call.path === '/embeddings' ? embeddingsRequest(body) : toGigaChatRequest(body, images)
    // Without images the body is the same for every try: serialized once.
    let upstreamBody = JSON.stringify(gigaRequest)
    const request = async (token: string) =>
      sendHttp(
        call,
        {
          url: `${call.route.baseUrl}${call.path}`,
          headers: {
            ...call.route.headers,
            'content-type': 'application/json',
            accept: call.stream ? 'text/event-stream' : 'application/json',
            authorization: `Bearer ${token}`,
          },
          body: upstreamBody,
        },
        controller,
        headersDeadlineMs,
        this.watchdog,
        classify,
      )
    // Waiting for a token counts against the headers deadline, as the request itself does.
    const token = async () => {
      const d = this.watchdog.watch(headersDeadlineMs, () =>
        controller.abort(new UpstreamTimeout(`${call.route.node}: no GigaChat access token in time`)),
      )
      try {
        return await this.auth.token(call.route, controller.signal)
      } finally {
        this.watchdog.clear(d)
      }
    }
    let current = await token()
    let refreshed = false
    let reuploaded = false
    let reply: UpstreamReply
    for (;;) {
      let attached: Attached | undefined
      try {
        if (images.length > 0) {
          attached = await this.attach(call, images, current, controller, headersDeadlineMs, reuploaded)
          upstreamBody = JSON.stringify(gigaRequest)
        }
        reply = await request(current)
        break
      } catch (err) {
        if (err instanceof TokenRefused && !refreshed) {
          // The token expired early or was revoked: one new exchange (shared), one retry.
          refreshed = true
          this.auth.invalidate(call.route, current)
          current = await token()
          continue
        }
        if (
          attached &&
          attached.fromCache.length > 0 &&
          !reuploaded &&
          (err instanceof UpstreamRejected || (err instanceof UpstreamFailed && err.upstreamStatus === 404))
        ) {
          // A remembered file may be gone from the storage (deleted, or expired): the chat is
          // sent once more with the images uploaded anew.
          for (const key of attached.fromCache) this.uploads.delete(key)
          reuploaded = true
          continue
        }
        throw err
      }
    }
    const { response } = reply
    const node = call.route.node
    const translated =
      call.path === '/embeddings'
        ? translatedJson(async () => embeddingsReply(await readJson(response, node), body))
        : call.stream
          ? streamReply(response, body.model, node)
          : translatedJson(async () => toOpenAICompletion(await readJson(response, node), body.model))
    return { response: translated, abort: reply.abort }
  }

  /**
   * Puts each image's file id in its message's `attachments`: remembered from an earlier upload
   * of the same content to the same account, or uploaded now (in parallel). `fresh`: every image
   * is uploaded, none taken from the cache.
   */
  private async attach(
    call: UpstreamCall,
    images: InlineImage[],
    token: string,
    controller: AbortController,
    headersDeadlineMs: number,
    fresh: boolean,
  ): Promise<Attached> {
    const attached: Attached = { fromCache: [], uploads: 0 }
    // The same image twice in one request (a conversation quoting it again) is uploaded once.
    const pending = new Map<string, Promise<string>>()
    const upload = (key: string, image: InlineImage) => {
      let p = pending.get(key)
      if (!p) {
        p = uploadImage(call, image, token, controller, headersDeadlineMs, this.watchdog, classify).then(
          (id) => {
            this.uploads.set(key, id)
            attached.uploads++
            return id
          },
        )
        pending.set(key, p)
      }
      return p
    }
    await Promise.all(
      images.map(async (image) => {
        const key = this.uploads.key(call.route, image)
        let id = fresh ? undefined : this.uploads.get(key)
        if (id) attached.fromCache.push(key)
        else id = await upload(key, image)
        image.message.attachments = [id]
      }),
    )
    return attached
  }
}

/** The largest non-streamed reply read (a long completion, or many embedding vectors). */
const MAX_REPLY_BYTES = 64 * 1024 * 1024

async function readJson(response: Response, node: string): Promise<Record<string, unknown>> {
  const text = await readCapped(response, MAX_REPLY_BYTES)
  try {
    const v = JSON.parse(text) as unknown
    if (v && typeof v === 'object') return v as Record<string, unknown>
  } catch {
    // below
  }
  throw new UpstreamFailed(`${node} sent a reply that is not JSON`, 'upstream_error')
}

/** GigaChat's SSE, line by line, into OpenAI's chunks; the usage rides on its last chunk. */
function streamReply(response: Response, model: unknown, node: string): Response {
  const id = `chatcmpl-${randomId()}`
  const body = response.body
  if (!body) throw new UpstreamFailed(`${node} sent an empty stream`, 'upstream_error')
  const out = body.pipeThrough(lineSplitter(node)).pipeThrough(
    new TransformStream<string, Uint8Array>({
      transform(line, controller) {
        if (!line.startsWith('data:')) return
        const data = line.slice(5).trim()
        if (data === '') return
        if (data === '[DONE]') {
          controller.enqueue(SSE_DONE)
          return
        }
        let chunk: Record<string, unknown>
        try {
          chunk = JSON.parse(data) as Record<string, unknown>
        } catch {
          throw new UpstreamFailed(`${node} sent a stream event that is not JSON`, 'upstream_error')
        }
        if (!chunk || typeof chunk !== 'object') return
        if (typeof chunk.message === 'string' && chunk.choices === undefined)
          throw new UpstreamFailed(
            `${node} failed mid-stream: ${cleanUpstreamMessage(chunk.message)}`,
            'upstream_error',
          )
        for (const c of toOpenAIChunks(chunk, id, model)) controller.enqueue(sseEvent(c))
      },
    }),
  )
  return new Response(out, { status: 200, headers: { 'content-type': 'text/event-stream' } })
}

/** OpenAI's embeddings input -> GigaChat's {model, input: [texts]}. */
function embeddingsRequest(body: Record<string, unknown>): Record<string, unknown> {
  const input = body.input
  const texts = typeof input === 'string' ? [input] : input
  if (!Array.isArray(texts) || texts.some((t) => typeof t !== 'string'))
    throw new InvalidValue('GigaChat routes embed text inputs only (not token arrays)', 'input')
  return { model: body.model, input: texts }
}

function embeddingsReply(reply: Record<string, unknown>, body: Record<string, unknown>): unknown {
  const items = Array.isArray(reply.data)
    ? (reply.data as { embedding?: unknown; index?: unknown; usage?: { prompt_tokens?: unknown } }[])
    : []
  const base64 = body.encoding_format === 'base64'
  let tokens = 0
  let counted = true
  const data = items.map((item, i) => {
    const p = item.usage?.prompt_tokens
    if (typeof p === 'number') tokens += p
    else counted = false
    const vector = Array.isArray(item.embedding) ? (item.embedding as number[]) : []
    return {
      object: 'embedding',
      index: typeof item.index === 'number' ? item.index : i,
      embedding: base64 ? floatsToBase64(vector) : vector,
    }
  })
  return {
    object: 'list',
    data,
    model: body.model,
    // Without a count for every item, no usage: Tropa counts itself.
    ...(counted && items.length > 0 && { usage: { prompt_tokens: tokens, total_tokens: tokens } }),
  }
}
