import { UpstreamFailed } from '../../../errors.ts'
import type { UpstreamAdapter, UpstreamCall, UpstreamReply } from '../../adapter.ts'
import type { Watchdog } from '../../watchdog.ts'
import { classifyStatus, internalBody, openAIError, sendHttp } from '../http.ts'
import { toBatchEmbed, toGenerateContent } from './request.ts'
import { lazyJson, readAll, toChatCompletion, toEmbeddingList, translateStream } from './response.ts'

/** A whole (non-streamed) reply larger than this is a broken node, not an answer. */
const MAX_REPLY_BYTES = 64 * 1024 * 1024

/**
 * Google's Gemini API (generativelanguage.googleapis.com): generateContent,
 * streamGenerateContent?alt=sse and batchEmbedContents under /v1beta/models/<model>, the key in
 * `x-goog-api-key`. The OpenAI body is translated in (request.ts), the reply and the stream back
 * into OpenAI's form (response.ts), so the pipeline relays and bills it as any other.
 */
export class GeminiAdapter implements UpstreamAdapter {
  constructor(private readonly watchdog: Watchdog) {}

  async send(
    call: UpstreamCall,
    controller: AbortController,
    headersDeadlineMs: number,
  ): Promise<UpstreamReply> {
    const body = internalBody(call)
    const model = call.route.upstreamModel
    const root = `${call.route.baseUrl}/v1beta/models/${encodeURIComponent(model)}`
    const headers: Record<string, string> = {
      ...call.route.headers,
      'content-type': 'application/json',
      accept: call.stream ? 'text/event-stream' : 'application/json',
    }
    if (call.route.apiKey) headers['x-goog-api-key'] = call.route.apiKey
    const embed = call.path === '/embeddings'
    const request = embed
      ? { url: `${root}:batchEmbedContents`, headers, body: JSON.stringify(toBatchEmbed(body, model)) }
      : {
          url: `${root}:${call.stream ? 'streamGenerateContent?alt=sse' : 'generateContent'}`,
          headers,
          body: JSON.stringify(toGenerateContent(body)),
        }
    const reply = await sendHttp(call, request, controller, headersDeadlineMs, this.watchdog, classifyGemini)
    const upstream = reply.response.body
    const cancel = (reason: unknown) => {
      upstream?.cancel(reason).catch(() => {})
    }
    let response: Response
    if (call.stream) {
      if (!upstream) throw new UpstreamFailed(`${call.route.node} sent an empty stream`)
      response = new Response(translateStream(upstream, model), {
        status: 200,
        headers: { 'content-type': 'text/event-stream' },
      })
    } else if (embed) {
      const base64 = body.encoding_format === 'base64'
      response = lazyJson(
        async () => toEmbeddingList(await readAll(upstream, MAX_REPLY_BYTES), model, base64),
        cancel,
      )
    } else {
      response = lazyJson(
        async () => toChatCompletion(await readAll(upstream, MAX_REPLY_BYTES), model),
        cancel,
      )
    }
    return { response, abort: reply.abort }
  }
}

const classify = classifyStatus(geminiError)

/**
 * Gemini's errors: `{"error":{"code","message","status","details"}}`. A wrong key is a 400
 * (INVALID_ARGUMENT with reason API_KEY_INVALID) and an unsupported region a 400
 * FAILED_PRECONDITION: the node's configuration, not the client's request, so they fail over
 * (and are logged) like 401/403/429/5xx; any other 4xx is the request refused.
 */
export function classifyGemini(call: UpstreamCall, status: number, body: string): Error {
  if (status === 400 && nodeProblem(body))
    return new UpstreamFailed(
      `${call.route.node} refused its credentials or location (400)`,
      'upstream_error',
      status,
      geminiError(body).message.slice(0, 1024),
    )
  return classify(call, status, body)
}

function nodeProblem(body: string): boolean {
  try {
    const e = (JSON.parse(body) as { error?: { status?: unknown; details?: unknown } })?.error
    if (
      e?.status === 'FAILED_PRECONDITION' ||
      e?.status === 'UNAUTHENTICATED' ||
      e?.status === 'PERMISSION_DENIED'
    )
      return true
    // google.rpc.ErrorInfo: API_KEY_INVALID, API_KEY_EXPIRED, ...
    return (
      Array.isArray(e?.details) &&
      e.details.some((d) => {
        const reason = (d as { reason?: unknown })?.reason
        return typeof reason === 'string' && reason.startsWith('API_KEY_')
      })
    )
  } catch {
    return false
  }
}

function geminiError(body: string): { message: string; param: unknown } {
  return { message: openAIError(body).message, param: undefined }
}
