import { describe, expect, test } from 'bun:test'
import { addedLatency, LatencyHistogram } from '../../bench/histogram.ts'

/** Within HDR's guarantee at three significant digits: 0.1% of the value. */
function near(actual: number, expected: number) {
  expect(Math.abs(actual - expected)).toBeLessThanOrEqual(expected * 0.001 + 1e-9)
}

describe('LatencyHistogram', () => {
  test('percentiles of 1..10000 us are the order statistics', () => {
    const h = new LatencyHistogram()
    for (let us = 1; us <= 10_000; us++) h.recordUs(us)
    const s = h.summary()
    expect(s.count).toBe(10_000)
    // Values are in ms: 5000 us = 5 ms.
    near(s.p50, 5)
    near(s.p90, 9)
    near(s.p99, 9.9)
    near(s.p999, 9.99)
    near(s.max, 10)
    near(s.mean, 5.0005)
  })

  test('a skewed sample: 99 fast, 1 slow', () => {
    const h = new LatencyHistogram()
    for (let i = 0; i < 990; i++) h.recordMs(1)
    for (let i = 0; i < 10; i++) h.recordMs(250)
    const s = h.summary()
    near(s.p50, 1)
    near(s.p99, 1)
    near(s.p999, 250)
    near(s.max, 250)
  })

  test('records milliseconds at microsecond resolution and clamps the impossible', () => {
    const h = new LatencyHistogram()
    h.recordMs(1.5)
    near(h.percentileMs(50), 1.5)
    h.recordUs(-5)
    expect(h.percentileMs(0)).toBe(0)
    h.recordMs(10 * 60_000)
    near(h.summary().max, 60_000)
  })

  test('empty is all zeros; add merges', () => {
    const a = new LatencyHistogram()
    expect(a.summary()).toEqual({ count: 0, mean: 0, p50: 0, p90: 0, p99: 0, p999: 0, max: 0 })
    const b = new LatencyHistogram()
    for (let i = 1; i <= 100; i++) a.recordUs(i)
    for (let i = 101; i <= 200; i++) b.recordUs(i)
    a.add(b)
    expect(a.count).toBe(200)
    near(a.percentileMs(50), 0.1)
  })

  test('added latency is a difference of percentiles', () => {
    const through = { count: 1, mean: 0, p50: 1.2, p90: 0, p99: 4, p999: 9, max: 0 }
    const direct = { count: 1, mean: 0, p50: 1, p90: 0, p99: 3, p999: 5, max: 0 }
    const a = addedLatency(through, direct)
    expect(a.p50).toBeCloseTo(0.2, 10)
    expect(a.p99).toBeCloseTo(1, 10)
    expect(a.p999).toBeCloseTo(4, 10)
  })
})
