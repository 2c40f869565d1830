import type { RedisClient } from 'bun'
import { RedisScripts } from '../cluster/redis-scripts.ts'
import {
  endUserBudgetExhausted,
  insufficientBalance,
  keyBudgetExhausted,
  keyLimitReached,
  SharedStateUnavailable,
  TropaError,
} from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import type { Store } from '../storage/store.ts'
import { type Budget, PeriodCache, type PeriodSpan } from './budgets.ts'
import { type LedgerWriter, ledgerFullError } from './ledger.ts'
import {
  type BudgetNow,
  charge,
  type MoneyMeter,
  type Reservation,
  type Settlement,
  type SpendWatch,
  type Standing,
} from './meter.ts'
import type { NanoRub } from './money.ts'

// Check-and-reserve for every node at once, in one atomic Redis script. A "room" is what a key
// (limit - spent - reserved) or an organization (balance - reserved) may still commit, in
// nano-roubles. Redis integers are 64-bit and exact, but Lua numbers are doubles, so the scripts
// compare decimal strings and leave every sum to INCRBY/DECRBY.
//
// Each node also keeps its holds (reservations in flight) in a hash of its own, written by the
// same script, and a heartbeat key that lives `leaseMs`. Invariant: a room equals its base
// (limit - spent, or balance) minus exactly the holds listed in the nodes' hashes that name it.
// A hold is "amount room [room]", so any node can give it back: when a node's heartbeat has
// expired, the next sweep by any node refunds its holds and deletes its hash in one script.
const LESS = `
local function less(a, b)
  local na, nb = a:sub(1, 1) == '-', b:sub(1, 1) == '-'
  if na ~= nb then return na end
  if na then a, b = a:sub(2), b:sub(2) end
  local r
  if #a ~= #b then r = #a < #b else r = a < b end
  if na then return (not r) and a ~= b end
  return r
end
`

// KEYS: key room, org room, this node's holds, this node's heartbeat, then up to two budget
// rooms (the key's period budget, its end user's). ARGV: amount, limited, hold id, then for each
// budget room the most it may hold before this request (budget - amount).
// Every key has a room, limited or not: an unlimited key's is (0 - spent - holds), never checked,
// so that any node can tell what a key has spent across the cluster (see standing()).
// A budget room counts down from zero: it is -(charges admitted in its period + holds), so the
// scripts that give holds back add to it as to any room, and the budget itself (which PATCH may
// change) is not in Redis: a request may hold only if -room <= budget - amount.
const RESERVE = `${LESS}
local function neg(a)
  if a:sub(1, 1) == '-' then return a:sub(2) end
  if a == '0' then return a end
  return '-' .. a
end
if redis.call('EXISTS', KEYS[4]) == 0 then return 'ALIVE' end
local amount = ARGV[1]
local k = redis.call('GET', KEYS[1])
if not k then return 'MISS_KEY' end
if ARGV[2] == '1' and less(k, amount) then return 'KEY' end
for i = 5, #KEYS do
  local b = redis.call('GET', KEYS[i])
  if not b then return 'MISS_B' .. (i - 4) end
  if less(ARGV[i - 1], neg(b)) then return 'B' .. (i - 4) end
end
local o = redis.call('GET', KEYS[2])
if not o then return 'MISS_ORG' end
if less(o, amount) then return 'ORG' end
local hold = amount .. ' ' .. KEYS[1] .. ' ' .. KEYS[2]
redis.call('DECRBY', KEYS[1], amount)
redis.call('DECRBY', KEYS[2], amount)
for i = 5, #KEYS do
  redis.call('DECRBY', KEYS[i], amount)
  hold = hold .. ' ' .. KEYS[i]
end
redis.call('HSET', KEYS[3], ARGV[3], hold)
return 'OK'
`

// What rooms hold now, and every hold of every node (the caller sums them: Lua numbers are
// doubles). KEYS: set of nodes, then the rooms. ARGV: prefix. Returns {rooms, holds}.
const STANDING = `
local rooms = {}
for i = 2, #KEYS do rooms[i - 1] = redis.call('GET', KEYS[i]) or '' end
local holds = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local all = redis.call('HGETALL', ARGV[1] .. 'held:' .. id)
  for i = 2, #all, 2 do holds[#holds + 1] = all[i] end
end
return {rooms, holds}
`

// Settlement or release. KEYS: this node's holds, then the rooms. ARGV: hold id, what goes back
// if the hold is still listed (amount - charged), what to take if it is not (-charged: a sweep
// already gave the whole hold back, or Redis lost it and the rooms were rebuilt without it), and
// '1' to have the rooms' values after it returned (for alerts; '' for a missing room).
const SETTLE = `
local d = ARGV[3]
if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then d = ARGV[2] end
if d ~= '0' then
  for i = 2, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], d) end
  end
end
if ARGV[4] == '1' then
  local rooms = {}
  for i = 2, #KEYS do rooms[i - 1] = redis.call('GET', KEYS[i]) or '' end
  return rooms
end
return 0
`

// This node's heartbeat. KEYS: heartbeat, set of nodes, epoch. ARGV: lease ms, node id, fresh.
// Returns 1 if the heartbeat was still there (0: this node was swept, or Redis lost its data).
// The epoch marks when Redis (re)started empty: rooms are rebuilt only once every live node has
// had a heartbeat to list its holds again. '0' for a cluster's very first start (nothing in flight).
const HEARTBEAT = `
local had = redis.call('EXISTS', KEYS[1])
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
if redis.call('EXISTS', KEYS[3]) == 0 then
  if ARGV[3] == '1' then redis.call('SET', KEYS[3], '0') else
    local t = redis.call('TIME')
    redis.call('SET', KEYS[3], string.format('%.0f', t[1] * 1000 + math.floor(t[2] / 1000)))
  end
end
return had
`

// Lists this node's holds again after its hash was lost (swept while it stalled, or Redis lost
// its data): each missing hold is written and taken from the rooms that exist (a missing room
// counts it when rebuilt). KEYS: this node's holds. ARGV: pairs of hold id and hold.
const RELIST = `
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    n = n + 1
    local amount
    for w in string.gmatch(ARGV[i + 1], '%S+') do
      if not amount then amount = w elseif redis.call('EXISTS', w) == 1 then redis.call('DECRBY', w, amount) end
    end
  end
end
return n
`

// Gives back the holds of every node whose heartbeat expired, and forgets the node; atomic, so
// each hold is refunded once whichever nodes sweep. KEYS: set of nodes. ARGV: prefix.
const SWEEP = `
local n = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[1] .. 'alive:' .. id) == 0 then
    local h = ARGV[1] .. 'held:' .. id
    local all = redis.call('HGETALL', h)
    for i = 2, #all, 2 do
      n = n + 1
      local amount
      for w in string.gmatch(all[i], '%S+') do
        if not amount then amount = w elseif redis.call('EXISTS', w) == 1 then redis.call('INCRBY', w, amount) end
      end
    end
    redis.call('DEL', h)
    redis.call('SREM', KEYS[1], id)
  end
end
return n
`

// A room missing from Redis, from PostgreSQL's figure minus every hold listed for it.
// KEYS: room, set of nodes, epoch. ARGV: base, prefix, settling window ms, and for a budget
// room the Unix ms at which it expires (a little after its period ends).
// Returns 'OK', 'EPOCH' (no epoch: heartbeat first) or the milliseconds left to wait.
const REBUILD = `
if redis.call('EXISTS', KEYS[1]) == 1 then return 'OK' end
local e = redis.call('GET', KEYS[3])
if not e then return 'EPOCH' end
if e ~= '0' then
  local t = redis.call('TIME')
  local age = t[1] * 1000 + math.floor(t[2] / 1000) - tonumber(e)
  if age < tonumber(ARGV[3]) then return string.format('%.0f', tonumber(ARGV[3]) - age + 1) end
end
redis.call('SET', KEYS[1], ARGV[1])
if ARGV[4] then redis.call('PEXPIREAT', KEYS[1], ARGV[4]) end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local all = redis.call('HGETALL', ARGV[2] .. 'held:' .. id)
  for i = 2, #all, 2 do
    local amount
    for w in string.gmatch(all[i], '%S+') do
      if not amount then amount = w elseif w == KEYS[1] then redis.call('DECRBY', KEYS[1], amount) end
    end
  end
end
return 'OK'
`

/** A bound that says nothing (a room was missing). */
const MAX_BOUND = 1n << 80n
/** How long a budget room outlives its period: holds admitted in it still settle into it meanwhile. */
const BUDGET_ROOM_GRACE_MS = 3_600_000

const SCRIPTS = { RESERVE, SETTLE, HEARTBEAT, RELIST, SWEEP, REBUILD, STANDING }
type ScriptName = keyof typeof SCRIPTS

export interface SharedMeterOptions {
  /** A node whose heartbeat is older than this is dead: its holds are given back. */
  readonly leaseMs?: number
  /** The ledger's flush interval (a rebuild after a data loss waits for every node's flush). */
  readonly flushIntervalMs?: number
  readonly nodeId?: string
  /** Unix ms now, for budget periods: Date.now, or a test's clock. */
  readonly clock?: () => number
  readonly log?: (level: 'info' | 'warn' | 'error', msg: string, fields?: Record<string, unknown>) => void
}

/**
 * The meter of a cluster: reservations and refunds live in Redis so the hard limits hold
 * whichever nodes a key's requests hit; the ledger still lands in PostgreSQL through the
 * node's group commit. A room missing from Redis (first use, or Redis lost its data) is
 * rebuilt from PostgreSQL and the holds every node lists. If Redis cannot be reached, requests
 * are refused with 503 rather than admitted unchecked. The holds of a node that died are given
 * back within `leaseMs` plus one sweep (a quarter of it) by whichever node sweeps first.
 */
export class SharedMeter implements MoneyMeter {
  watch: SpendWatch | undefined
  private readonly redis: RedisClient
  private readonly scripts: RedisScripts<ScriptName>
  readonly nodeId: string
  private readonly leaseMs: number
  private readonly tickMs: number
  /** After Redis (re)starts empty, rooms wait this long so every live node can list its holds again. */
  private readonly settleWindowMs: number
  private readonly held: string
  private readonly alive: string
  private readonly nodes: string
  private readonly epoch: string
  private readonly log: NonNullable<SharedMeterOptions['log']>
  /** This node's reservations in flight, by hold id (listed again if Redis loses them). */
  private readonly inFlight = new Map<string, Reservation>()
  /** Settlements Redis did not take (it was unreachable): sent again, in order, when it is back. */
  private readonly unsent: { keys: string[]; args: string[] }[] = []
  private seq = 0
  /** Rooms being rebuilt, so that the requests which found one missing together rebuild it once. */
  private readonly rebuilding = new Map<string, Promise<void>>()
  private timer: ReturnType<typeof setInterval> | undefined
  private beating: Promise<void> | undefined
  /** Whether this node has seen the epoch (a missing one after that means Redis lost its data). */
  private sawEpoch = false
  private fresh: Promise<boolean> | undefined
  readonly clock: () => number
  private readonly periods = new PeriodCache()

  constructor(
    url: string,
    private readonly prefix: string,
    private readonly store: Store,
    private readonly ledger: LedgerWriter,
    o: SharedMeterOptions = {},
  ) {
    if (/\s/.test(prefix)) throw new Error('redis.prefix must not contain whitespace')
    this.scripts = new RedisScripts(url, SCRIPTS)
    this.redis = this.scripts.redis
    this.nodeId = o.nodeId ?? `m-${crypto.randomUUID().slice(0, 13)}`
    this.leaseMs = o.leaseMs ?? 5000
    this.tickMs = Math.max(50, Math.floor(this.leaseMs / 4))
    this.settleWindowMs = this.tickMs * 2 + (o.flushIntervalMs ?? 50) * 2 + 100
    this.log = o.log ?? (() => {})
    this.clock = o.clock ?? Date.now
    this.held = `${prefix}held:${this.nodeId}`
    this.alive = `${prefix}alive:${this.nodeId}`
    this.nodes = `${prefix}nodes`
    this.epoch = `${prefix}epoch`
    this.timer = setInterval(() => void this.tick(), this.tickMs)
    this.timer.unref?.()
  }

  private keyRoom = (id: string) => `${this.prefix}room:key:${id}`
  private orgRoom = (id: string) => `${this.prefix}room:org:${id}`

  /** A budget room: the key's, or one end user's (named by a hash: any text, bounded, no spaces). */
  private budgetRoom(keyId: string, b: Budget, span: PeriodSpan, endUser: string | null): string {
    const base = `${this.prefix}room:${endUser === null ? 'bud' : 'eub'}:${keyId}:${b.period}:${span.startMs}`
    if (endUser === null) return base
    return `${base}:${new Bun.CryptoHasher('sha256').update(endUser).digest('hex').slice(0, 32)}`
  }

  async reserve(key: LiveKey, org: LiveOrg, amountNano: NanoRub, endUser?: string): Promise<Reservation> {
    // The ledger cannot take more unwritten rows (PostgreSQL is away): refuse before spending.
    if (this.ledger.full()) throw ledgerFullError(this.ledger.lastError)
    const limited = key.limitNano !== null
    const hold = (++this.seq).toString(36)
    const rooms = [this.keyRoom(key.id), this.orgRoom(org.id)]
    const args = [amountNano.toString(), limited ? '1' : '0', hold]
    // Period budgets: their rooms and what each may hold before this request. Only a key that has
    // one pays for it.
    let budgets: { room: string; span: PeriodSpan; endUser: string | null; b: Budget }[] | undefined
    let admittedAtMs: number | undefined
    if (key.budget !== null || (key.endUserBudget !== null && endUser !== undefined)) {
      admittedAtMs = this.clock()
      budgets = []
      for (const [b, who] of [
        [key.budget, null],
        [endUser === undefined ? null : key.endUserBudget, endUser ?? null],
      ] as const) {
        if (b === null) continue
        const span = this.periods.at(b.period, b.timezone, admittedAtMs)
        budgets.push({ room: this.budgetRoom(key.id, b, span, who), span, endUser: who, b })
        args.push((b.amountNano - amountNano).toString())
      }
    }
    const budgetRooms = budgets?.map((x) => x.room)
    for (let attempt = 0; attempt < 6; attempt++) {
      let verdict: string
      try {
        const keys = budgetRooms
          ? [...rooms, this.held, this.alive, ...budgetRooms]
          : [...rooms, this.held, this.alive]
        // The first try goes with the other reservations and settlements of this turn, in one call.
        verdict =
          attempt === 0
            ? String(await this.scripts.inTurn('RESERVE', keys, args))
            : await this.run('RESERVE', keys, args)
      } catch {
        throw new SharedStateUnavailable()
      }
      if (verdict === 'OK') {
        key.reservedNano += amountNano
        org.reservedNano += amountNano
        const r: Reservation = budgetRooms
          ? { key, org, amountNano, done: false, hold, budgetRooms, admittedAtMs }
          : { key, org, amountNano, done: false, hold }
        this.inFlight.set(hold, r)
        return r
      }
      if (verdict === 'KEY') {
        if (this.watch?.watches(org.id)) this.watch.limitRefused(key, org)
        throw keyLimitReached()
      }
      if (verdict === 'ORG') throw insufficientBalance()
      if (verdict === 'B1' || verdict === 'B2') {
        const b = budgets![Number(verdict[1]) - 1]!
        if (b.endUser !== null) throw endUserBudgetExhausted(b.span.endMs)
        if (this.watch?.watches(org.id))
          this.watch.budgetRefused(key, org, {
            amountNano: b.b.amountNano,
            spentAtMostNano: b.b.amountNano,
            span: b.span,
          })
        throw keyBudgetExhausted(b.span.endMs)
      }
      try {
        if (verdict === 'ALIVE') await this.heartbeat()
        else if (verdict === 'MISS_B1' || verdict === 'MISS_B2') {
          const b = budgets![Number(verdict[6]) - 1]!
          await this.rebuildBudget(b.room, key, b.endUser, b.span)
        } else await this.rebuild(verdict === 'MISS_KEY' ? 'key' : 'org', key.id, org.id)
      } catch (err) {
        if (err instanceof TropaError) throw err
        throw new SharedStateUnavailable()
      }
    }
    throw new SharedStateUnavailable()
  }

  /**
   * Where a key's period budget (or one end user's) stands across the cluster: the room is
   * -(charges admitted in the period + holds), so its negation is what is committed; the holds
   * listed against it are the part still in flight. A missing room is rebuilt first.
   */
  async budgetNow(key: LiveKey, endUser?: string): Promise<BudgetNow | undefined> {
    const b = endUser === undefined ? key.budget : key.endUserBudget
    if (b === null) return undefined
    const span = this.periods.at(b.period, b.timezone, this.clock())
    const room = this.budgetRoom(key.id, b, span, endUser ?? null)
    for (let attempt = 0; ; attempt++) {
      let reply: [string[], string[]]
      try {
        reply = (await this.scripts.reply('STANDING', [this.nodes, room], [this.prefix])) as [
          string[],
          string[],
        ]
      } catch {
        throw new SharedStateUnavailable()
      }
      const [values, holds] = reply
      if (values[0] === '') {
        if (attempt >= 3) throw new SharedStateUnavailable()
        await this.rebuildBudget(room, key, endUser ?? null, span)
        continue
      }
      let reservedNano = 0n
      for (const h of holds) {
        const [amount, ...named] = h.split(' ')
        if (named.includes(room)) reservedNano += BigInt(amount!)
      }
      return { committedNano: -BigInt(values[0]!), reservedNano, span }
    }
  }

  settle(r: Reservation, s: Settlement): NanoRub {
    if (r.done) return 0n
    r.done = true
    const charged = charge(this.ledger, r, s)
    this.giveBack(r, charged, this.watch?.watches(r.org.id) === true)
    return charged
  }

  release(r: Reservation): void {
    if (r.done) return
    r.done = true
    this.giveBack(r, 0n)
  }

  limitChanged(key: LiveKey, before: NanoRub | null, after: NanoRub | null): void {
    // An unlimited key's room counts from a limit of 0 (see RESERVE).
    void this.incr(this.keyRoom(key.id), (after ?? 0n) - (before ?? 0n))
  }

  credited(org: LiveOrg, amountNano: NanoRub): void {
    void this.incr(this.orgRoom(org.id), amountNano)
  }

  /**
   * What an organization and some of its keys stand at across the cluster, at one instant: a
   * room plus the holds listed against it is the balance (or the limit less the spend) with
   * every node's settled charges in, written to PostgreSQL or not. A missing room is rebuilt
   * first, as a reservation would.
   */
  async standing(org: LiveOrg, keys: readonly LiveKey[]): Promise<Standing> {
    const rooms = [this.orgRoom(org.id), ...keys.map((k) => this.keyRoom(k.id))]
    for (let attempt = 0; ; attempt++) {
      let reply: [string[], string[]]
      try {
        reply = (await this.scripts.reply('STANDING', [this.nodes, ...rooms], [this.prefix])) as [
          string[],
          string[],
        ]
      } catch {
        throw new SharedStateUnavailable()
      }
      const [values, holds] = reply
      const missing = values.indexOf('')
      if (missing >= 0) {
        if (attempt >= 3) throw new SharedStateUnavailable()
        await this.rebuild(missing === 0 ? 'org' : 'key', keys[missing - 1]?.id ?? '', org.id)
        continue
      }
      const held = new Map<string, NanoRub>()
      for (const h of holds) {
        const [amount, ...named] = h.split(' ')
        for (const room of named) held.set(room, (held.get(room) ?? 0n) + BigInt(amount!))
      }
      const heldAt = (room: string) => held.get(room) ?? 0n
      const spentNano = new Map<string, NanoRub>()
      keys.forEach((k, i) => {
        spentNano.set(k.id, (k.limitNano ?? 0n) - BigInt(values[i + 1]!) - heldAt(rooms[i + 1]!))
      })
      const reservedNano = heldAt(rooms[0]!)
      return { balanceNano: BigInt(values[0]!) + reservedNano, reservedNano, spentNano }
    }
  }

  /**
   * One script per settlement (sent with the others of this turn in one call): the hold leaves
   * this node's hash and the unused part goes back.
   * When the organization is watched (alerts), the script returns the rooms after it, and the
   * watch gets bounds from them (a settlement Redis missed is not watched: a later one is).
   */
  private giveBack(r: Reservation, charged: NanoRub, watched = false) {
    r.key.reservedNano -= r.amountNano
    r.org.reservedNano -= r.amountNano
    if (r.hold === undefined) return
    this.inFlight.delete(r.hold)
    const keys = [this.held, this.keyRoom(r.key.id), this.orgRoom(r.org.id)]
    // Budget rooms of a period that ended may have expired: SETTLE skips a missing room.
    if (r.budgetRooms) keys.push(...r.budgetRooms)
    const args = [r.hold, (r.amountNano - charged).toString(), (-charged).toString()]
    if (this.unsent.length > 0) this.unsent.push({ keys, args })
    else if (!watched)
      void this.scripts.inTurn('SETTLE', keys, args).catch(() => this.unsent.push({ keys, args }))
    else
      void this.scripts.reply('SETTLE', keys, [...args, '1']).then(
        (rooms) => this.watched(r, rooms),
        () => this.unsent.push({ keys, args }),
      )
  }

  /**
   * Bounds from the rooms after a settlement: a key's room is (limit - spent - holds), so
   * limit - room is at least its spend; the organization's is (balance - holds), at most its
   * balance. A missing room bounds nothing (then the exact figures are read if needed).
   */
  private watched(r: Reservation, reply: unknown) {
    const [keyRoom, orgRoom, firstBudgetRoom] = Array.isArray(reply) ? (reply as string[]) : []
    const { key, org } = r
    // The key's own budget is the first budget room when it has one (reserve lists it first): the
    // room is -(charges admitted in the period + holds), so its negation bounds the spend.
    const budget = key.budget
    if (
      budget &&
      r.admittedAtMs !== undefined &&
      firstBudgetRoom &&
      r.budgetRooms?.[0]?.includes('room:bud:')
    ) {
      const span = this.periods.at(budget.period, budget.timezone, r.admittedAtMs)
      this.watch?.budgetCharged(key, org, {
        amountNano: budget.amountNano,
        spentAtMostNano: -BigInt(firstBudgetRoom),
        span,
        exact: async () => {
          const now = await this.budgetNow(key)
          return now && now.span.startMs === span.startMs
            ? now.committedNano - now.reservedNano
            : -BigInt(firstBudgetRoom)
        },
      })
    }
    this.watch?.charged(key, org, {
      keySpentAtMostNano: keyRoom ? (key.limitNano ?? 0n) - BigInt(keyRoom) : MAX_BOUND,
      balanceAtLeastNano: orgRoom ? BigInt(orgRoom) : -MAX_BOUND,
      exact: async () => {
        const s = await this.standing(org, [key])
        return { keySpentNano: s.spentNano.get(key.id) ?? 0n, balanceNano: s.balanceNano }
      },
    })
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

  /** Heartbeat, then a sweep of dead nodes, then settlements Redis missed. */
  private async tick() {
    this.scripts.poke()
    try {
      await this.heartbeat()
      const swept = Number(await this.run('SWEEP', [this.nodes], [this.prefix]))
      if (swept > 0) this.log('info', 'gave back the holds of a node that stopped', { holds: swept })
      while (this.unsent.length > 0) {
        const u = this.unsent[0]!
        await this.run('SETTLE', u.keys, u.args)
        this.unsent.shift()
      }
    } catch {
      // Redis is unreachable: reservations are refused meanwhile; the next tick tries again.
    }
  }

  /** Renews this node's heartbeat; if it had lapsed (swept, or Redis lost its data), lists the holds again. */
  private heartbeat(): Promise<void> {
    this.beating ??= (async () => {
      try {
        const fresh = !this.sawEpoch && (await this.freshCluster())
        const had = Number(
          await this.run(
            'HEARTBEAT',
            [this.alive, this.nodes, this.epoch],
            [String(this.leaseMs), this.nodeId, fresh ? '1' : '0'],
          ),
        )
        // Recorded once the epoch is in Redis: a node that sees the record finds the epoch there.
        if (fresh && !this.sawEpoch) await this.store.initMeta('shared_meter', '1').catch(() => {})
        this.sawEpoch = true
        if (had === 0 && this.inFlight.size > 0) {
          const args: string[] = []
          for (const [id, r] of this.inFlight) {
            const named = [this.keyRoom(r.key.id), this.orgRoom(r.org.id), ...(r.budgetRooms ?? [])]
            args.push(id, `${r.amountNano} ${named.join(' ')}`)
          }
          const n = await this.run('RELIST', [this.held], args)
          this.log('warn', 'listed in-flight holds again after losing them in Redis', { holds: Number(n) })
        }
      } finally {
        this.beating = undefined
      }
    })()
    return this.beating
  }

  /** Whether this is the first node of a new cluster (no epoch yet means nothing was ever held). */
  private freshCluster(): Promise<boolean> {
    this.fresh ??= (async () => {
      try {
        return (await this.store.getMeta('shared_meter')) === undefined
      } catch {
        return false
      }
    })()
    return this.fresh
  }

  /**
   * First use of a room, or Redis lost it: start from PostgreSQL's record (spend written so far,
   * this node's queue flushed first) minus every hold listed for the room. After a data loss the
   * rebuild waits out the settling window, so every live node has listed its holds again and
   * flushed the spend it had settled.
   */
  private rebuild(which: 'key' | 'org', keyId: string, orgId: string): Promise<void> {
    // One rebuild per room at a time: the requests that found it missing together wait for it.
    const room = which === 'key' ? this.keyRoom(keyId) : this.orgRoom(orgId)
    let p = this.rebuilding.get(room)
    if (!p) {
      p = this.rebuildRoom(which, keyId, orgId).finally(() => this.rebuilding.delete(room))
      this.rebuilding.set(room, p)
    }
    return p
  }

  private async rebuildRoom(which: 'key' | 'org', keyId: string, orgId: string) {
    for (let attempt = 0; attempt < 5; attempt++) {
      await this.ledger.flush()
      let room: string
      let base: NanoRub
      if (which === 'key') {
        const rec = await this.store.getKey(keyId)
        if (!rec) return
        room = this.keyRoom(keyId)
        base = (rec.limitNano ?? 0n) - rec.spentNano
      } else {
        const rec = await this.store.getOrg(orgId)
        if (!rec) return
        room = this.orgRoom(orgId)
        base = rec.balanceNano
      }
      const v = await this.run(
        'REBUILD',
        [room, this.nodes, this.epoch],
        [base.toString(), this.prefix, String(this.settleWindowMs)],
      )
      if (v === 'OK') return
      if (v === 'EPOCH') await this.heartbeat()
      else await Bun.sleep(Math.min(Number(v), this.settleWindowMs))
    }
  }

  /**
   * A budget room missing from Redis (first use in its period, or Redis lost it): minus the
   * charges PostgreSQL holds for requests admitted in the period (this node's flushed first),
   * minus every hold listed for it, expiring an hour after the period ends. No request could be
   * admitted in the period without the room, so no other node has unwritten charges for it
   * (after a data loss the settling window waits for their flushes, as for any room).
   */
  private async rebuildBudget(room: string, key: LiveKey, endUser: string | null, span: PeriodSpan) {
    for (let attempt = 0; attempt < 5; attempt++) {
      await this.ledger.flush()
      const spent = await this.store.periodSpend({
        orgId: key.orgId,
        keyId: key.id,
        endUser,
        fromMs: span.startMs,
        toMs: span.endMs,
      })
      const v = await this.run(
        'REBUILD',
        [room, this.nodes, this.epoch],
        [
          (-spent).toString(),
          this.prefix,
          String(this.settleWindowMs),
          String(span.endMs + BUDGET_ROOM_GRACE_MS),
        ],
      )
      if (v === 'OK') return
      if (v === 'EPOCH') await this.heartbeat()
      else await Bun.sleep(Math.min(Number(v), this.settleWindowMs))
    }
  }

  private run(name: ScriptName, keys: string[], args: string[]): Promise<string> {
    return this.scripts.run(name, keys, args)
  }

  /** Stops the heartbeat; holds still listed are given back by the next sweep of another node. */
  close(): void {
    this.scripts.sendTurn()
    if (this.timer) clearInterval(this.timer)
    this.timer = undefined
    const redis = this.redis
    void redis
      .send('DEL', [this.alive])
      .catch(() => {})
      .finally(() => redis.close())
  }
}
