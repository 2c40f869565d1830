import { RedisScripts } from '../cluster/redis-scripts.ts'
import { SharedStateUnavailable } from '../errors.ts'
import type { LiveKey } from '../identity/live.ts'
import { type ConcurrencyLimiter, concurrencyReached, type Slot } from './concurrency.ts'

// A key's requests in flight across the cluster, in Redis: one set per key whose members are the
// slots, "<node>/<slot>". Each node keeps a heartbeat key that lives `leaseMs`; a slot whose node's
// heartbeat is gone does not count and is removed by the next acquire of that key on any node, so
// the slots of a node killed mid-request come back within the lease. Releasing is SREM, which is
// idempotent: a release sent twice (retried after Redis was away) frees one slot. A set holds at
// most max_concurrency live members, so an acquire reads a bounded set.

// KEYS: the key's set, this node's heartbeat. ARGV: max_concurrency, the new member, prefix of the
// heartbeat keys, the set's time to live (ms). Returns 'OK', 'FULL' or 'ALIVE' (heartbeat first).
const ACQUIRE = `
if redis.call('EXISTS', KEYS[2]) == 0 then return 'ALIVE' end
local live, seen = 0, {}
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local node = string.match(m, '^(.-)/') or ''
  local ok = seen[node]
  if ok == nil then
    ok = redis.call('EXISTS', ARGV[3] .. node) == 1
    seen[node] = ok
  end
  if ok then live = live + 1 else redis.call('SREM', KEYS[1], m) end
end
if live >= tonumber(ARGV[1]) then return 'FULL' end
redis.call('SADD', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 'OK'
`

// KEYS: the key's set. ARGV: prefix of the heartbeat keys. The live members, changing nothing.
const IN_FLIGHT = `
local live, seen = 0, {}
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local node = string.match(m, '^(.-)/') or ''
  local ok = seen[node]
  if ok == nil then
    ok = redis.call('EXISTS', ARGV[1] .. node) == 1
    seen[node] = ok
  end
  if ok then live = live + 1 end
end
return live
`

// This node's heartbeat. KEYS: the heartbeat. ARGV: lease ms, the sets' time to live (ms), then
// pairs of set and member: this node's slots, listed again only if the heartbeat had lapsed (its
// slots may have been removed meanwhile). Returns 1 if the heartbeat was still there.
const HEARTBEAT = `
local had = redis.call('EXISTS', KEYS[1])
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
if had == 0 then
  for i = 3, #ARGV, 2 do
    redis.call('SADD', ARGV[i], ARGV[i + 1])
    redis.call('PEXPIRE', ARGV[i], ARGV[2])
  end
end
return had
`
const SCRIPTS = { ACQUIRE, IN_FLIGHT, HEARTBEAT }

/** A set outlives its last acquire by this long (a request in flight longer than a day is not expected). */
const SET_TTL_MS = 86_400_000

export interface SharedConcurrencyOptions {
  /** A node whose heartbeat is older than this is dead: its slots no longer count. */
  readonly leaseMs?: number
  readonly nodeId?: string
  readonly log?: (level: 'info' | 'warn' | 'error', msg: string, fields?: Record<string, unknown>) => void
}

/**
 * `max_concurrency` across the nodes of a cluster. If Redis cannot be reached, a key with a bound
 * is refused with 503 (as its money would be); a release Redis did not take is sent again, with
 * the heartbeat, once it is back.
 */
export class SharedConcurrency implements ConcurrencyLimiter {
  private readonly scripts: RedisScripts<keyof typeof SCRIPTS>
  readonly nodeId: string
  private readonly leaseMs: number
  private readonly alive: string
  private readonly alivePrefix: string
  private readonly log: NonNullable<SharedConcurrencyOptions['log']>
  /** This node's slots, member to set: listed again if its heartbeat lapsed. */
  private readonly held = new Map<string, string>()
  /** Acquires sent and not answered yet (listed again too: Redis may have taken them). */
  private readonly pending = new Map<string, string>()
  /** Releases Redis did not take (it was unreachable), as set and member. */
  private readonly unsent: [string, string][] = []
  private seq = 0
  private timer: ReturnType<typeof setInterval> | undefined
  private beating: Promise<void> | undefined
  private closed = false

  constructor(
    url: string,
    private readonly prefix: string,
    o: SharedConcurrencyOptions = {},
  ) {
    if (/[\s/]/.test(prefix)) throw new Error('redis.prefix must not contain whitespace or /')
    this.scripts = new RedisScripts(url, SCRIPTS)
    this.nodeId = o.nodeId ?? `c-${crypto.randomUUID().slice(0, 13)}`
    this.leaseMs = o.leaseMs ?? 5000
    this.log = o.log ?? (() => {})
    this.alivePrefix = `${prefix}cc-alive:`
    this.alive = `${this.alivePrefix}${this.nodeId}`
  }

  /** The heartbeat starts with the first acquire: a cluster whose keys have no bound never beats. */
  private start() {
    this.timer = setInterval(() => void this.tick(), Math.max(50, Math.floor(this.leaseMs / 4)))
    this.timer.unref?.()
  }

  private setOf = (keyId: string) => `${this.prefix}cc:${keyId}`

  async acquire(key: LiveKey): Promise<Slot> {
    if (!this.timer && !this.closed) this.start()
    const set = this.setOf(key.id)
    for (let attempt = 0; attempt < 3; attempt++) {
      const member = `${this.nodeId}/${(++this.seq).toString(36)}`
      this.pending.set(member, set)
      let verdict: string
      try {
        verdict = String(
          await this.scripts.inTurn(
            'ACQUIRE',
            [set, this.alive],
            [String(key.maxConcurrency ?? 0), member, this.alivePrefix, String(SET_TTL_MS)],
          ),
        )
      } catch {
        this.pending.delete(member)
        throw new SharedStateUnavailable()
      }
      if (verdict === 'OK') {
        this.pending.delete(member)
        this.held.set(member, set)
        return this.slot(set, member)
      }
      this.pending.delete(member)
      if (verdict === 'FULL') throw concurrencyReached(key)
      try {
        await this.heartbeat()
      } catch {
        throw new SharedStateUnavailable()
      }
    }
    throw new SharedStateUnavailable()
  }

  async inFlight(key: LiveKey): Promise<number> {
    try {
      return Number(await this.scripts.run('IN_FLIGHT', [this.setOf(key.id)], [this.alivePrefix]))
    } catch {
      throw new SharedStateUnavailable()
    }
  }

  private slot(set: string, member: string): Slot {
    let held = true
    return {
      release: () => {
        if (!held) return
        held = false
        this.held.delete(member)
        this.remove(set, member)
      },
    }
  }

  private remove(set: string, member: string) {
    if (this.unsent.length > 0) this.unsent.push([set, member])
    else void this.scripts.redis.srem(set, member).catch(() => this.unsent.push([set, member]))
  }

  /** Heartbeat, then the releases Redis missed. */
  private async tick() {
    this.scripts.poke()
    try {
      await this.heartbeat()
      while (this.unsent.length > 0) {
        const [set, member] = this.unsent[0]!
        await this.scripts.redis.srem(set, member)
        this.unsent.shift()
      }
    } catch {
      // Redis is unreachable: keys with a bound are refused meanwhile; the next tick tries again.
    }
  }

  /** Renews the heartbeat; if it had lapsed, this node's slots are listed again in the same script. */
  private heartbeat(): Promise<void> {
    this.beating ??= (async () => {
      try {
        const listed = [...this.held, ...this.pending]
        const args = [String(this.leaseMs), String(SET_TTL_MS)]
        for (const [member, set] of listed) args.push(set, member)
        const had = Number(await this.scripts.run('HEARTBEAT', [this.alive], args))
        if (had === 1 || listed.length === 0) return
        // Listed again: an acquire answered meanwhile with a refusal, or a slot released before
        // the listing ran, must not stay in Redis (Redis ran the listing after them).
        for (const [member, set] of listed)
          if (!this.held.has(member) && !this.pending.has(member)) this.remove(set, member)
        this.log('warn', 'listed in-flight concurrency slots again after losing them in Redis', {
          slots: listed.length,
        })
      } finally {
        this.beating = undefined
      }
    })()
    return this.beating
  }

  /** Stops the heartbeat; slots still listed stop counting once it is gone. */
  close(): void {
    this.closed = true
    if (this.timer) clearInterval(this.timer)
    this.timer = undefined
    const redis = this.scripts.redis
    void redis
      .send('DEL', [this.alive])
      .catch(() => {})
      .finally(() => redis.close())
  }
}
