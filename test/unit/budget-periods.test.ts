import { expect, test } from 'bun:test'
import { isBudgetTimeZone, PeriodCache, periodAt } from '../../src/billing/budgets.ts'

// Budget periods are local days, ISO weeks (from Monday) and months in an IANA zone, whatever
// the zone's daylight saving does.

const local = (tz: string, ms: number) =>
  new Intl.DateTimeFormat('en-CA', {
    timeZone: tz,
    year: 'numeric',
    month: '2-digit',
    day: '2-digit',
    hour: '2-digit',
    minute: '2-digit',
    hourCycle: 'h23',
    weekday: 'short',
  }).format(ms)

test('a day across a DST change in New York is 23 hours, starting at local midnight', () => {
  const at = Date.parse('2026-03-08T15:00:00Z')
  const span = periodAt('day', 'America/New_York', at)
  expect(new Date(span.startMs).toISOString()).toBe('2026-03-08T05:00:00.000Z')
  expect(new Date(span.endMs).toISOString()).toBe('2026-03-09T04:00:00.000Z')
  const autumn = periodAt('day', 'America/New_York', Date.parse('2026-11-01T12:00:00Z'))
  expect(autumn.endMs - autumn.startMs).toBe(25 * 3_600_000)
})

test('a month in Berlin spans its DST change; a week in Moscow starts on Monday', () => {
  const m = periodAt('month', 'Europe/Berlin', Date.parse('2026-03-15T12:00:00Z'))
  expect(new Date(m.startMs).toISOString()).toBe('2026-02-28T23:00:00.000Z')
  expect(new Date(m.endMs).toISOString()).toBe('2026-03-31T22:00:00.000Z')
  // Thursday 2026-11-26 in Moscow (UTC+3): the week is Monday 23rd to Monday 30th, local midnights.
  const w = periodAt('week', 'Europe/Moscow', Date.parse('2026-11-26T10:00:00Z'))
  expect(new Date(w.startMs).toISOString()).toBe('2026-11-22T21:00:00.000Z')
  expect(new Date(w.endMs).toISOString()).toBe('2026-11-29T21:00:00.000Z')
  // A Sunday late evening in Moscow is still that week; a Monday just after midnight the next.
  expect(periodAt('week', 'Europe/Moscow', w.endMs - 1).startMs).toBe(w.startMs)
  expect(periodAt('week', 'Europe/Moscow', w.endMs).startMs).toBe(w.endMs)
  // December to January crosses the year.
  const dec = periodAt('month', 'UTC', Date.parse('2026-12-31T23:59:59Z'))
  expect(new Date(dec.endMs).toISOString()).toBe('2027-01-01T00:00:00.000Z')
})

test('every day of a year in zones with DST (at midnight too): the period holds the instant and starts the local date', () => {
  for (const tz of [
    'America/Santiago',
    'America/Havana',
    'Europe/London',
    'Australia/Lord_Howe',
    'Asia/Kolkata',
  ]) {
    for (
      let t = Date.parse('2026-01-01T00:00:00Z');
      t < Date.parse('2027-01-01T00:00:00Z');
      t += 86_400_000 / 3
    ) {
      for (const period of ['day', 'week', 'month'] as const) {
        const s = periodAt(period, tz, t)
        expect(s.startMs).toBeLessThanOrEqual(t)
        expect(s.endMs).toBeGreaterThan(t)
        // The instant before the start is another local date; the start is no later than its date's first minute.
        expect(local(tz, s.startMs - 1).slice(0, 10)).not.toBe(local(tz, s.startMs).slice(0, 10))
        if (period === 'week') expect(local(tz, s.startMs)).toStartWith('Mon')
        if (period === 'month') expect(local(tz, s.startMs)).toMatch(/-01,/)
      }
    }
  }
})

test('the period cache answers the same span until the period ends, then the next', () => {
  const cache = new PeriodCache()
  const t = Date.parse('2026-05-10T20:00:00Z')
  const a = cache.at('day', 'Europe/Moscow', t)
  expect(cache.at('day', 'Europe/Moscow', t + 1000)).toBe(a)
  const b = cache.at('day', 'Europe/Moscow', a.endMs)
  expect(b.startMs).toBe(a.endMs)
})

test('time zones are checked with Intl', () => {
  expect(isBudgetTimeZone('Europe/Moscow')).toBe(true)
  expect(isBudgetTimeZone('UTC')).toBe(true)
  expect(isBudgetTimeZone('Mars/Olympus')).toBe(false)
  expect(isBudgetTimeZone('')).toBe(false)
})
