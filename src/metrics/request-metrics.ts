import { NANO_PER_RUB } from '../billing/money.ts'
import {
  DURATION_BUCKETS,
  escapeLabel,
  Histogram,
  ITL_BUCKETS,
  OVERHEAD_BUCKETS,
  TTFT_BUCKETS,
} from './histogram.ts'
import { ENDPOINTS, OUTCOMES, type RequestRecord, STATUS_CLASSES, statusClass } from './record.ts'

const TOKEN_TYPES = ['prompt', 'completion', 'cached'] as const

/** The counters of one model (and one organization, when they are labelled). */
class Counters {
  /** [endpoint * OUTCOMES.length + outcome] */
  readonly requests = new Float64Array(ENDPOINTS.length * OUTCOMES.length)
  /** [prompt, completion, cached] */
  readonly tokens = new Float64Array(3)
  /** Exact; turned into float roubles only when written out. */
  billedNano = 0n
}

/** Every series of one model, made the first time the model is seen and reused after. */
class ModelSeries {
  /** [endpoint * STATUS_CLASSES.length + status class] */
  readonly duration: (Histogram | undefined)[] = []
  readonly ttft = new Map<string, Histogram>()
  readonly itl = new Histogram(ITL_BUCKETS)
  /** By organization slot (RequestMetrics.slot); slot 0 when organizations are not labelled. */
  readonly counters: (Counters | undefined)[] = []

  constructor(readonly label: string) {}

  countersOf(slot: number): Counters {
    let c = this.counters[slot]
    if (!c) {
      c = new Counters()
      this.counters[slot] = c
    }
    return c
  }
}

export interface RequestMetricsOptions {
  /** Record request metrics at all (metrics.requests). */
  readonly requests?: boolean
  /** Label requests, tokens and roubles by organization (metrics.per_org). */
  readonly perOrg: boolean
  /** Distinct organizations labelled; the rest are counted as `other` (metrics.per_org_max). */
  readonly perOrgMax: number
}

/** Slot of requests with no organization (not authenticated), and of all when per_org is off. */
const NO_ORG = 0
/** Slot of the organizations past the cap. */
const OTHER_ORG = 1

/**
 * The request-level metrics of docs/observability.md. A request's record is folded in once, when
 * it ends: one Map lookup for its model (and one for its organization when per_org is on), then
 * array indexing into series made on first use.
 */
export class RequestMetrics {
  private readonly models = new Map<string, ModelSeries>()
  /** Requests that named no catalogue model (refused before: 401, 404, a bad body). */
  private readonly none = new ModelSeries('')
  private readonly overhead = ENDPOINTS.map(() => new Histogram(OVERHEAD_BUCKETS))
  private readonly orgSlots = new Map<string, number>()
  /** Escaped org label by slot. */
  private readonly orgLabels: string[] = ['', 'other']

  constructor(private readonly opts: RequestMetricsOptions) {}

  series(model: string | undefined): ModelSeries {
    if (model === undefined) return this.none
    let s = this.models.get(model)
    if (!s) {
      // Model ids come from the catalogue only (never the client's text), so this is bounded.
      s = new ModelSeries(escapeLabel(model))
      this.models.set(model, s)
    }
    return s
  }

  /** The organization's label slot: its own up to per_org_max organizations, then `other`. */
  slot(orgId: string | undefined): number {
    if (!this.opts.perOrg || orgId === undefined) return NO_ORG
    const known = this.orgSlots.get(orgId)
    if (known !== undefined) return known
    if (this.orgSlots.size >= this.opts.perOrgMax) return OTHER_ORG
    const slot = this.orgLabels.length
    this.orgLabels.push(escapeLabel(orgId))
    this.orgSlots.set(orgId, slot)
    return slot
  }

  /** A request's time to first token, observed as soon as it is known. */
  firstToken(model: string, node: string, seconds: number): void {
    const s = this.series(model)
    let h = s.ttft.get(node)
    if (!h) {
      h = new Histogram(TTFT_BUCKETS)
      s.ttft.set(node, h)
    }
    h.observe(seconds)
  }

  /** Folds in a finished request. */
  record(rec: RequestRecord, durationSec: number): void {
    const s = this.series(rec.model)
    const d = rec.endpoint * STATUS_CLASSES.length + statusClass(rec.status)
    let h = s.duration[d]
    if (!h) {
      h = new Histogram(DURATION_BUCKETS)
      s.duration[d] = h
    }
    h.observe(durationSec)
    if (rec.itlMs !== undefined) s.itl.observe(rec.itlMs / 1000)
    if (rec.overheadMs !== undefined) this.overhead[rec.endpoint]!.observe(rec.overheadMs / 1000)
    const c = s.countersOf(this.slot(rec.orgId))
    c.requests[rec.endpoint * OUTCOMES.length + rec.outcome]!++
    if (rec.promptTokens > 0 || rec.completionTokens > 0) {
      c.tokens[0]! += rec.promptTokens
      c.tokens[1]! += rec.completionTokens
      c.tokens[2]! += rec.cachedTokens
      c.billedNano += rec.costNano
    }
  }

  /** The exposition of every series with something in it. */
  write(out: string[]): void {
    const all = [this.none, ...this.models.values()]
    const orgLabel = (slot: number) => (this.opts.perOrg ? `,org="${this.orgLabels[slot]}"` : '')

    out.push(
      '# HELP tropa_request_duration_seconds Requests to model endpoints, from arrival to the last byte.',
      '# TYPE tropa_request_duration_seconds histogram',
    )
    for (const s of all)
      s.duration.forEach((h, i) => {
        if (!h) return
        const endpoint = ENDPOINTS[Math.floor(i / STATUS_CLASSES.length)]
        const status = STATUS_CLASSES[i % STATUS_CLASSES.length]
        h.write(
          out,
          'tropa_request_duration_seconds',
          `endpoint="${endpoint}",model="${s.label}",status="${status}"`,
        )
      })

    out.push(
      '# HELP tropa_time_to_first_token_seconds From arrival to the first byte of the answer from the upstream (chat models).',
      '# TYPE tropa_time_to_first_token_seconds histogram',
    )
    for (const s of all)
      for (const [node, h] of s.ttft)
        h.write(out, 'tropa_time_to_first_token_seconds', `model="${s.label}",node="${escapeLabel(node)}"`)

    out.push(
      '# HELP tropa_inter_token_latency_seconds Mean gap between the tokens of a streamed answer, once per stream.',
      '# TYPE tropa_inter_token_latency_seconds histogram',
    )
    for (const s of all)
      if (s.itl.count > 0) s.itl.write(out, 'tropa_inter_token_latency_seconds', `model="${s.label}"`)

    out.push(
      "# HELP tropa_router_overhead_seconds Tropa's own time up to the response headers, upstream waits excluded.",
      '# TYPE tropa_router_overhead_seconds histogram',
    )
    this.overhead.forEach((h, i) => {
      if (h.count > 0) h.write(out, 'tropa_router_overhead_seconds', `endpoint="${ENDPOINTS[i]}"`)
    })

    out.push(
      '# HELP tropa_requests_total Requests to model endpoints by how they ended.',
      '# TYPE tropa_requests_total counter',
    )
    for (const s of all)
      s.counters.forEach((c, slot) => {
        if (!c) return
        c.requests.forEach((n, i) => {
          if (n === 0) return
          const endpoint = ENDPOINTS[Math.floor(i / OUTCOMES.length)]
          const outcome = OUTCOMES[i % OUTCOMES.length]
          out.push(
            `tropa_requests_total{endpoint="${endpoint}",model="${s.label}",outcome="${outcome}"${orgLabel(slot)}} ${n}`,
          )
        })
      })

    out.push('# HELP tropa_tokens_total Tokens billed, by type.', '# TYPE tropa_tokens_total counter')
    for (const s of all)
      s.counters.forEach((c, slot) => {
        if (!c || (c.tokens[0] === 0 && c.tokens[1] === 0)) return
        TOKEN_TYPES.forEach((type, i) => {
          out.push(`tropa_tokens_total{model="${s.label}",type="${type}"${orgLabel(slot)}} ${c.tokens[i]}`)
        })
      })

    out.push(
      '# HELP tropa_billed_rub_total Roubles charged (a float for dashboards; the ledger is the truth).',
      '# TYPE tropa_billed_rub_total counter',
    )
    for (const s of all)
      s.counters.forEach((c, slot) => {
        if (!c || (c.tokens[0] === 0 && c.tokens[1] === 0)) return
        out.push(`tropa_billed_rub_total{model="${s.label}"${orgLabel(slot)}} ${rubFloat(c.billedNano)}`)
      })
  }
}

/** Nano-roubles as a float of roubles, at the edge only (whole and fractional parts apart: exact to the float's precision). */
function rubFloat(nano: bigint): number {
  return Number(nano / NANO_PER_RUB) + Number(nano % NANO_PER_RUB) / 1e9
}
