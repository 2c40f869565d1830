import { type Context, ROOT_CONTEXT, SpanKind, type Tracer, trace } from '@opentelemetry/api'
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http'
import { resourceFromAttributes } from '@opentelemetry/resources'
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BasicTracerProvider,
  BatchSpanProcessor,
  ParentBasedSampler,
  type Sampler,
  TraceIdRatioBasedSampler,
} from '@opentelemetry/sdk-trace-base'
import type { Config } from '../config/load.ts'
import { RequestTrace } from './span.ts'

/** Traces of requests, exported over OTLP/HTTP; built only when tracing is configured. */
export class Tracing {
  private readonly provider: BasicTracerProvider
  private readonly tracer: Tracer

  constructor(cfg: NonNullable<Config['tracing']>, version: string) {
    this.provider = new BasicTracerProvider({
      resource: resourceFromAttributes({ 'service.name': cfg.serviceName, 'service.version': version }),
      sampler: samplerOf(cfg.sampler, cfg.samplerArg),
      spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: cfg.endpoint }))],
    })
    this.tracer = this.provider.getTracer('tropa', version)
  }

  /** When each request arrived (app.ts notes it), for the root span and the auth span. */
  private readonly arrivals = new WeakMap<Request, number>()

  arrived(request: Request): void {
    this.arrivals.set(request, Date.now())
  }

  /**
   * A request's trace: its root span from the request's arrival (a child of the client's
   * `traceparent` when it sent one), and the auth span (credentials and body checked) up to now.
   */
  begin(request: Request, name: string, attributes: Record<string, string>): RequestTrace {
    const arrivedMs = this.arrivals.get(request) ?? Date.now()
    const header = request.headers.get('traceparent')
    const parent = header ? parentContext(header) : ROOT_CONTEXT
    const root = this.tracer.startSpan(
      name,
      { kind: SpanKind.SERVER, startTime: arrivedMs, attributes },
      parent,
    )
    const t = new RequestTrace(this.tracer, root)
    t.child('auth', undefined, arrivedMs).end()
    return t
  }

  /**
   * A batch line's trace: a root span of its own (a line is no client's request; its batch id and
   * line link it to the batch), and the W3C `traceparent` that continues it upstream.
   */
  line(attributes: Record<string, string | number>): { trace: RequestTrace; traceparent: string } {
    const root = this.tracer.startSpan('batch line', { kind: SpanKind.CLIENT, attributes }, ROOT_CONTEXT)
    const sc = root.spanContext()
    return {
      trace: new RequestTrace(this.tracer, root),
      traceparent: `00-${sc.traceId}-${sc.spanId}-0${sc.traceFlags & 1}`,
    }
  }

  /** Sends what is buffered (a graceful stop). */
  async shutdown(): Promise<void> {
    await this.provider.shutdown()
  }

  async flush(): Promise<void> {
    await this.provider.forceFlush()
  }
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/

/** The client's W3C trace context, when its `traceparent` is well formed (else a new trace). */
function parentContext(header: string): Context {
  const m = TRACEPARENT.exec(header.trim())
  if (!m || /^0+$/.test(m[1]!) || /^0+$/.test(m[2]!)) return ROOT_CONTEXT
  return trace.setSpanContext(ROOT_CONTEXT, {
    traceId: m[1]!,
    spanId: m[2]!,
    traceFlags: Number.parseInt(m[3]!, 16) & 1,
    isRemote: true,
  })
}

function samplerOf(name: string, arg: number): Sampler {
  switch (name) {
    case 'always_off':
      return new AlwaysOffSampler()
    case 'traceidratio':
      return new TraceIdRatioBasedSampler(arg)
    case 'parentbased_always_off':
      return new ParentBasedSampler({ root: new AlwaysOffSampler() })
    case 'parentbased_traceidratio':
      return new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(arg) })
    case 'always_on':
      return new AlwaysOnSampler()
    default:
      return new ParentBasedSampler({ root: new AlwaysOnSampler() })
  }
}
