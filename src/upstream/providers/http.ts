import {
  InvalidJson,
  UpstreamFailed,
  UpstreamRejected,
  UpstreamTimeout,
  UpstreamUnreachable,
} from '../../errors.ts'
import type { BodyReader, UpstreamCall, UpstreamReply } from '../adapter.ts'
import { H1Response, ownClientServes, upstreamPool } from '../h1.ts'
import { cleanUpstreamMessage, cleanUpstreamParam } from '../redact.ts'
import type { Watchdog } from '../watchdog.ts'

// The HTTP mechanics every provider adapter shares: one POST (a stream over Tropa's own pooled
// HTTP/1.1 client, h1.ts; a whole answer over Bun's pooled keep-alive fetch) under the headers
// deadline and the caller's abort, the error body read under its own deadline and cap, and the
// failure classified (node failure -> failover; request refused -> the client's
// 4xx). A provider adapter only says where to send what, and how to read its errors.

/** One HTTP request to an upstream, as a provider builds it. */
export interface ProviderRequest {
  readonly url: string
  readonly headers: Record<string, string>
  readonly body: string
}

/** Statuses that say the node (not the request) failed: another node may well succeed. */
export const NODE_FAILURE = new Set([401, 403, 404, 408, 409, 425, 429])

/** The message and param of an error body, in a provider's shape. */
export type ErrorReader = (body: string) => { message: string; param: unknown }

/**
 * Sends one request and returns the 2xx reply with its body unread. Throws UpstreamUnreachable,
 * UpstreamFailed, UpstreamTimeout, UpstreamRejected, or the controller's abort reason.
 */
export async function sendHttp(
  call: UpstreamCall,
  request: ProviderRequest,
  controller: AbortController,
  headersDeadlineMs: number,
  watchdog: Watchdog,
  classify: (call: UpstreamCall, status: number, body: string) => Error = classifyStatus(openAIError),
): Promise<UpstreamReply> {
  const signal = controller.signal
  if (signal.aborted) throw signal.reason
  const deadline = watchdog.watch(headersDeadlineMs, () =>
    controller.abort(new UpstreamTimeout(`${call.route.node} sent no response headers in time`)),
  )
  let response: Response | H1Response
  try {
    const headers = call.traceparent ? { ...request.headers, traceparent: call.traceparent } : request.headers
    // A stream goes over Tropa's own client (h1.ts: a third of fetch's memory per open stream);
    // a whole answer over fetch.
    response =
      call.stream && ownClientServes(request.url)
        ? await upstreamPool.post({
            url: new URL(request.url),
            headers,
            body: request.body,
            signal,
            ca: call.route.tlsCa,
          })
        : await fetch(request.url, {
            method: 'POST',
            headers,
            body: request.body,
            signal,
            decompress: true,
            ...(call.route.tlsCa !== undefined && { tls: { ca: call.route.tlsCa } }),
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
    watchdog.clear(deadline)
  }
  if (!response.ok) {
    // The error body is read under its own deadline and size cap, with the abort still wired:
    // an upstream that stalls after a 5xx header must not hold the request.
    const d = watchdog.watch(Date.now() + 5_000, () =>
      controller.abort(new UpstreamTimeout(`${call.route.node} stalled in its error response`)),
    )
    let text = ''
    try {
      text = await readCapped(response instanceof H1Response ? response.reader() : response, 64 * 1024)
    } catch {
      // classified by status alone
    } finally {
      watchdog.clear(d)
    }
    if (signal.aborted && !(signal.reason instanceof UpstreamTimeout)) throw signal.reason
    throw classify(call, response.status, text)
  }
  if (response instanceof H1Response) return new OwnReply(response)
  return { response, abort: abortWith(controller) }
}

/** A reply over Tropa's own client: its reader direct, its Response made only if asked for. */
class OwnReply implements UpstreamReply {
  /** A function of its own, as the translating adapters pass it on detached. */
  readonly abort: (reason: unknown) => void

  constructor(private readonly answer: H1Response) {
    // The answer's own abort, not the request's controller: nothing holds the controller once
    // the node has answered, where this closure over it lived as long as the stream.
    this.abort = (reason) => answer.abort(reason)
  }

  get response(): Response {
    return this.answer.response
  }

  reader(): BodyReader {
    return this.answer.reader()
  }
}

/**
 * The reply's abort, made outside sendHttp: a closure made there would keep its scope (the call
 * and the request, whose bodies carry the whole prompt) alive for as long as the stream runs.
 */
function abortWith(controller: AbortController): (reason: unknown) => void {
  return (reason) => controller.abort(reason)
}

/** At most `cap` bytes of a body as text; the rest is not read. */
export async function readCapped(source: Response | BodyReader, cap: number): Promise<string> {
  const reader = source instanceof Response ? source.body?.getReader() : source
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

/**
 * The usual classification: 5xx and the statuses of NODE_FAILURE fail the node over; any other
 * status is the request refused, its message cleaned of credentials and paths for the client
 * (the original kept for the log).
 */
export const classifyStatus =
  (read: ErrorReader, nodeFailure: ReadonlySet<number> = NODE_FAILURE) =>
  (call: UpstreamCall, status: number, body: string): Error => {
    if (status >= 500 || nodeFailure.has(status))
      return new UpstreamFailed(`${call.route.node} answered ${status}`, 'upstream_error', status)
    // The upstream refused this request itself (a bad tool schema, say): another node would too.
    const { message, param } = read(body)
    return new UpstreamRejected(
      `upstream rejected the request: ${cleanUpstreamMessage(message)}`,
      status,
      cleanUpstreamParam(param),
      message.slice(0, 4096),
    )
  }

/** The message and param of an upstream's error body (OpenAI's shape, a bare string, or text). */
export function openAIError(body: string): { message: string; param: unknown } {
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

/** The internal (OpenAI-form) request body a translating adapter maps: parsed once, here. */
export function internalBody(call: UpstreamCall): Record<string, unknown> {
  try {
    return JSON.parse(call.body) as Record<string, unknown>
  } catch {
    throw new InvalidJson()
  }
}
