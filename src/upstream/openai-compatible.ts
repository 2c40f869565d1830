import { UpstreamFailed, UpstreamRejected, UpstreamTimeout, UpstreamUnreachable } from '../errors.ts'
import type { UpstreamAdapter, UpstreamCall, UpstreamReply } from './adapter.ts'
import { cleanUpstreamMessage, cleanUpstreamParam } from './redact.ts'
import type { Watchdog } from './watchdog.ts'

/** Statuses that say the node (not the request) failed: another node may well succeed. */
const NODE_FAILURE = new Set([401, 403, 404, 408, 409, 425, 429])

/**
 * vLLM, llama.cpp's server, Ollama, OpenAI and anything else speaking OpenAI's HTTP API.
 * Bun's fetch keeps connections alive and pools them per host.
 */
export class OpenAICompatibleAdapter implements UpstreamAdapter {
  constructor(private readonly watchdog: Watchdog) {}

  async send(
    call: UpstreamCall,
    controller: AbortController,
    headersDeadlineMs: number,
  ): Promise<UpstreamReply> {
    const signal = controller.signal
    if (signal.aborted) throw signal.reason
    const deadline = this.watchdog.watch(headersDeadlineMs, () =>
      controller.abort(new UpstreamTimeout(`${call.route.node} sent no response headers in time`)),
    )
    const headers: Record<string, string> = {
      'content-type': 'application/json',
      accept: call.stream ? 'text/event-stream' : 'application/json',
    }
    if (call.route.apiKey) headers.authorization = `Bearer ${call.route.apiKey}`
    let response: Response
    try {
      response = await fetch(`${call.route.baseUrl}${call.path}`, {
        method: 'POST',
        headers,
        body: call.body,
        signal,
        decompress: true,
      })
    } catch (err) {
      if (signal.aborted) throw signal.reason
      // The raw fetch text (socket errors, Bun's hints) is for logs, not for clients. A refused
      // connection never reached the node; other errors (a reset) may have.
      if ((err as { code?: string }).code === 'ECONNREFUSED')
        throw new UpstreamUnreachable(call.route.node, (err as Error).message)
      throw new UpstreamFailed(
        `upstream node ${call.route.node} could not be reached`,
        'upstream_error',
        null,
        (err as Error).message,
      )
    } finally {
      this.watchdog.clear(deadline)
    }
    if (!response.ok) {
      // The error body is read under its own deadline and size cap, with the abort still wired:
      // an upstream that stalls after a 5xx header must not hold the request.
      const d = this.watchdog.watch(Date.now() + 5_000, () =>
        controller.abort(new UpstreamTimeout(`${call.route.node} stalled in its error response`)),
      )
      let text = ''
      try {
        text = await readCapped(response, 64 * 1024)
      } catch {
        // classified by status alone
      } finally {
        this.watchdog.clear(d)
      }
      if (signal.aborted && !(signal.reason instanceof UpstreamTimeout)) throw signal.reason
      throw classify(call, response.status, text)
    }
    return { response, abort: (reason) => controller.abort(reason) }
  }
}

/** At most `cap` bytes of a body as text; the rest is not read. */
async function readCapped(response: Response, cap: number): Promise<string> {
  const reader = response.body?.getReader()
  if (!reader) return ''
  const decoder = new TextDecoder()
  let text = ''
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    text += decoder.decode(value, { stream: true })
    if (size >= cap) {
      await reader.cancel().catch(() => {})
      break
    }
  }
  return text
}

function classify(call: UpstreamCall, status: number, body: string): Error {
  if (status >= 500 || NODE_FAILURE.has(status))
    return new UpstreamFailed(`${call.route.node} answered ${status}`, 'upstream_error', status)
  // The upstream refused this request itself (a bad tool schema, say): another node would too.
  // Its message reaches the client cleaned of credentials and paths; the original, the log.
  const { message, param } = upstreamError(body)
  return new UpstreamRejected(
    `upstream rejected the request: ${cleanUpstreamMessage(message)}`,
    status,
    cleanUpstreamParam(param),
    message.slice(0, 4096),
  )
}

/** The message and param of an upstream's error body (OpenAI's shape, a bare string, or text). */
export function upstreamError(body: string): { message: string; param: unknown } {
  try {
    const parsed = JSON.parse(body) as {
      error?: { message?: unknown; param?: unknown } | string
      message?: unknown
    }
    const e = parsed?.error
    const m = typeof e === 'string' ? e : (e?.message ?? parsed?.message)
    if (typeof m === 'string') return { message: m, param: typeof e === 'object' ? e?.param : undefined }
  } catch {
    // not JSON: the text
  }
  return { message: body.slice(0, 4096), param: undefined }
}
