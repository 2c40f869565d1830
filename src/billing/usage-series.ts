import type { UsageHourSum } from '../storage/store.ts'
import type { NanoRub } from './money.ts'
import { zoneFormatter } from './time-zones.ts'

// GET /v1/usage/series: the store keeps billed usage per UTC hour (usage_hours); these functions
// cut those hours into hour or day buckets, days in a time zone. Zones whose offset is not whole
// hours (India's +05:30, say) are refused: an hour of usage would straddle two of their days.

export type SeriesBucket = 'hour' | 'day'

/** What a bucket (or one group of it) sums. */
export interface UsageSums {
  requests: number
  promptTokens: number
  completionTokens: number
  cachedTokens: number
  costNano: NanoRub
}

export interface SeriesPoint {
  /** Unix seconds: the bucket is [start, end). */
  readonly start: number
  readonly end: number
  /** The bucket's local date (day buckets), YYYY-MM-DD. */
  readonly date: string | undefined
  readonly total: UsageSums
  /** Per key or model (null: rows without one), in the order first met. */
  readonly groups: Map<string | null, UsageSums>
}

const HOUR = 3600
const DAY = 86_400

/** Seconds to add to a UTC instant for the zone's wall clock. */
function offsetAt(f: Intl.DateTimeFormat, sec: number): number {
  const p: Record<string, number> = {}
  for (const part of f.formatToParts(sec * 1000))
    if (part.type !== 'literal') p[part.type] = Number(part.value)
  return Date.UTC(p.year!, p.month! - 1, p.day!, p.hour!, p.minute!, p.second!) / 1000 - sec
}

/** Whether the runtime knows the zone (an IANA name such as Europe/Moscow, or UTC). */
export function isTimeZone(tz: string): boolean {
  try {
    zoneFormatter(tz)
    return true
  } catch {
    return false
  }
}

/**
 * The zone's offset for each hour of [fromHour, toHour) (both on hour boundaries). The offset is
 * read once a day and per hour only across a day in which it changed (zones change it at most
 * twice a year), so a year of hours costs a few hundred reads of the zone's rules, not 8,760.
 */
function hourOffsets(tz: string, fromHour: number, toHour: number): Int32Array {
  const n = (toHour - fromHour) / HOUR
  const out = new Int32Array(n)
  if (tz === 'UTC') return out
  const f = zoneFormatter(tz)
  for (let i = 0; i < n; i += 24) {
    const end = Math.min(n, i + 24)
    const a = offsetAt(f, fromHour + i * HOUR)
    const b = offsetAt(f, fromHour + (end - 1) * HOUR)
    for (let j = i; j < end; j++) out[j] = a === b || j === i ? a : offsetAt(f, fromHour + j * HOUR)
  }
  return out
}

/** A zone with an offset that is not whole hours in [fromHour, toHour) (unsupported), or undefined. */
export function fractionalOffset(tz: string, fromHour: number, toHour: number): number | undefined {
  for (const off of hourOffsets(tz, fromHour, toHour)) if (off % HOUR !== 0) return off
  return undefined
}

/**
 * The hours a series over [fromSec, toSec) reads: whole buckets, so `from` moves back to its
 * bucket's start and `to` on to its bucket's end (a local midnight for days).
 */
export function seriesHours(
  fromSec: number,
  toSec: number,
  bucket: SeriesBucket,
  tz: string,
): { fromHour: number; toHour: number } {
  let fromHour = Math.floor(fromSec / HOUR) * HOUR
  let toHour = Math.ceil(toSec / HOUR) * HOUR
  if (toHour === fromHour) toHour += HOUR
  if (bucket === 'day') {
    // A local day is at most 25 hours: step out to the midnights around the range.
    const f = tz === 'UTC' ? undefined : zoneFormatter(tz)
    const local = (h: number) => h + (f ? offsetAt(f, h) : 0)
    for (let i = 0; i < 26 && local(fromHour) % DAY !== 0; i++) fromHour -= HOUR
    for (let i = 0; i < 26 && local(toHour) % DAY !== 0; i++) toHour += HOUR
  }
  return { fromHour, toHour }
}

const zero = (): UsageSums => ({
  requests: 0,
  promptTokens: 0,
  completionTokens: 0,
  cachedTokens: 0,
  costNano: 0n,
})

function add(to: UsageSums, h: UsageHourSum): void {
  to.requests += h.requests
  to.promptTokens += h.promptTokens
  to.completionTokens += h.completionTokens
  to.cachedTokens += h.cachedTokens
  to.costNano += h.costNano
}

/**
 * The buckets of [fromHour, toHour) (from seriesHours), every one present (empty ones are zeros),
 * with the hours' sums (ordered by hour, as the store returns them) added in.
 */
export function usageSeries(
  hours: readonly UsageHourSum[],
  fromHour: number,
  toHour: number,
  bucket: SeriesBucket,
  tz: string,
): SeriesPoint[] {
  const offsets = hourOffsets(tz, fromHour, toHour)
  const points: SeriesPoint[] = []
  /** The bucket of each hour, by its index from fromHour. */
  const pointOf = new Int32Array(offsets.length)
  let day = Number.NaN
  for (let i = 0; i < offsets.length; i++) {
    const h = fromHour + i * HOUR
    const localDay = Math.floor((h + offsets[i]!) / DAY)
    if (bucket === 'hour' || localDay !== day) {
      if (points.length > 0) (points.at(-1) as { end: number }).end = h
      points.push({
        start: h,
        end: h + HOUR,
        date: bucket === 'day' ? new Date(localDay * DAY * 1000).toISOString().slice(0, 10) : undefined,
        total: zero(),
        groups: new Map(),
      })
      day = localDay
    }
    pointOf[i] = points.length - 1
  }
  if (points.length > 0) (points.at(-1) as { end: number }).end = toHour
  for (const h of hours) {
    const i = (h.hourStart - fromHour) / HOUR
    if (!(i >= 0 && i < pointOf.length)) continue
    const p = points[pointOf[i]!]!
    add(p.total, h)
    let g = p.groups.get(h.group)
    if (!g) {
      g = zero()
      p.groups.set(h.group, g)
    }
    add(g, h)
  }
  return points
}
