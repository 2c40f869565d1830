import { expect, test } from 'bun:test'
import { AFTER_PEAK_MS, Demand, LOW_FOR_MS, PEAK_DEMAND, ValleyEntry } from '../../src/batches/demand.ts'

/** Requests arriving every `gapMs` from `fromMs` to `toMs`, each in flight `holdMs`: the in-flight count at every start and end, in order. */
function traffic(fromMs: number, toMs: number, gapMs: number, holdMs: number) {
  const events: { atMs: number; d: number }[] = []
  for (let t = fromMs; t < toMs; t += gapMs) events.push({ atMs: t, d: 1 }, { atMs: t + holdMs, d: -1 })
  return events.sort((a, b) => a.atMs - b.atMs || a.d - b.d)
}

test('the demand is what the arrivals settle at, and it falls with the arrivals, before the requests in flight drain', () => {
  const demand = new Demand()
  // 40 requests a second, each in flight for 1 s: 40 in flight over 100 slots, for 10 s; then 4 a second.
  const events = [...traffic(0, 10_000, 25, 1000), ...traffic(10_000, 20_000, 250, 1000)].sort(
    (a, b) => a.atMs - b.atMs || a.d - b.d,
  )
  let inFlight = 0
  let i = 0
  const runUntil = (ms: number) => {
    for (; i < events.length && events[i]!.atMs <= ms; i++) {
      inFlight += events[i]!.d
      demand.observe(events[i]!.atMs, inFlight)
    }
  }
  // Not known before 20 arrivals and 2 s.
  runUntil(400)
  expect(demand.load(400, 100)).toBeUndefined()
  runUntil(1_500)
  expect(demand.load(1_500, 100)).toBeUndefined()
  runUntil(9_000)
  expect(demand.load(9_000, 100)!).toBeCloseTo(0.4, 1)
  // 600 ms into the lull: about 16 of the peak's requests still in flight (a load of 0.16 and
  // more), the arrivals' demand already near 0.04.
  runUntil(10_600)
  expect(inFlight).toBeGreaterThan(15)
  expect(demand.load(10_600, 100)!).toBeLessThan(0.08)
  // Over a whole second the peak's last arrivals still count (about 16 of them and 3 of the lull's).
  expect(demand.load(10_600, 100, 1000)!).toBeGreaterThan(0.15)
  runUntil(11_200)
  expect(demand.load(11_200, 100, 1000)!).toBeLessThan(0.08)
  runUntil(19_000)
  expect(demand.load(19_000, 100)!).toBeCloseTo(0.04, 1)
  expect(demand.load(19_000, 100, 1000)!).toBeCloseTo(0.04, 1)
  // No window is longer than a second: older arrivals are gone.
  expect(demand.load(19_000, 100, 5000)).toBe(demand.load(19_000, 100, 1000))
})

test('requests first seen all at once (a first report) have no time in flight: the demand waits to know it', () => {
  const demand = new Demand()
  demand.observe(1_000, 0)
  // 50 requests in flight appear in one report.
  demand.observe(1_001, 50)
  expect(demand.load(1_030, 100)).toBeUndefined()
  // Then 50 a second, each in flight for 1 s: 50 in flight.
  for (let t = 1_020; t <= 4_000; t += 20) {
    demand.observe(t, 51)
    demand.observe(t + 1, 50)
  }
  expect(demand.load(4_001, 100)!).toBeGreaterThan(0.3)
})

test('arrivals out of the window leave it as new ones come, however long nobody reads the demand', () => {
  const demand = new Demand()
  let inFlight = 0
  // 120,000 arrivals over two hours, never read.
  for (let t = 0; t < 7_200_000; t += 60) {
    demand.observe(t, ++inFlight)
    demand.observe(t + 30, --inFlight)
  }
  // About 8 in the last half second: a demand of 8 x 2 / s x 0.03 s over 1 slot.
  expect(demand.load(7_200_000, 1)!).toBeCloseTo(0.5, 1)
})

test('a valley is entered right after a peak on the half-second demand, while the demand over a second still reads the peak', () => {
  const entry = new ValleyEntry()
  const fill = 0.1
  // A peak: the demand over a second at 0.6, the half second too.
  for (let t = 0; t <= 5_000; t += 50) expect(entry.enters(t, 0.6, 0.6, fill)).toBe(false)
  // The arrivals stop at 5 s: the half second empties first, the second still holds the peak's.
  expect(entry.enters(5_300, 0.5, 0.2, fill)).toBe(false)
  expect(entry.enters(5_500, 0.3, 0.09, fill)).toBe(true)
  // The same readings with no peak behind them: no valley (the second is over half of fill).
  const fresh = new ValleyEntry()
  for (let t = 0; t <= 5_000; t += 50) fresh.enters(t, 0.25, 0.25, fill)
  expect(fresh.enters(5_500, 0.3, 0.09, fill)).toBe(false)
  // A peak read over AFTER_PEAK_MS ago no longer lets the half second decide.
  const late = new ValleyEntry()
  expect(late.enters(0, PEAK_DEMAND, PEAK_DEMAND, fill)).toBe(false)
  expect(late.enters(AFTER_PEAK_MS - 1, 0.2, 0.05, fill)).toBe(true)
  expect(late.enters(AFTER_PEAK_MS + 50, 0.2, 0.05, fill)).toBe(false)
})

test('otherwise a valley is entered only once the demand over a second has stayed at most half of fill_load for LOW_FOR_MS', () => {
  const entry = new ValleyEntry()
  const fill = 0.1
  // A steady load around 0.25, then a lull: the second reads 0.04 for less than LOW_FOR_MS.
  for (let t = 0; t <= 3_000; t += 50) entry.enters(t, 0.25, 0.25, fill)
  let t = 3_000
  for (; t < 3_000 + LOW_FOR_MS - 100; t += 50) expect(entry.enters(t, 0.04, 0.02, fill)).toBe(false)
  // The load comes back before the lull has lasted: the spell starts anew after it.
  expect(entry.enters(t, 0.08, 0.15, fill)).toBe(false)
  const from = t + 50
  for (t = from; t < from + LOW_FOR_MS; t += 50) expect(entry.enters(t, 0.04, 0.02, fill)).toBe(false)
  expect(entry.enters(from + LOW_FOR_MS, 0.04, 0.02, fill)).toBe(true)
  // Forgotten (no reading for a while): the spell starts anew.
  entry.forget()
  expect(entry.enters(from + LOW_FOR_MS + 50, 0.04, 0.02, fill)).toBe(false)
})
