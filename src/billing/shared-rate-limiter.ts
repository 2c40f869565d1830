import { RedisScripts } from '../cluster/redis-scripts.ts'
import { type RateLimited, SharedStateUnavailable } from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import {
  type Bucket,
  bucketsOf,
  hasRateLimits,
  type RateLimiter,
  WINDOW_MS,
  windowWeight,
} from './rate-limiter.ts'

// The same sliding minute as the local limiter, with the counts in Redis so that the limits hold
// whichever nodes the requests hit. One hash per bucket (a key, an organization, an
// organization's model) and minute ({r, t}); every bucket is checked and then counted in one
// script, so concurrent requests on several nodes cannot both take the last unit, and a request
// refused by one bucket is counted in none. Counts are small integers, exact in Lua's doubles.
// KEYS: per bucket, this minute's hash and the previous minute's. ARGV: weight of the previous
// minute, time to live (ms), prompt tokens, count ('1', or '0' to only check), then per bucket
// rpm and tpm ('' = none). Returns 'OK' or 'RPM <i>' / 'TPM <i>' (i: the bucket, from 0).
const ADMIT = `
local w = tonumber(ARGV[1])
local tokens = tonumber(ARGV[3])
local n = #KEYS / 2
for i = 0, n - 1 do
  local c = redis.call('HMGET', KEYS[2 * i + 1], 'r', 't')
  local p = redis.call('HMGET', KEYS[2 * i + 2], 'r', 't')
  local cr, ct = tonumber(c[1] or '0'), tonumber(c[2] or '0')
  local pr, pt = tonumber(p[1] or '0'), tonumber(p[2] or '0')
  local rpm, tpm = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
  if rpm ~= '' and cr + pr * w + 1 > tonumber(rpm) then return 'RPM ' .. i end
  if tpm ~= '' and ct + pt * w + tokens > tonumber(tpm) then return 'TPM ' .. i end
end
if ARGV[4] == '1' then
  for i = 0, n - 1 do
    redis.call('HINCRBY', KEYS[2 * i + 1], 'r', 1)
    redis.call('HINCRBY', KEYS[2 * i + 1], 't', ARGV[3])
    redis.call('PEXPIRE', KEYS[2 * i + 1], ARGV[2])
  end
end
return 'OK'
`
// KEYS: this minute's hash of each bucket with a token limit. ARGV: tokens, time to live (ms).
const USED = `
for i = 1, #KEYS do
  redis.call('HINCRBY', KEYS[i], 't', ARGV[1])
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 'OK'
`
const SCRIPTS = { ADMIT, USED }

/**
 * Rate limits of a cluster, counted in Redis. Nodes compute the minute from their own clocks,
 * which must agree (NTP). If Redis cannot be reached, a request with limits is refused with 503
 * (as its money would be); completion tokens that could not be added are dropped.
 */
export class SharedRateLimiter implements RateLimiter {
  private readonly scripts: RedisScripts<keyof typeof SCRIPTS>

  constructor(
    url: string,
    private readonly prefix: string,
  ) {
    this.scripts = new RedisScripts(url, SCRIPTS)
  }

  private hash = (bucketId: string, startMs: number) => `${this.prefix}rl:${bucketId}:${startMs / WINDOW_MS}`

  admit(
    key: LiveKey,
    org: LiveOrg,
    modelId: string,
    promptTokens: number,
    nowMs = Date.now(),
  ): undefined | Promise<void> {
    if (key.rpmLimit === null && key.tpmLimit === null && org.rates === null) return
    const buckets = bucketsOf(key, org, modelId)
    if (buckets.length === 0) return
    return this.check(buckets, promptTokens, nowMs, true).then((err) => {
      if (err) throw err
    })
  }

  async refusal(
    key: LiveKey,
    org: LiveOrg,
    modelId: string,
    promptTokens: number,
  ): Promise<RateLimited | null> {
    if (!hasRateLimits(key, org)) return null
    const buckets = bucketsOf(key, org, modelId)
    if (buckets.length === 0) return null
    return (await this.check(buckets, promptTokens, Date.now(), false)) ?? null
  }

  private async check(
    buckets: readonly Bucket[],
    promptTokens: number,
    nowMs: number,
    count: boolean,
  ): Promise<RateLimited | undefined> {
    const { startMs, weight, retryAfterS } = windowWeight(nowMs)
    const keys: string[] = []
    const args = [weight.toFixed(6), String(2 * WINDOW_MS), String(promptTokens), count ? '1' : '0']
    for (const b of buckets) {
      keys.push(this.hash(b.id, startMs), this.hash(b.id, startMs - WINDOW_MS))
      args.push(b.rpm === null ? '' : String(b.rpm), b.tpm === null ? '' : String(b.tpm))
    }
    let verdict: string
    try {
      this.scripts.poke()
      // Sent with the turn's other scripts (reservations, settlements of this node) in one call.
      verdict = String(await this.scripts.inTurn('ADMIT', keys, args))
    } catch {
      throw new SharedStateUnavailable()
    }
    if (verdict === 'OK') return undefined
    const [which, at] = verdict.split(' ')
    const b = buckets[Number(at)]
    if (!b) throw new SharedStateUnavailable()
    return b.reached(which === 'RPM' ? 'rpm' : 'tpm', retryAfterS)
  }

  used(key: LiveKey, org: LiveOrg, modelId: string, completionTokens: number, nowMs = Date.now()): void {
    if (completionTokens <= 0 || (key.tpmLimit === null && org.rates === null)) return
    const { startMs } = windowWeight(nowMs)
    const keys = bucketsOf(key, org, modelId)
      .filter((b) => b.tpm !== null)
      .map((b) => this.hash(b.id, startMs))
    if (keys.length === 0) return
    void this.scripts.inTurn('USED', keys, [String(completionTokens), String(2 * WINDOW_MS)]).catch(() => {})
  }

  close(): void {
    this.scripts.sendTurn()
    this.scripts.redis.close()
  }
}
