import type { RouteConfig } from '../config/load.ts'
import type { BodyReader } from './h1.ts'

export type { BodyReader } from './h1.ts'

/**
 * The OpenAI endpoints Tropa calls. `/completions` (legacy) goes only to OpenAI-compatible routes
 * (pipeline/completions.ts); the other adapters translate chat and embeddings.
 */
export type UpstreamPath = '/chat/completions' | '/completions' | '/embeddings'

/** One request to one upstream node. */
export interface UpstreamCall {
  readonly route: RouteConfig
  readonly path: UpstreamPath
  /** The JSON body to send, already carrying the upstream's model name. */
  readonly body: string
  readonly stream: boolean
  /** W3C trace context continuing the request's trace upstream (only when tracing is on). */
  readonly traceparent?: string | undefined
}

/** An upstream answer whose status was 2xx; the body is still unread. */
export interface UpstreamReply {
  readonly response: Response
  /**
   * The body's reader without a web stream in between, when the reply came over Tropa's own
   * client (h1.ts: streamed calls); `response` is then made only if asked for. Read one or the other.
   */
  reader?(): BodyReader
  /** Stops the upstream request (client gone, timeout, or a hedge lost). */
  abort(reason: Error): void
}

/** A reply's body reader: its own when it has one, else its Response body's. */
export function replyReader(reply: UpstreamReply): BodyReader | undefined {
  return reply.reader ? reply.reader() : reply.response.body?.getReader()
}

/**
 * Talks to one kind of upstream server. Throws UpstreamFailed (the node failed: try another),
 * UpstreamTimeout, UpstreamRejected (the request itself was refused: do not retry) or the
 * client's abort reason.
 */
export interface UpstreamAdapter {
  /**
   * `controller` is the caller's, one per attempt: aborting it (the client left, a hedge lost, a
   * deadline passed) stops this upstream request; the adapter aborts it on its own deadlines too.
   */
  send(call: UpstreamCall, controller: AbortController, headersDeadlineMs: number): Promise<UpstreamReply>
}
