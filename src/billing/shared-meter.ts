import { RedisClient } from 'bun'
import { insufficientBalance, keyLimitReached, SharedStateUnavailable } from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import type { Store } from '../storage/store.ts'
import type { LedgerWriter } from './ledger.ts'
import { charge, type MoneyMeter, type Reservation, type Settlement } from './meter.ts'
import type { NanoRub } from './money.ts'

// Check-and-reserve for every node at once, in one atomic Redis script. A "room" is what a key
// (limit - spent - reserved) or an organization (balance - reserved) may still commit, in
// nano-roubles. Redis integers are 64-bit and exact, but Lua numbers are doubles, so the script
// compares decimal strings instead of converting them.
const RESERVE = `
local function less(a, b)
  local na, nb = a:sub(1, 1) == '-', b:sub(1, 1) == '-'
  if na ~= nb then return na end
  if na then a, b = a:sub(2), b:sub(2) end
  local r
  if #a ~= #b then r = #a < #b else r = a < b end
  if na then return (not r) and a ~= b end
  return r
end
local amount = ARGV[1]
if ARGV[2] == '1' then
  local k = redis.call('GET', KEYS[1])
  if not k then return 'MISS_KEY' end
  if less(k, amount) then return 'KEY' end
end
local o = redis.call('GET', KEYS[2])
if not o then return 'MISS_ORG' end
if less(o, amount) then return 'ORG' end
if ARGV[2] == '1' then redis.call('DECRBY', KEYS[1], amount) end
redis.call('DECRBY', KEYS[2], amount)
return 'OK'
`

/**
 * The meter of a cluster: reservations and refunds live in Redis so the hard limits hold
 * whichever nodes a key's requests hit; the ledger still lands in PostgreSQL through the
 * node's group commit. A room missing from Redis (first use, or Redis lost its data) is
 * rebuilt from PostgreSQL. If Redis cannot be reached, requests are refused with 503 rather
 * than admitted unchecked.
 */
export class SharedMeter implements MoneyMeter {
  private readonly redis: RedisClient
  private sha: string | undefined

  constructor(
    url: string,
    private readonly prefix: string,
    private readonly store: Store,
    private readonly ledger: LedgerWriter,
  ) {
    this.redis = new RedisClient(url, {
      autoReconnect: true,
      maxRetries: 1_000_000,
      enableOfflineQueue: false,
      connectionTimeout: 2000,
    })
  }

  private keyRoom = (id: string) => `${this.prefix}room:key:${id}`
  private orgRoom = (id: string) => `${this.prefix}room:org:${id}`

  async reserve(key: LiveKey, org: LiveOrg, amountNano: NanoRub): Promise<Reservation> {
    const limited = key.limitNano !== null
    for (let attempt = 0; attempt < 3; attempt++) {
      let verdict: string
      try {
        verdict = await this.run(
          [this.keyRoom(key.id), this.orgRoom(org.id)],
          [amountNano.toString(), limited ? '1' : '0'],
        )
      } catch {
        throw new SharedStateUnavailable()
      }
      if (verdict === 'OK') {
        key.reservedNano += amountNano
        org.reservedNano += amountNano
        return { key, org, amountNano, done: false, keyDebited: limited }
      }
      if (verdict === 'KEY') throw keyLimitReached()
      if (verdict === 'ORG') throw insufficientBalance()
      await this.rebuild(verdict === 'MISS_KEY' ? 'key' : 'org', key, org)
    }
    throw new SharedStateUnavailable()
  }

  settle(r: Reservation, s: Settlement): NanoRub {
    if (r.done) return 0n
    r.done = true
    const charged = charge(this.ledger, r, s)
    this.refund(r, r.amountNano - charged)
    return charged
  }

  release(r: Reservation): void {
    if (r.done) return
    r.done = true
    this.refund(r, r.amountNano)
  }

  limitChanged(key: LiveKey, before: NanoRub | null, after: NanoRub | null): void {
    if (before !== null && after !== null) void this.incr(this.keyRoom(key.id), after - before)
    // From or to "no limit": the room is rebuilt from the record on next use.
    else void this.redis.del(this.keyRoom(key.id)).catch(() => {})
  }

  credited(org: LiveOrg, amountNano: NanoRub): void {
    void this.incr(this.orgRoom(org.id), amountNano)
  }

  private refund(r: Reservation, amount: NanoRub) {
    r.key.reservedNano -= r.amountNano
    r.org.reservedNano -= r.amountNano
    if (amount === 0n) return
    if (r.keyDebited) void this.incr(this.keyRoom(r.key.id), amount)
    void this.incr(this.orgRoom(r.org.id), amount)
  }

  /** Adds to a room only if it exists (a missing room is rebuilt from the record anyway). */
  private async incr(room: string, delta: NanoRub) {
    await this.redis
      .send('EVAL', [
        "if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) end return nil",
        '1',
        room,
        delta.toString(),
      ])
      .catch(() => {})
  }

  /**
   * First use of a room, or Redis lost it: start from PostgreSQL's record (spend written so far)
   * minus what this node holds in flight. SET NX: if another node rebuilt it first, that wins.
   */
  private async rebuild(which: 'key' | 'org', key: LiveKey, org: LiveOrg) {
    await this.ledger.flush()
    if (which === 'key') {
      const rec = await this.store.getKey(key.id)
      if (!rec || rec.limitNano === null) return
      const room = rec.limitNano - rec.spentNano - key.reservedNano
      await this.redis.send('SET', [this.keyRoom(key.id), room.toString(), 'NX'])
    } else {
      const rec = await this.store.getOrg(org.id)
      if (!rec) return
      const room = rec.balanceNano - org.reservedNano
      await this.redis.send('SET', [this.orgRoom(org.id), room.toString(), 'NX'])
    }
  }

  private async run(keys: string[], args: string[]): Promise<string> {
    if (!this.redis.connected) await this.redis.connect()
    this.sha ??= String(await this.redis.send('SCRIPT', ['LOAD', RESERVE]))
    try {
      return String(await this.redis.send('EVALSHA', [this.sha, String(keys.length), ...keys, ...args]))
    } catch (err) {
      // Redis restarted and forgot the script: load it again.
      if (!String((err as Error).message).includes('NOSCRIPT')) throw err
      this.sha = String(await this.redis.send('SCRIPT', ['LOAD', RESERVE]))
      return String(await this.redis.send('EVALSHA', [this.sha, String(keys.length), ...keys, ...args]))
    }
  }

  close(): void {
    this.redis.close()
  }
}
