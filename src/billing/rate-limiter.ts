import { RateLimited } from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'

export const WINDOW_MS = 60_000

/**
 * Requests and tokens per minute: the key's `rpm_limit` and `tpm_limit`, then its
 * organization's, then the organization's limit for the model. `admit` counts one request of
 * `promptTokens` in each of them, or in none and throws 429 (RateLimited) with the seconds to
 * wait; it returns a promise only when it has to ask another process (nothing is delayed when
 * neither the key nor its organization has a limit). `used` adds the tokens an admitted request
 * generated. `refusal` says what `admit` would answer now, counting nothing (quotes).
 */
export interface RateLimiter {
  admit(
    key: LiveKey,
    org: LiveOrg,
    modelId: string,
    promptTokens: number,
    nowMs?: number,
  ): undefined | Promise<void>
  used(key: LiveKey, org: LiveOrg, modelId: string, completionTokens: number, nowMs?: number): void
  refusal(key: LiveKey, org: LiveOrg, modelId: string, promptTokens: number): Promise<RateLimited | null>
}

/** Whether admission has anything to count for this key and organization (a field check each). */
export const hasRateLimits = (key: LiveKey, org: LiveOrg): boolean =>
  key.rpmLimit !== null || key.tpmLimit !== null || org.rates !== null

/** One counted window: a key's, an organization's, or an organization's for one model. */
export interface Bucket {
  /** Unique across kinds: `key_…`, `org:<org id>`, `om:<org id>:<model>`. */
  readonly id: string
  readonly rpm: number | null
  readonly tpm: number | null
  /** The 429 when the requests (`rpm`) or the tokens (`tpm`) are spent. */
  readonly reached: (which: 'rpm' | 'tpm', retryAfterS: number) => RateLimited
}

/** The buckets a request counts in, in the order they are checked; empty when none is limited. */
export function bucketsOf(key: LiveKey, org: LiveOrg, modelId: string): Bucket[] {
  const out: Bucket[] = []
  if (key.rpmLimit !== null || key.tpmLimit !== null)
    out.push({
      id: key.id,
      rpm: key.rpmLimit,
      tpm: key.tpmLimit,
      reached: (which, s) => (which === 'rpm' ? rpmReached(key, s) : tpmReached(key, s)),
    })
  const rates = org.rates
  if (rates === null) return out
  if (rates.rpm !== null || rates.tpm !== null)
    out.push({
      id: `org:${org.id}`,
      rpm: rates.rpm,
      tpm: rates.tpm,
      reached: (which, s) =>
        new RateLimited(
          which === 'rpm'
            ? `rate limit of ${rates.rpm} requests per minute reached for this organization`
            : `rate limit of ${rates.tpm} tokens per minute reached for this organization`,
          s,
          'org_rate_limited',
        ),
    })
  const m = rates.forModel(modelId)
  if (m !== null && (m.rpm !== null || m.tpm !== null))
    out.push({
      id: `om:${org.id}:${modelId}`,
      rpm: m.rpm,
      tpm: m.tpm,
      reached: (which, s) =>
        new RateLimited(
          which === 'rpm'
            ? `rate limit of ${m.rpm} requests per minute reached for model ${modelId} in this organization`
            : `rate limit of ${m.tpm} tokens per minute reached for model ${modelId} in this organization`,
          s,
          'model_rate_limited',
        ),
    })
  return out
}

/** The sliding-window estimate both limiters use: the previous minute weighted by how much of it is still in view. */
export function windowWeight(nowMs: number): { startMs: number; weight: number; retryAfterS: number } {
  const startMs = nowMs - (nowMs % WINDOW_MS)
  return {
    startMs,
    weight: 1 - (nowMs - startMs) / WINDOW_MS,
    retryAfterS: Math.max(1, Math.ceil((WINDOW_MS - (nowMs - startMs)) / 1000)),
  }
}

export const rpmReached = (key: LiveKey, retryAfterS: number) =>
  new RateLimited(`rate limit of ${key.rpmLimit} requests per minute reached for this key`, retryAfterS)
export const tpmReached = (key: LiveKey, retryAfterS: number) =>
  new RateLimited(`rate limit of ${key.tpmLimit} tokens per minute reached for this key`, retryAfterS)

/** Requests and tokens in the current and previous minute of one bucket. */
class Window {
  startMs = 0
  requests = 0
  tokens = 0
  prevRequests = 0
  prevTokens = 0

  roll(nowMs: number) {
    const start = nowMs - (nowMs % WINDOW_MS)
    if (start === this.startMs) return
    const adjacent = start - this.startMs === WINDOW_MS
    this.prevRequests = adjacent ? this.requests : 0
    this.prevTokens = adjacent ? this.tokens : 0
    this.requests = 0
    this.tokens = 0
    this.startMs = start
  }
}

/**
 * Rate limits over a sliding minute (two fixed windows, weighted), in memory on this node (one
 * node; several nodes share theirs in Redis: SharedRateLimiter). Tokens count prompt tokens at
 * admission and completion tokens at settlement. A request is counted in every bucket or, when
 * one refuses it, in none.
 */
export class LocalRateLimiter implements RateLimiter {
  private readonly windows = new Map<string, Window>()

  admit(key: LiveKey, org: LiveOrg, modelId: string, promptTokens: number, nowMs = Date.now()): undefined {
    if (key.rpmLimit === null && key.tpmLimit === null && org.rates === null) return
    const buckets = bucketsOf(key, org, modelId)
    const err = this.check(buckets, promptTokens, nowMs)
    if (err) throw err
    for (const b of buckets) {
      const w = this.windows.get(b.id)!
      w.requests++
      w.tokens += promptTokens
    }
  }

  async refusal(
    key: LiveKey,
    org: LiveOrg,
    modelId: string,
    promptTokens: number,
  ): Promise<RateLimited | null> {
    if (!hasRateLimits(key, org)) return null
    return this.check(bucketsOf(key, org, modelId), promptTokens, Date.now()) ?? null
  }

  private check(buckets: readonly Bucket[], promptTokens: number, nowMs: number): RateLimited | undefined {
    const { weight, retryAfterS } = windowWeight(nowMs)
    for (const b of buckets) {
      let w = this.windows.get(b.id)
      if (!w) {
        w = new Window()
        this.windows.set(b.id, w)
      }
      w.roll(nowMs)
      if (b.rpm !== null && w.requests + w.prevRequests * weight + 1 > b.rpm)
        return b.reached('rpm', retryAfterS)
      if (b.tpm !== null && w.tokens + w.prevTokens * weight + promptTokens > b.tpm)
        return b.reached('tpm', retryAfterS)
    }
    return undefined
  }

  /** Adds the tokens generated by an admitted request. */
  used(key: LiveKey, org: LiveOrg, modelId: string, completionTokens: number, nowMs = Date.now()): void {
    if (key.rpmLimit === null && key.tpmLimit === null && org.rates === null) return
    for (const b of bucketsOf(key, org, modelId)) {
      const w = this.windows.get(b.id)
      if (!w) continue
      w.roll(nowMs)
      w.tokens += completionTokens
    }
  }
}
