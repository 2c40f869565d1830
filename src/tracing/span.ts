import {
  type Context,
  context,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api'

// What the request path touches of tracing: only the API package, so nothing of the SDK is loaded
// unless tracing is configured (tracing.ts, imported then).

/** The spans of one request: the root, and its children (auth, reserve, attempts, first token, settle). */
export class RequestTrace {
  private readonly ctx: Context
  private ended = false

  constructor(
    private readonly tracer: Tracer,
    readonly root: Span,
  ) {
    this.ctx = trace.setSpan(context.active(), root)
  }

  /** A child of the root; `startMs` for one that began before it was known (auth). */
  child(name: string, attributes?: Record<string, string | number | boolean>, startMs?: number): Span {
    return this.tracer.startSpan(
      name,
      { kind: SpanKind.INTERNAL, ...(attributes && { attributes }), ...(startMs && { startTime: startMs }) },
      this.ctx,
    )
  }

  /** A child for one upstream attempt, and the W3C `traceparent` that continues it upstream. */
  attempt(attributes: Record<string, string | number | boolean>): { span: Span; traceparent: string } {
    const span = this.tracer.startSpan('upstream attempt', { kind: SpanKind.CLIENT, attributes }, this.ctx)
    const sc = span.spanContext()
    return { span, traceparent: `00-${sc.traceId}-${sc.spanId}-0${sc.traceFlags & 1}` }
  }

  /** Ends the root once; an error sets its status. */
  end(attributes?: Record<string, string | number | boolean>, error?: unknown): void {
    if (this.ended) return
    this.ended = true
    if (attributes) this.root.setAttributes(attributes)
    if (error !== undefined) fail(this.root, error)
    this.root.end()
  }
}

/** Marks a span failed with the error's code and message. */
export function fail(span: Span, error: unknown): void {
  const e = error as { code?: unknown; message?: unknown; status?: unknown }
  span.setStatus({
    code: SpanStatusCode.ERROR,
    message: typeof e?.message === 'string' ? e.message : String(error),
  })
  if (typeof e?.code === 'string') span.setAttribute('error.type', e.code)
  if (typeof e?.status === 'number') span.setAttribute('http.response.status_code', e.status)
}
