import type { Principal } from '../../identity/live.ts'
import type { Payer } from '../../pipeline/chat.ts'
import type { Services } from '../../services.ts'
import type { RequestTrace } from '../../tracing/span.ts'
import { payerOf } from '../auth.ts'

/** What a model endpoint's pipeline function is given: the same for every inbound API. */
export interface EndpointCall {
  readonly payer: Payer
  readonly requestId: string
  readonly signal: AbortSignal
  /** The routing session header's value (prefix affinity), when the client sent one. */
  readonly sessionHint: string | undefined
  /** Closes the client's connection soon (a stream whose client stopped reading is dropped). */
  readonly cut: () => void
  /** The request's trace (tracing on). */
  readonly trace: RequestTrace | undefined
}

/**
 * The parts of Elysia's handler context a model endpoint reads. Handlers name them (destructure)
 * rather than pass the context on whole: Elysia reads a handler's source to learn what it uses,
 * and a context passed on whole made it parse every request's cookies and query string too.
 */
export interface ModelRouteContext {
  readonly principal: Principal
  readonly request: Request
  readonly set: { headers: Record<string, unknown> }
  readonly server: { timeout(request: Request, seconds: number): void } | null
}

export interface ModelCallShape {
  /** OpenTelemetry's `gen_ai.operation.name`: chat, text_completion, embeddings. */
  readonly operation: string
  /** The inbound API (the root span's name): chat, completions, responses, messages, embeddings. */
  readonly endpoint: string
  readonly model: string
  /** The end user the body names (`user`, `metadata.user_id`), and that field's name for a 400. */
  readonly user?: string | null | undefined
  readonly userParam?: string
  /** false: the endpoint answers no dry-run quotes. */
  readonly quotes?: false
  /** A session hint of the body's own, after the routing session header (Responses' prompt_cache_key). */
  readonly sessionHint?: string | undefined
}

/**
 * Every model endpoint's handler, once: the payer (end user, dry run), the request id, the trace
 * (root span named for the endpoint, with the GenAI operation and model), and the request's
 * metrics record around the endpoint's pipeline call. A refusal ends the trace here, a billed
 * answer when it settles (a stream's end: the pipeline ends it), a quote when it is answered.
 */
export function answerModelCall(
  svc: Services,
  ctx: ModelRouteContext,
  body: unknown,
  shape: ModelCallShape,
  run: (call: EndpointCall) => Promise<Response>,
): Promise<Response> {
  const { request } = ctx
  const payer = payerOf(ctx.principal, request.headers, shape)
  const requestId = ctx.set.headers['x-request-id'] as string
  const trace = svc.tracing?.begin(request, shape.endpoint, {
    'gen_ai.operation.name': shape.operation,
    'gen_ai.request.model': shape.model,
    'tropa.request_id': requestId,
    'tropa.key_id': payer.key.id,
    'tropa.org_id': payer.org.id,
  })
  let answer: Promise<Response>
  try {
    answer = run({
      payer,
      requestId,
      signal: request.signal,
      sessionHint: request.headers.get(svc.config.routing.sessionHeader) ?? shape.sessionHint,
      cut: cutter(ctx.server, request),
      trace,
    })
  } catch (err) {
    answer = Promise.reject(err)
  }
  return headersOnAnswer(
    svc.telemetry.answered(
      requestId,
      trace
        ? answer.then(
            (res) => {
              if (payer.quoteOnly) trace.end({ 'tropa.quote': true })
              return res
            },
            (err) => {
              trace.end(undefined, err)
              throw err
            },
          )
        : answer,
      body,
    ),
    ctx.set,
  )
}

/**
 * Closes the client's connection within a second (Bun's idle timer). Made here, not in
 * answerModelCall: a stream keeps it for its life, and a closure made there kept the handler's
 * context and the payer too.
 */
function cutter(server: ModelRouteContext['server'], request: Request): () => void {
  return () => server?.timeout(request, 1)
}

/**
 * Moves the headers set on Elysia's context (x-request-id, `connection: close` while draining)
 * onto the answer itself, its own headers first. Left on the context, they make Elysia copy the
 * whole Response (new Headers, new Response) to add them: about a tenth of a pass-through
 * request's own CPU. Headers that cannot be set stay on the context for Elysia to merge.
 */
function headersOnAnswer(answer: Promise<Response>, set: ModelRouteContext['set']): Promise<Response> {
  return answer.then((res) => {
    try {
      for (const k in set.headers) {
        if (!res.headers.has(k)) res.headers.set(k, String(set.headers[k]))
        delete set.headers[k]
      }
    } catch {
      // immutable headers: Elysia merges what is left, as before
    }
    return res
  })
}
