import type { NanoRub } from './money.ts'
import { zoneFormatter } from './time-zones.ts'

// Period budgets: a key's `budget` and its `end_user_budget` reset at the start of each day,
// week (ISO: Monday) or month, in an IANA time zone. A request's money counts into the period in
// which it was admitted (reserved), whenever it settles; a new period's counter starts at zero,
// so no moment exists in which two periods' money can be spent at once.

export type BudgetPeriod = 'day' | 'week' | 'month'
export const BUDGET_PERIODS: readonly BudgetPeriod[] = ['day', 'week', 'month']

/** A budget as a key carries it (both a key's own and the one each of its end users gets). */
export interface Budget {
  readonly amountNano: NanoRub
  readonly period: BudgetPeriod
  /** An IANA zone name (`Europe/Moscow`, `UTC`), checked with Intl when set. */
  readonly timezone: string
}

/** One period: [startMs, endMs) in Unix milliseconds. */
export interface PeriodSpan {
  readonly startMs: number
  readonly endMs: number
}

/** The longest end-user id a request may name (`user`, `metadata.user_id`, `x-tropa-end-user`). */
export const MAX_END_USER_LENGTH = 256
/** The header naming the end user; it wins over the body's field. */
export const END_USER_HEADER = 'x-tropa-end-user'
/** The header of a 402 for a spent budget: when it resets, Unix seconds. */
export const BUDGET_RESETS_HEADER = 'x-tropa-budget-resets-at'

/** Whether Intl knows the zone (an IANA name such as Europe/Moscow, or UTC). */
export function isBudgetTimeZone(tz: string): boolean {
  if (tz.length === 0 || tz.length > 64) return false
  try {
    zoneFormatter(tz)
    return true
  } catch {
    return false
  }
}

const WEEKDAYS: Record<string, number> = { Mon: 0, Tue: 1, Wed: 2, Thu: 3, Fri: 4, Sat: 5, Sun: 6 }

interface Wall {
  y: number
  m: number
  d: number
  h: number
  min: number
  s: number
  /** Days since Monday. */
  wd: number
}

function wallAt(f: Intl.DateTimeFormat, ms: number): Wall {
  const p: Record<string, string> = {}
  for (const part of f.formatToParts(ms)) if (part.type !== 'literal') p[part.type] = part.value
  return {
    y: Number(p.year),
    m: Number(p.month),
    d: Number(p.day),
    h: Number(p.hour),
    min: Number(p.minute),
    s: Number(p.second),
    wd: WEEKDAYS[p.weekday!] ?? 0,
  }
}

/** The zone's offset at `ms` (wall clock minus UTC), whole seconds. */
function offsetMs(f: Intl.DateTimeFormat, ms: number): number {
  const w = wallAt(f, ms)
  return Date.UTC(w.y, w.m - 1, w.d, w.h, w.min, w.s) - Math.floor(ms / 1000) * 1000
}

/**
 * The first instant whose wall clock in the zone reads local midnight of (y, m, d), or later that
 * day when midnight does not exist there (a DST change at midnight, as in some zones): the
 * period then starts when that day's clock starts.
 */
function midnight(f: Intl.DateTimeFormat, y: number, m: number, d: number): number {
  const local = Date.UTC(y, m - 1, d)
  // Two passes settle the offset (it may differ on either side of a change).
  let t = local - offsetMs(f, local)
  t = local - offsetMs(f, t)
  const w = wallAt(f, t)
  const sameDay = w.y === y && w.m === m && w.d === d
  if (sameDay && w.h === 0 && w.min === 0 && w.s === 0) {
    // An earlier instant may read the same midnight (a repeated hour around midnight): take it.
    const back = t - 3_600_000
    const wb = wallAt(f, back)
    if (wb.y === y && wb.m === m && wb.d === d && wb.h === 0 && wb.min === 0 && wb.s === 0) return back
    return t
  }
  // Midnight fell in a gap: step forward by minutes to the day's first instant (at most a few hours).
  let lo = t - 6 * 3_600_000
  let hi = t + 6 * 3_600_000
  const before = (ms: number) => {
    const x = wallAt(f, ms)
    return Date.UTC(x.y, x.m - 1, x.d) < local
  }
  while (hi - lo > 1000) {
    const mid = lo + Math.floor((hi - lo) / 2000) * 1000
    if (before(mid)) lo = mid
    else hi = mid
  }
  return hi
}

/** The period of `period` in zone `tz` that contains `nowMs`. DST-correct: boundaries are local midnights. */
export function periodAt(period: BudgetPeriod, tz: string, nowMs: number): PeriodSpan {
  const f = zoneFormatter(tz)
  const w = wallAt(f, nowMs)
  // Calendar arithmetic on the local date, with Date.UTC as a plain calendar.
  let start: [number, number, number]
  let end: [number, number, number]
  if (period === 'day') {
    start = [w.y, w.m, w.d]
    end = calendar(Date.UTC(w.y, w.m - 1, w.d + 1))
  } else if (period === 'week') {
    start = calendar(Date.UTC(w.y, w.m - 1, w.d - w.wd))
    end = calendar(Date.UTC(w.y, w.m - 1, w.d - w.wd + 7))
  } else {
    start = [w.y, w.m, 1]
    end = calendar(Date.UTC(w.y, w.m, 1))
  }
  return { startMs: midnight(f, ...start), endMs: midnight(f, ...end) }
}

function calendar(utcMs: number): [number, number, number] {
  const d = new Date(utcMs)
  return [d.getUTCFullYear(), d.getUTCMonth() + 1, d.getUTCDate()]
}

/**
 * The current period of each (period, zone) pair, computed once per period: a request on a
 * budgeted key asks for it, and Intl is slow next to a comparison.
 */
export class PeriodCache {
  private readonly spans = new Map<string, PeriodSpan>()

  at(period: BudgetPeriod, tz: string, nowMs: number): PeriodSpan {
    const id = `${period} ${tz}`
    const s = this.spans.get(id)
    if (s !== undefined && nowMs >= s.startMs && nowMs < s.endMs) return s
    const next = periodAt(period, tz, nowMs)
    if (this.spans.size >= 4096) this.spans.clear()
    this.spans.set(id, next)
    return next
  }
}

/** What the request knows of its period budgets at admission, and what it holds in them. */
export interface BudgetHold {
  /** Key budget's period, when the key has one. */
  readonly keySpan: PeriodSpan | undefined
  /** End-user budget's period, when the key has one and the request names an end user. */
  readonly userSpan: PeriodSpan | undefined
}

/** A budget's spend in one period: settled charges admitted in it, and holds of requests in flight. */
export class PeriodCounter {
  spentNano: NanoRub = 0n
  reservedNano: NanoRub = 0n
  constructor(
    readonly startMs: number,
    readonly endMs: number,
  ) {}
}

/**
 * The end users' counters of one node, bounded: past `max` the least recently used one with
 * nothing in flight goes (its spend is in the ledger once flushed, and is read back from it when
 * that end user comes again). Counters with requests in flight are never dropped, so the map
 * exceeds `max` only by end users with a request in flight at once.
 */
export class CounterLru {
  private readonly map = new Map<string, PeriodCounter>()
  constructor(private readonly max: number) {}

  get size(): number {
    return this.map.size
  }

  get(id: string, nowMs: number): PeriodCounter | undefined {
    const c = this.map.get(id)
    if (c === undefined) return undefined
    if (nowMs >= c.endMs && c.reservedNano === 0n) {
      this.map.delete(id)
      return undefined
    }
    // Most recently used last.
    this.map.delete(id)
    this.map.set(id, c)
    return c
  }

  set(id: string, c: PeriodCounter): void {
    this.map.set(id, c)
    if (this.map.size <= this.max) return
    let scanned = 0
    for (const [k, v] of this.map) {
      if (++scanned > 64 || this.map.size <= this.max) break
      if (v.reservedNano === 0n && v !== c) this.map.delete(k)
    }
  }
}
