import { formatRub } from '../billing/money.ts'
import { SlotTable } from '../slot-table.ts'
import { redactCredentials } from '../upstream/redact.ts'
import type { AccessLog } from './access-log.ts'
import { ENDPOINTS, endpointOf, OUTCOMES, outcomeOfStatus, outcomeOfStream, RequestRecord } from './record.ts'
import { RequestMetrics, type RequestMetricsOptions } from './request-metrics.ts'

/** Response header: the router's own time on this request, ms. */
export const OVERHEAD_HEADER = 'x-tropa-overhead-ms'
/** Request header `x-tropa-explain: 1` asks for a response header of the same name: why that node. */
export const EXPLAIN_HEADER = 'x-tropa-explain'

/** Whose request and response bodies go into their access log lines (access_log.capture_*). */
export interface CaptureOptions {
  readonly captureOrgs: readonly string[]
  readonly captureKeys: readonly string[]
  readonly captureMaxChars: number
}

/**
 * The request lifecycle as the operator sees it: a record per request to a model endpoint, opened
 * when the request arrives (by its request id), filled in by the pipeline, closed once, when the
 * response (or the stream) is over, into the metrics and the access log.
 */
export class Telemetry {
  readonly metrics: RequestMetrics
  /**
   * The open records, and each one's slot by request id (a SlotTable and a Map to numbers: a Map
   * of records, turned over every request, made each young collection mark dropped records again).
   */
  private readonly open = new SlotTable<RequestRecord>()
  private readonly slotOf = new Map<string, number>()
  /** Records go into the metrics (metrics.requests). */
  private readonly metered: boolean
  /** Undefined unless someone's bodies are captured (then requests keep their body until they end). */
  private readonly capture:
    | { orgs: ReadonlySet<string>; keys: ReadonlySet<string>; maxChars: number }
    | undefined

  constructor(
    opts: RequestMetricsOptions,
    readonly accessLog: AccessLog | undefined,
    /** The routing policy's name, for x-tropa-explain. */
    private readonly policyName: string,
    capture?: CaptureOptions,
  ) {
    this.metrics = new RequestMetrics(opts)
    this.metered = opts.requests !== false
    this.capture =
      accessLog && capture && capture.captureOrgs.length + capture.captureKeys.length > 0
        ? {
            orgs: new Set(capture.captureOrgs),
            keys: new Set(capture.captureKeys),
            maxChars: capture.captureMaxChars,
          }
        : undefined
  }

  /** Whether this request's bodies go into its access log line. */
  private captured(rec: RequestRecord): boolean {
    const c = this.capture
    return (
      c !== undefined &&
      ((rec.orgId !== undefined && c.orgs.has(rec.orgId)) ||
        (rec.keyId !== undefined && c.keys.has(rec.keyId)))
    )
  }

  /** Requests begun and not yet ended (a leak shows here). */
  get openCount(): number {
    return this.open.size
  }

  /** A request arrived; only POSTs to model endpoints get a record. */
  begin(id: string, request: Request): void {
    const endpoint = endpointOf(request.method, request.url)
    if (endpoint < 0) return
    const rec = new RequestRecord(this, id, endpoint, performance.now())
    rec.explain = request.headers.get(EXPLAIN_HEADER) === '1'
    rec.slot = this.open.add(rec)
    this.slotOf.set(id, rec.slot)
  }

  /** The request's record, for the pipeline to fill in; undefined for batch lines and others. */
  of(id: string): RequestRecord | undefined {
    const slot = this.slotOf.get(id)
    return slot === undefined ? undefined : this.open.get(slot)
  }

  /** The answer first reached the upstream: time to first token, observed at once. */
  firstToken(rec: RequestRecord): void {
    if (this.metered && rec.model !== undefined && rec.node !== undefined && rec.ttftMs !== undefined)
      this.metrics.firstToken(rec.model, rec.node, rec.ttftMs / 1000)
  }

  /**
   * Adds x-tropa-overhead-ms (and x-tropa-explain when asked) to the headers of the answer the
   * pipeline is about to make: the router's own time so far. Written into the headers' init
   * object, since setting a header on a made Response costs more than the rest of this record.
   */
  stamp(rec: RequestRecord, headers: Record<string, string>): void {
    rec.overheadMs = Math.max(0, performance.now() - rec.startedAt - rec.upstreamMs)
    headers[OVERHEAD_HEADER] = rec.overheadMs.toFixed(3)
    if (rec.explain) headers[EXPLAIN_HEADER] = this.explain(rec)
  }

  /**
   * The handler's answer: ends the record, unless a stream is still running (the relay ends it).
   * `body` is the parsed request, kept only while bodies are captured for someone.
   */
  answered(id: string, answer: Promise<Response>, body?: unknown): Promise<Response> {
    const rec = this.of(id)
    if (!rec) return answer
    if (this.capture) rec.requestBody = body
    return answer.then((res) => {
      rec.status = res.status
      rec.responded = true
      if (rec.stream && rec.streamEnded === undefined) return res
      if (!rec.stream && res.body !== null && this.captured(rec)) {
        // A copy read in the background; the client's answer goes out meanwhile.
        res
          .clone()
          .text()
          .then(
            (text) => {
              rec.responseText = text
            },
            () => {},
          )
          .finally(() => this.complete(rec))
      } else this.complete(rec)
      return res
    })
  }

  /** The request ended in an error response (the error mapper). */
  failed(id: string, status: number): void {
    const rec = this.of(id)
    if (!rec) return
    rec.status = status
    rec.responded = true
    this.complete(rec)
  }

  /** Ends a record: once, into the metrics and the access log. */
  complete(rec: RequestRecord): void {
    if (rec.done) return
    rec.done = true
    if (this.open.delete(rec.slot, rec) && this.slotOf.get(rec.id) === rec.slot) this.slotOf.delete(rec.id)
    rec.slot = -1
    const durationMs = performance.now() - rec.startedAt
    rec.outcome =
      rec.streamEnded !== undefined ? outcomeOfStream(rec.streamEnded) : outcomeOfStatus(rec.status)
    if (this.metered) this.metrics.record(rec, durationMs / 1000)
    const log = this.accessLog
    if (!log) return
    if (!this.captured(rec)) {
      log.push(accessLine(rec, durationMs))
      return
    }
    // Serialised and redacted at the next turn, off the request's path.
    const maxChars = this.capture!.maxChars
    setImmediate(() => {
      let request: string | null = null
      try {
        request = rec.requestBody === undefined ? null : bounded(JSON.stringify(rec.requestBody), maxChars)
      } catch {
        request = null
      }
      const response = rec.responseText === undefined ? null : bounded(rec.responseText, maxChars)
      log.push(accessLine(rec, durationMs, request, response))
    })
  }

  /** Why this node: the policy, its prediction for the node, the prefix it expected cached. */
  private explain(rec: RequestRecord): string {
    const a = rec.attempt
    const parts = [`node=${rec.node}`, `policy=${this.policyName}`]
    if (a?.predictedTtftMs !== undefined) parts.push(`predicted_ttft_ms=${a.predictedTtftMs.toFixed(1)}`)
    if (a) parts.push(`prefix_cached_tokens=${a.predictedCachedTokens}`)
    parts.push(`attempts=${rec.tried}`, `hedged=${rec.hedged}`)
    return parts.join('; ')
  }
}

/** A captured body: credentials redacted, cut at `maxChars`. */
function bounded(text: string, maxChars: number): string {
  const cut = text.length > maxChars
  const redacted = redactCredentials(cut ? text.slice(0, maxChars) : text)
  return cut ? `${redacted}…[cut at ${maxChars} of ${text.length} chars]` : redacted
}

/**
 * The access log's line: ids, never a credential (the key is named by its id only); the bodies,
 * redacted, when they are captured for this request.
 */
function accessLine(
  rec: RequestRecord,
  durationMs: number,
  requestBody?: string | null,
  responseBody?: string | null,
): string {
  const line = {
    time: new Date().toISOString(),
    request_id: rec.id,
    org_id: rec.orgId ?? null,
    key_id: rec.keyId ?? null,
    endpoint: ENDPOINTS[rec.endpoint],
    model: rec.model ?? null,
    node: rec.node ?? null,
    status: rec.status,
    outcome: OUTCOMES[rec.outcome],
    stream: rec.stream,
    prompt_tokens: rec.promptTokens,
    completion_tokens: rec.completionTokens,
    cached_tokens: rec.cachedTokens,
    cost_rub: formatRub(rec.costNano),
    duration_ms: round3(durationMs),
    ttft_ms: rec.ttftMs === undefined ? null : round3(rec.ttftMs),
    overhead_ms: rec.overheadMs === undefined ? null : round3(rec.overheadMs),
    attempts: rec.tried,
    hedged: rec.hedged,
  }
  return JSON.stringify(
    requestBody === undefined
      ? line
      : { ...line, request_body: requestBody, response_body: responseBody ?? null },
  )
}

const round3 = (x: number) => Math.round(x * 1000) / 1000
