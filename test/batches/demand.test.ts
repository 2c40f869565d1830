import { expect, test } from 'bun:test'
import { Demand } from '../../src/batches/demand.ts'

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
