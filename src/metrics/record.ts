import type { Attempt } from '../routing/policy.ts'

/** The model endpoints whose requests are measured (the `endpoint` label), by index. */
export const ENDPOINTS = [
  '/v1/chat/completions',
  '/v1/completions',
  '/v1/responses',
  '/v1/messages',
  '/v1/embeddings',
] as const

/** `tropa_requests_total`'s outcome label, by index. */
export const OUTCOMES = [
  'ok',
  'client_error',
  'upstream_error',
  'limit',
  'rate_limited',
  'cancelled',
] as const
export const OK = 0
const CLIENT_ERROR = 1
const UPSTREAM_ERROR = 2
const LIMIT = 3
const RATE_LIMITED = 4
const CANCELLED = 5

/** The `status` label: the class of the HTTP status, by index. */
export const STATUS_CLASSES = ['2xx', '4xx', '5xx'] as const

/**
 * The endpoint index of a POST to a model endpoint, else -1. Reads the path in place (no URL
 * object per request): the character after `/v1/` names the one candidate, checked whole once.
 */
export function endpointOf(method: string, url: string): number {
  if (method !== 'POST') return -1
  const at = url.indexOf('/', url.indexOf('//') + 2)
  if (at < 0) return -1
  let i: number
  switch (url.charCodeAt(at + 4)) {
    case 99 /* c */:
      i = url.charCodeAt(at + 5) === 104 /* h */ ? 0 : 1
      break
    case 114 /* r */:
      i = 2
      break
    case 109 /* m */:
      i = 3
      break
    case 101 /* e */:
      i = 4
      break
    default:
      return -1
  }
  const path = ENDPOINTS[i]!
  if (!url.startsWith(path, at)) return -1
  // The exact path, or with a query; not a longer path (/v1/messages/count_tokens).
  const end = at + path.length
  return end === url.length || url.charCodeAt(end) === 63 /* ? */ ? i : -1
}

/** The outcome of a request answered with an error status. */
export function outcomeOfStatus(status: number): number {
  if (status < 400) return OK
  if (status === 402) return LIMIT
  if (status === 429) return RATE_LIMITED
  if (status === 499) return CANCELLED
  return status >= 500 ? UPSTREAM_ERROR : CLIENT_ERROR
}

/** The outcome of a stream, from the relay's own words for how it ended. */
export function outcomeOfStream(ended: string): number {
  if (ended === 'ok') return OK
  if (ended === 'client_disconnected' || ended === 'client_stalled') return CANCELLED
  return UPSTREAM_ERROR
}

export function statusClass(status: number): number {
  return status < 400 ? 0 : status < 500 ? 1 : 2
}

/** How the winning upstream attempt went (pipeline/dispatch.ts fills it in). */
export interface Answered {
  readonly attempt: Attempt
  /** performance.now() when the first attempt's request left. */
  readonly sentAt: number
  /** performance.now() of the answer's first byte (a stream's first chunk; a JSON reply's headers). */
  readonly firstByteAt: number
  /** Nodes tried, the winner included. */
  readonly tried: number
  readonly hedged: boolean
}

/** Told when a first token came and when a request is over (Telemetry). */
export interface RecordOwner {
  firstToken(rec: RequestRecord): void
  complete(rec: RequestRecord): void
}

/** Embeddings have no first token: their answer is of no use before the whole of it. */
const EMBEDDINGS = ENDPOINTS.indexOf('/v1/embeddings')

/**
 * What is known about one request to a model endpoint, filled in by the pipeline as it learns it
 * and read once when the request ends (metrics, access log). One object per request; the
 * pipeline's calls are plain field writes.
 */
export class RequestRecord {
  model: string | undefined
  orgId: string | undefined
  keyId: string | undefined
  node: string | undefined
  /** The winning attempt (the routing decision, for x-tropa-explain). */
  attempt: Attempt | undefined
  tried = 0
  hedged = false
  stream = false
  /** From the request's arrival to the answer's first byte from the upstream, ms. */
  ttftMs: number | undefined
  /** Time spent waiting on upstreams, ms (from sending to the accepted reply). */
  upstreamMs = 0
  /** The router's own time up to the response's headers, ms (set when an upstream answered). */
  overheadMs: number | undefined
  /** The mean gap between tokens of a stream, ms. */
  itlMs: number | undefined
  promptTokens = 0
  completionTokens = 0
  cachedTokens = 0
  costNano = 0n
  status = 0
  outcome = OK
  responded = false
  /** A stream's end, as the relay tells it (undefined until it ended). */
  streamEnded: string | undefined
  done = false
  /** Its slot among the open records (Telemetry's SlotTable), -1 once closed. */
  slot = -1
  /** The request asked for x-tropa-explain. */
  explain = false
  /** The parsed request body, kept only while bodies are captured for someone (access_log.capture_*). */
  requestBody: unknown
  /** The JSON answer's text, read from a copy when this request's bodies are captured. */
  responseText: string | undefined

  constructor(
    private readonly owner: RecordOwner,
    readonly id: string,
    /** Index into ENDPOINTS. */
    readonly endpoint: number,
    /** performance.now() at the request's arrival. */
    readonly startedAt: number,
  ) {}

  /** The request was admitted to a model (before money is reserved: a 402 has its model). */
  call(model: string, orgId: string, keyId: string): void {
    this.model = model
    this.orgId = orgId
    this.keyId = keyId
  }

  /** An upstream answered (a stream's first chunk, or a whole JSON reply). */
  answered(a: Answered, nodeName: string, stream: boolean, acceptedAt: number): void {
    this.node = nodeName
    this.attempt = a.attempt
    this.tried += a.tried
    this.hedged ||= a.hedged
    this.stream = stream
    this.ttftMs = a.firstByteAt - this.startedAt
    this.upstreamMs += acceptedAt - a.sentAt
    if (this.endpoint !== EMBEDDINGS) this.owner.firstToken(this)
  }

  /** What was billed (may come after the stream's last byte, never after its end is told). */
  settled(promptTokens: number, completionTokens: number, cachedTokens: number, costNano: bigint): void {
    this.promptTokens = promptTokens
    this.completionTokens = completionTokens
    this.cachedTokens = cachedTokens
    this.costNano = costNano
  }

  /** The relay finished the stream; first and last chunk times are Date.now() ms. */
  ended(how: string, firstChunkAtMs: number, lastChunkAtMs: number): void {
    if (this.streamEnded !== undefined) return
    this.streamEnded = how
    if (this.completionTokens > 1 && lastChunkAtMs > firstChunkAtMs)
      this.itlMs = (lastChunkAtMs - firstChunkAtMs) / (this.completionTokens - 1)
    if (this.responded) this.owner.complete(this)
  }
}
