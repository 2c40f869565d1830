import { insufficientBalance, keyLimitReached } from '../errors.ts'
import type { LiveKey, LiveOrg } from '../identity/live.ts'
import type { LedgerEntry } from '../storage/store.ts'
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
}

export type Settlement = Omit<LedgerEntry, 'kind' | 'orgId' | 'keyId' | 'costNano'> & {
  readonly costNano: NanoRub
}

/** Admission and settlement of money: on one node in memory, across nodes in Redis. */
export interface MoneyMeter {
  /** Holds the worst-case cost, or throws 402 (key limit first, then balance). */
  reserve(key: LiveKey, org: LiveOrg, amountNano: NanoRub): Reservation | Promise<Reservation>
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

  constructor(
    private readonly ledger: LedgerWriter,
    /** false only to measure the money path's own cost in benchmarks: nothing is charged. */
    private readonly enabled = true,
  ) {}

  /** Holds the worst-case cost, or throws 402 (key limit first, then balance). */
  reserve(key: LiveKey, org: LiveOrg, amountNano: NanoRub): Reservation {
    if (!this.enabled) return { key, org, amountNano: 0n, done: false }
    // The ledger cannot take more unwritten rows: serving now would spend without a record.
    if (this.ledger.full()) throw ledgerFullError(this.ledger.lastError)
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
    return charged
  }

  /** Gives the whole reservation back: the request was not billed (it failed upstream, say). */
  release(r: Reservation): void {
    if (r.done) return
    r.done = true
    r.key.reservedNano -= r.amountNano
    r.org.reservedNano -= r.amountNano
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
  ledger.pushUsage(s, r.org.id, r.key.id, charged, charged < s.costNano ? `${s.outcome}:capped` : s.outcome)
  return charged
}
