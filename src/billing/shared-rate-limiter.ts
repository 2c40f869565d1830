import { RedisScripts } from '../cluster/redis-scripts.ts'
import { SharedStateUnavailable } from '../errors.ts'
import type { LiveKey } from '../identity/live.ts'
import { type RateLimiter, rpmReached, tpmReached, WINDOW_MS, windowWeight } from './rate-limiter.ts'

// The same sliding minute as the local limiter, with the counts in Redis so that a key's
// limits hold whichever nodes its requests hit. One hash per key and minute ({r, t}); the
// check and the count are one script, so concurrent requests on several nodes cannot both take
// the last unit. Counts are small integers, exact in Lua's doubles.
// KEYS: this minute's hash, the previous minute's. ARGV: rpm ('' = none), tpm ('' = none),
// prompt tokens, weight of the previous minute, time to live (ms).
const ADMIT = `
local c = redis.call('HMGET', KEYS[1], 'r', 't')
local p = redis.call('HMGET', KEYS[2], 'r', 't')
local w = tonumber(ARGV[4])
local cr, ct = tonumber(c[1] or '0'), tonumber(c[2] or '0')
local pr, pt = tonumber(p[1] or '0'), tonumber(p[2] or '0')
if ARGV[1] ~= '' and cr + pr * w + 1 > tonumber(ARGV[1]) then return 'RPM' end
if ARGV[2] ~= '' and ct + pt * w + tonumber(ARGV[3]) > tonumber(ARGV[2]) then return 'TPM' end
redis.call('HINCRBY', KEYS[1], 'r', 1)
redis.call('HINCRBY', KEYS[1], 't', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 'OK'
`
// KEYS: this minute's hash. ARGV: tokens, time to live (ms).
const USED = `
redis.call('HINCRBY', KEYS[1], 't', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 'OK'
`
const SCRIPTS = { ADMIT, USED }

/**
 * Rate limits of a cluster, counted in Redis. Nodes compute the minute from their own clocks,
 * which must agree (NTP). If Redis cannot be reached, a key with limits is refused with 503 (as
 * its money would be); completion tokens that could not be added are dropped.
 */
export class SharedRateLimiter implements RateLimiter {
  private readonly scripts: RedisScripts<keyof typeof SCRIPTS>

  constructor(
    url: string,
    private readonly prefix: string,
  ) {
    this.scripts = new RedisScripts(url, SCRIPTS)
  }

  private hash = (keyId: string, startMs: number) => `${this.prefix}rl:${keyId}:${startMs / WINDOW_MS}`

  admit(key: LiveKey, promptTokens: number, nowMs = Date.now()): undefined | Promise<void> {
    if (key.rpmLimit === null && key.tpmLimit === null) return
    return this.check(key, promptTokens, nowMs)
  }

  private async check(key: LiveKey, promptTokens: number, nowMs: number): Promise<void> {
    const { startMs, weight, retryAfterS } = windowWeight(nowMs)
    let verdict: string
    try {
      this.scripts.poke()
      verdict = await this.scripts.run(
        'ADMIT',
        [this.hash(key.id, startMs), this.hash(key.id, startMs - WINDOW_MS)],
        [
          key.rpmLimit === null ? '' : String(key.rpmLimit),
          key.tpmLimit === null ? '' : String(key.tpmLimit),
          String(promptTokens),
          weight.toFixed(6),
          String(2 * WINDOW_MS),
        ],
      )
    } catch {
      throw new SharedStateUnavailable()
    }
    if (verdict === 'RPM') throw rpmReached(key, retryAfterS)
    if (verdict === 'TPM') throw tpmReached(key, retryAfterS)
  }

  used(key: LiveKey, completionTokens: number, nowMs = Date.now()): void {
    if (key.tpmLimit === null || completionTokens <= 0) return
    const { startMs } = windowWeight(nowMs)
    void this.scripts
      .run('USED', [this.hash(key.id, startMs)], [String(completionTokens), String(2 * WINDOW_MS)])
      .catch(() => {})
  }

  close(): void {
    this.scripts.redis.close()
  }
}
