import {
  endUserBudgetExhausted,
  insufficientBalance,
  keyBudgetExhausted,
  keyLimitReached,
  SharedStateUnavailable,
} from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import type { LedgerEntry } from '../storage/store.ts'
import { CounterLru, PeriodCache, PeriodCounter, type PeriodSpan } from './budgets.ts'
import { type LedgerWriter, ledgerFullError } from './ledger.ts'
import type { NanoRub } from './money.ts'

/** Money held for one request in flight. */
export interface Reservation {
  readonly key: LiveKey
  readonly org: LiveOrg
  readonly amountNano: NanoRub
  done: boolean
  /** Cluster meter: the reservation's field in this node's hash of holds in Redis. */
  hold?: string
  /**
   * When the request was admitted (the meter's clock), for a key with a budget: its money counts
   * into the periods containing this instant, and its ledger row carries it (`admitted_at_ms`).
   */
  admittedAtMs?: number
  /** One node: the period counters (key budget, end-user budget) this reservation holds in. */
  counters?: PeriodCounter[]
  /** One node: the key budget's counter among them (for its alerts). */
  keyCounter?: PeriodCounter
  /** Cluster meter: the budget rooms in Redis this reservation holds in. */
  budgetRooms?: string[]
}

export type Settlement = Omit<LedgerEntry, 'kind' | 'orgId' | 'keyId' | 'costNano'> & {
  readonly costNano: NanoRub
}

/** Admission and settlement of money: on one node in memory, across nodes in Redis. */
export interface MoneyMeter {
  /**
   * Holds the worst-case cost, or throws 402: the key's limit, its period budget, the end user's
   * period budget, then the organization's balance. `endUser` names the key owner's end user.
   */
  reserve(
    key: LiveKey,
    org: LiveOrg,
    amountNano: NanoRub,
    endUser?: string,
  ): Reservation | Promise<Reservation>
  /** Charges the real cost (never above the reservation), releases the rest; returns the charge. */
  settle(r: Reservation, s: Settlement): NanoRub
  /** Gives the whole reservation back. */
  release(r: Reservation): void
  /** A key's limit changed (from `before` to `after`; null is no limit). */
  limitChanged?(key: LiveKey, before: NanoRub | null, after: NanoRub | null): void
  /** An organization was credited. */
  credited?(org: LiveOrg, amountNano: NanoRub): void
  /**
   * Where the organization and these keys of it stand across a cluster (every node's charges
   * and holds); absent on one node, whose live objects are the truth.
   */
  standing?(org: LiveOrg, keys: readonly LiveKey[]): Promise<Standing>
  /** Who is told of settled charges and refusals for a key's limit (webhooks' alerts). */
  watch: SpendWatch | undefined
  /**
   * Where a key's period budget (or, with `endUser`, that end user's) stands now: spent in the
   * current period (settled charges and holds in flight, every node's), and the period. Undefined
   * when the key has no such budget.
   */
  budgetNow(key: LiveKey, endUser?: string): Promise<BudgetNow | undefined>
  /** The clock periods are read by (Unix ms; injectable for tests). */
  readonly clock: () => number
}

/**
 * Told of settled charges, to notice thresholds crossed (a key's limit at 80% and 100%, the
 * balance below a threshold). `watches` is a map lookup, asked first: an organization without
 * such alerts costs nothing more per request.
 */
export interface SpendWatch {
  watches(orgId: string): boolean
  /** After a charge: what the key has spent and the balance, as `SpendFigures` bound them. */
  charged(key: LiveKey, org: LiveOrg, after: SpendFigures): void
  /** A request was refused for the key's limit (402 key_limit_reached): the limit is reached. */
  limitRefused(key: LiveKey, org: LiveOrg): void
  /** After a charge under the key's period budget: what the period has spent (a bound in a cluster). */
  budgetCharged(key: LiveKey, org: LiveOrg, b: BudgetFigures): void
  /** A request was refused for the key's period budget (402 key_budget_exhausted). */
  budgetRefused(key: LiveKey, org: LiveOrg, b: BudgetFigures): void
}

/**
 * Where a key's period budget stands after a charge (or at a refusal): its amount, the period,
 * and what the period has spent. On one node exact; in a cluster an upper bound from the budget's
 * room (the holds of requests in flight counted as spent), with `exact` to read the figure.
 */
export interface BudgetFigures {
  readonly amountNano: NanoRub
  readonly spentAtMostNano: NanoRub
  readonly span: PeriodSpan
  readonly exact?: () => Promise<NanoRub>
}

/**
 * Where a key and its organization stand after a charge. On one node the figures are exact. In a
 * cluster they are bounds from the shared rooms (money held by requests in flight is counted as
 * spent), and `exact` reads the cluster's exact figures: asked only when a bound says a threshold
 * may have been crossed.
 */
export interface SpendFigures {
  readonly keySpentAtMostNano: NanoRub
  readonly balanceAtLeastNano: NanoRub
  readonly exact?: () => Promise<{ readonly keySpentNano: NanoRub; readonly balanceNano: NanoRub }>
}

/** A period budget's standing: what is committed in the current period, and the period. */
export interface BudgetNow {
  /** Settled charges admitted in the period plus holds of requests in flight admitted in it. */
  readonly committedNano: NanoRub
  /** Holds in flight (part of committedNano). */
  readonly reservedNano: NanoRub
  readonly span: PeriodSpan
}

/** The sum of a budget's charges admitted in a period, from the ledger (single node and cluster rebuilds). */
export type PeriodSpendReader = (key: LiveKey, endUser: string | null, span: PeriodSpan) => Promise<NanoRub>

export interface MeterOptions {
  /** false only to measure the money path's own cost in benchmarks: nothing is charged. */
  readonly enabled?: boolean
  /** Unix ms now, for budget periods: Date.now, or a test's clock. */
  readonly clock?: () => number
  /** Reads a period's spend from the store (budgets); absent: budgets count from zero. */
  readonly periodSpend?: PeriodSpendReader
  /** End users' counters kept in memory at most (least recently used beyond are read back from the ledger). */
  readonly maxEndUsers?: number
}

/** An organization's balance and reservations in flight, and its keys' spend, right now. */
export interface Standing {
  readonly balanceNano: NanoRub
  readonly reservedNano: NanoRub
  /** By key id. */
  readonly spentNano: ReadonlyMap<string, NanoRub>
}

/**
 * Admission and settlement on one node. JavaScript runs this synchronously on one thread, so
 * check-and-reserve cannot interleave: concurrent requests can never push a key's spent past
 * its limit or an organization's balance below zero.
 */
export class Meter implements MoneyMeter {
  watch: SpendWatch | undefined
  readonly clock: () => number
  private readonly periods = new PeriodCache()
  /** Key budgets' counters of the current period, by key id (a key has one budget). */
  private readonly keyCounters = new Map<string, PeriodCounter>()
  /** End users' counters, by key id, end user and period (bounded). */
  private readonly userCounters: CounterLru
  /** Counters being read back from the ledger: the requests that need one wait for the same read. */
  private readonly loading = new Map<string, Promise<PeriodCounter>>()
  private readonly periodSpend: PeriodSpendReader | undefined

  constructor(
    private readonly ledger: LedgerWriter,
    /** false only to measure the money path's own cost in benchmarks: nothing is charged. */
    private readonly enabled = true,
    o: MeterOptions = {},
  ) {
    this.clock = o.clock ?? Date.now
    this.periodSpend = o.periodSpend
    this.userCounters = new CounterLru(o.maxEndUsers ?? 10_000)
  }

  /** Holds the worst-case cost, or throws 402 (key limit, budgets, then balance). */
  reserve(
    key: LiveKey,
    org: LiveOrg,
    amountNano: NanoRub,
    endUser?: string,
  ): Reservation | Promise<Reservation> {
    if (!this.enabled) return { key, org, amountNano: 0n, done: false }
    // The ledger cannot take more unwritten rows: serving now would spend without a record.
    if (this.ledger.full()) throw ledgerFullError(this.ledger.lastError)
    // A budgeted key takes the longer path; the others (the hot path) pay nothing for budgets.
    if (key.budget !== null || (key.endUserBudget !== null && endUser !== undefined))
      return this.reserveBudgeted(key, org, amountNano, endUser)
    // Each bigint sum is a new heap number: the held totals are computed once, checked, then kept.
    const keyHeld = key.reservedNano + amountNano
    if (key.limitNano !== null && key.spentNano + keyHeld > key.limitNano) {
      if (this.watch?.watches(org.id)) this.watch.limitRefused(key, org)
      throw keyLimitReached()
    }
    const orgHeld = org.reservedNano + amountNano
    if (orgHeld > org.balanceNano) throw insufficientBalance()
    key.reservedNano = keyHeld
    org.reservedNano = orgHeld
    return { key, org, amountNano, done: false }
  }

  /**
   * A key with a period budget: its counters of the current period (read back from the ledger
   * when this node has none yet), then every check and the holds at once, synchronously, so no
   * interleaving overspends any of them.
   */
  private reserveBudgeted(
    key: LiveKey,
    org: LiveOrg,
    amountNano: NanoRub,
    endUser: string | undefined,
  ): Reservation | Promise<Reservation> {
    const now = this.clock()
    const kc =
      key.budget === null
        ? undefined
        : this.counter(key, null, this.periods.at(key.budget.period, key.budget.timezone, now), now)
    const ub = endUser === undefined ? null : key.endUserBudget
    const uc =
      ub === null ? undefined : this.counter(key, endUser!, this.periods.at(ub.period, ub.timezone, now), now)
    if (kc instanceof Promise || uc instanceof Promise)
      return Promise.all([kc, uc]).then(([k, u]) => this.admit(key, org, amountNano, now, k, u))
    return this.admit(key, org, amountNano, now, kc, uc)
  }

  private admit(
    key: LiveKey,
    org: LiveOrg,
    amountNano: NanoRub,
    now: number,
    kc: PeriodCounter | undefined,
    uc: PeriodCounter | undefined,
  ): Reservation {
    const keyHeld = key.reservedNano + amountNano
    if (key.limitNano !== null && key.spentNano + keyHeld > key.limitNano) throw keyLimitReached()
    // The budgets as they are now (a change while the counters were read applies at once).
    if (kc && key.budget && kc.spentNano + kc.reservedNano + amountNano > key.budget.amountNano) {
      if (this.watch?.watches(org.id))
        this.watch.budgetRefused(key, org, {
          amountNano: key.budget.amountNano,
          spentAtMostNano: kc.spentNano,
          span: { startMs: kc.startMs, endMs: kc.endMs },
        })
      throw keyBudgetExhausted(kc.endMs)
    }
    if (uc && key.endUserBudget && uc.spentNano + uc.reservedNano + amountNano > key.endUserBudget.amountNano)
      throw endUserBudgetExhausted(uc.endMs)
    const orgHeld = org.reservedNano + amountNano
    if (orgHeld > org.balanceNano) throw insufficientBalance()
    key.reservedNano = keyHeld
    org.reservedNano = orgHeld
    const counters: PeriodCounter[] = []
    if (kc) counters.push(kc)
    if (uc) counters.push(uc)
    for (const c of counters) c.reservedNano += amountNano
    return { key, org, amountNano, done: false, admittedAtMs: now, counters, ...(kc && { keyCounter: kc }) }
  }

  /**
   * The counter of a key's budget (endUser null) or of one end user's, for `span`. A counter this
   * node does not hold is read back from the ledger (every charge of this node flushed first, so
   * none is missed): this node admits every request of the key, so from then on it counts them.
   */
  private counter(
    key: LiveKey,
    endUser: string | null,
    span: PeriodSpan,
    now: number,
  ): PeriodCounter | Promise<PeriodCounter> {
    const keyId = key.id
    const id = endUser === null ? keyId : `${keyId}\n${endUser}\n${span.startMs}\n${span.endMs}`
    const held = endUser === null ? this.keyCounters.get(id) : this.userCounters.get(id, now)
    if (held !== undefined && held.startMs === span.startMs && held.endMs === span.endMs) return held
    let pending = this.loading.get(id)
    if (pending === undefined) {
      pending = this.readCounter(key, endUser, span).then(
        (c) => {
          this.loading.delete(id)
          if (endUser === null) this.keyCounters.set(id, c)
          else this.userCounters.set(id, c)
          return c
        },
        (err) => {
          this.loading.delete(id)
          throw err
        },
      )
      this.loading.set(id, pending)
    }
    return pending
  }

  private async readCounter(key: LiveKey, endUser: string | null, span: PeriodSpan): Promise<PeriodCounter> {
    const c = new PeriodCounter(span.startMs, span.endMs)
    if (!this.periodSpend) return c
    try {
      await this.ledger.flush()
      if (this.ledger.lastError !== undefined) throw this.ledger.lastError
      c.spentNano = await this.periodSpend(key, endUser, span)
    } catch {
      throw new SharedStateUnavailable()
    }
    return c
  }

  async budgetNow(key: LiveKey, endUser?: string): Promise<BudgetNow | undefined> {
    const b = endUser === undefined ? key.budget : key.endUserBudget
    if (b === null) return undefined
    const now = this.clock()
    const span = this.periods.at(b.period, b.timezone, now)
    const c = await this.counter(key, endUser ?? null, span, now)
    return { committedNano: c.spentNano + c.reservedNano, reservedNano: c.reservedNano, span }
  }

  /**
   * Charges the real cost and releases the rest. The charge never exceeds the reservation: if an
   * upstream reports more tokens than the worst case Tropa counted, the excess is not billed, so
   * the hard limit holds whatever an upstream says. Returns the amount charged.
   */
  settle(r: Reservation, s: Settlement): NanoRub {
    if (r.done) return 0n
    r.done = true
    if (!this.enabled) return 0n
    r.key.reservedNano -= r.amountNano
    r.org.reservedNano -= r.amountNano
    const charged = charge(this.ledger, r, s)
    // One node: the live figures are the truth.
    if (this.watch?.watches(r.org.id))
      this.watch.charged(r.key, r.org, {
        keySpentAtMostNano: r.key.spentNano,
        balanceAtLeastNano: r.org.balanceNano,
      })
    if (r.counters) {
      // The periods the request was admitted in, whichever period it is now.
      for (const c of r.counters) {
        c.reservedNano -= r.amountNano
        c.spentNano += charged
      }
      const kc = r.keyCounter
      if (kc && r.key.budget && this.watch?.watches(r.org.id))
        this.watch.budgetCharged(r.key, r.org, {
          amountNano: r.key.budget.amountNano,
          spentAtMostNano: kc.spentNano,
          span: { startMs: kc.startMs, endMs: kc.endMs },
        })
    }
    return charged
  }

  /** Gives the whole reservation back: the request was not billed (it failed upstream, say). */
  release(r: Reservation): void {
    if (r.done) return
    r.done = true
    r.key.reservedNano -= r.amountNano
    r.org.reservedNano -= r.amountNano
    if (r.counters) for (const c of r.counters) c.reservedNano -= r.amountNano
  }
}

/**
 * The charge of a settled reservation, shared by both meters: the real cost, never below zero
 * and never above what was reserved; moved into the live spend and balance, and queued as the
 * request's ledger row.
 */
export function charge(ledger: LedgerWriter, r: Reservation, s: Settlement): NanoRub {
  const cost = s.costNano < 0n ? 0n : s.costNano
  const charged = cost > r.amountNano ? r.amountNano : cost
  r.key.spentNano += charged
  r.org.balanceNano -= charged
  r.key.lastUsedAt = Math.floor(s.endedAtMs / 1000)
  ledger.pushUsage(
    s,
    r.org.id,
    r.key.id,
    charged,
    charged < s.costNano ? `${s.outcome}:capped` : s.outcome,
    r.admittedAtMs,
  )
  return charged
}
