import { InvalidValue, UpstreamFailed } from '../../../errors.ts'
import type { UpstreamAdapter, UpstreamCall, UpstreamReply } from '../../adapter.ts'
import type { Watchdog } from '../../watchdog.ts'
import { classifyStatus, NODE_FAILURE, openAIError, sendHttp } from '../http.ts'
import { AnthropicStreamTranslator, toChatCompletion } from './reply.ts'
import { toAnthropicRequest } from './request.ts'

/**
 * The Messages API version requests name unless the route's api_version says otherwise: the one
 * that still takes temperature and top_p (2026-10-21 removed them; on it they are dropped).
 */
export const ANTHROPIC_VERSION = '2023-06-01'
/** The largest non-streamed message read (the answer is bounded by max_tokens anyway). */
const MAX_MESSAGE_BYTES = 32 * 1024 * 1024

/**
 * Anthropic's statuses that say the node (its key, its account, its capacity) failed: auth (401),
 * permission (403), billing (402), rate limit (429), and every 5xx incl. 529 overloaded.
 */
const NODE_FAILURES: ReadonlySet<number> = new Set([...NODE_FAILURE, 402])
// Anthropic's error body `{"type":"error","error":{"type","message"}}` reads as OpenAI's does.
const classify = classifyStatus(openAIError, NODE_FAILURES)

const encoder = new TextEncoder()
/** Upstream bytes translated to nothing (pings) after which a stream lets the event loop turn. */
const SILENT_YIELD_BYTES = 256 * 1024

/**
 * Anthropic's Messages API (POST <base_url>/v1/messages). The OpenAI chat body is translated
 * (request.ts), and the message or its SSE events translated back into OpenAI's form (reply.ts),
 * so the pipeline sees an OpenAI-compatible reply. Anthropic has no embeddings.
 */
export class AnthropicAdapter implements UpstreamAdapter {
  constructor(private readonly watchdog: Watchdog) {}

  async send(
    call: UpstreamCall,
    controller: AbortController,
    headersDeadlineMs: number,
  ): Promise<UpstreamReply> {
    if (call.path !== '/chat/completions')
      throw new InvalidValue('Anthropic models have no embeddings', 'model')
    const version = call.route.apiVersion ?? ANTHROPIC_VERSION
    const request = JSON.parse(call.body) as Record<string, unknown>
    const body = JSON.stringify(toAnthropicRequest(request, call.stream, version < '2026-10-21'))
    const headers: Record<string, string> = {
      ...call.route.headers,
      'content-type': 'application/json',
      accept: call.stream ? 'text/event-stream' : 'application/json',
      'anthropic-version': version,
    }
    if (call.route.apiKey) headers['x-api-key'] = call.route.apiKey
    const reply = await sendHttp(
      call,
      { url: `${call.route.baseUrl}/v1/messages`, headers, body },
      controller,
      headersDeadlineMs,
      this.watchdog,
      classify,
    )
    const upstream = reply.response.body
    if (!upstream) throw new UpstreamFailed(`${call.route.node} sent an empty response`)
    const translated = call.stream ? translateStream(upstream) : translateMessage(upstream, call.route.node)
    return {
      response: new Response(translated, {
        status: 200,
        headers: { 'content-type': call.stream ? 'text/event-stream' : 'application/json' },
      }),
      abort: reply.abort,
    }
  }
}

/**
 * The message as a chat.completion, produced when the pipeline reads the body (under its own
 * deadline, which aborts the upstream read too).
 */
function translateMessage(upstream: ReadableStream<Uint8Array>, node: string): ReadableStream<Uint8Array> {
  const reader = upstream.getReader()
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const decoder = new TextDecoder()
      let text = ''
      let size = 0
      for (;;) {
        const { done, value } = await reader.read()
        if (done) break
        size += value.byteLength
        if (size > MAX_MESSAGE_BYTES) {
          await reader.cancel().catch(() => {})
          throw new UpstreamFailed(`${node} sent a message larger than ${MAX_MESSAGE_BYTES} bytes`)
        }
        text += decoder.decode(value, { stream: true })
      }
      text += decoder.decode()
      let message: Record<string, unknown>
      try {
        message = JSON.parse(text) as Record<string, unknown>
      } catch {
        throw new UpstreamFailed(`${node} sent a malformed message`)
      }
      if (!message || typeof message !== 'object' || message.type !== 'message')
        throw new UpstreamFailed(`${node} sent something other than a message`)
      controller.enqueue(encoder.encode(JSON.stringify(toChatCompletion(message))))
      controller.close()
    },
    cancel(reason) {
      return reader.cancel(reason).catch(() => {})
    },
  })
}

/** The SSE events as OpenAI chunks, one upstream read at a time (pulled by the relay). */
function translateStream(upstream: ReadableStream<Uint8Array>): ReadableStream<Uint8Array> {
  const reader = upstream.getReader()
  const t = new AnthropicStreamTranslator()
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        // Until something is sent: pings and block stops translate to nothing, and a pull that
        // enqueues nothing would not be called again. Reads of buffered data resolve without a
        // turn of the event loop: a flood of such events yields every SILENT_YIELD_BYTES.
        let silent = 0
        for (;;) {
          if (silent > SILENT_YIELD_BYTES) {
            silent = 0
            await new Promise((resolve) => setImmediate(resolve))
          }
          const { done, value } = await reader.read()
          if (done) {
            const rest = t.end()
            if (rest.length > 0) controller.enqueue(encoder.encode(rest))
            controller.close()
            return
          }
          const out = t.push(value)
          silent += value.byteLength
          if (out.length > 0) {
            controller.enqueue(encoder.encode(out))
            if (t.finished) {
              // message_stop or an error: the client's stream ends here; the upstream's end is
              // read (a few bytes, bounded) so that its connection can serve another request.
              controller.close()
              void drain(reader)
            }
            return
          }
        }
      },
      cancel(reason) {
        return reader.cancel(reason).catch(() => {})
      },
    },
    { highWaterMark: 0 },
  )
}

/** Reads what an upstream sends after its last event (a few KiB, a few seconds at most), then lets it go. */
async function drain(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<void> {
  let left = 64 * 1024
  const timer = setTimeout(() => void reader.cancel().catch(() => {}), 5_000)
  try {
    while (left > 0) {
      const { done, value } = await reader.read()
      if (done) return
      left -= value.byteLength
    }
    await reader.cancel()
  } catch {
    // gone already
  } finally {
    clearTimeout(timer)
  }
}
