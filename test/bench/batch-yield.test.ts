import { expect, test } from 'bun:test'
import type { BatchYieldReport } from '../../bench/batch-yield.ts'
import { runBenchScript } from '../helpers/bench-script.ts'

/**
 * `bun bench/batch-yield.ts --quick`: every scenario ran with and without a batch, every
 * interactive request was answered or counted as refused, the batch ran alongside, and every
 * target has a value. No speed figure is asserted (machines vary; BENCHMARKS.md has the runs).
 */
test(
  'the batch-yield benchmark measures interactive traffic with and without a batch, and the batch in valleys and peaks',
  async () => {
    const { out, json: r } = await runBenchScript<BatchYieldReport>(['bench/batch-yield.ts', '--quick'])
    expect(out).toContain('| scenario |')
    expect(r.capacity).toBeGreaterThan(0)
    expect(r.idleRate).toBeGreaterThan(0)
    expect(r.results.map((x) => x.name)).toEqual(['load 50%', 'load 80%', 'bursts 90/10%'])
    for (const x of r.results) {
      expect(x.without.requests).toBeGreaterThan(10)
      expect(x.with.requests).toBe(x.without.requests) // the same seeded arrivals
      expect(Number.isFinite(x.with.ttftP99) && Number.isFinite(x.without.ttftP99)).toBe(true)
      expect(x.early).toBe(false) // the batch was still running when the scenario ended
    }
    // The batch's rate over each phase, and over each phase's second half (after the hand-over).
    expect(Object.keys(r.results[2]!.rates).sort()).toEqual([
      'peak',
      'peak (second half)',
      'valley',
      'valley (second half)',
    ])
    for (const v of Object.values(r.results[2]!.rates)) expect(Number.isFinite(v)).toBe(true)
    // Per phase of the bursts: both conditions had requests in each.
    const bursts = r.results[2]!.phases
    expect(Object.keys(bursts).sort()).toEqual(['peak', 'valley'])
    for (const ph of Object.values(bursts)) {
      expect(ph.without.requests).toBeGreaterThan(0)
      expect(ph.with.requests).toBe(ph.without.requests)
    }
    expect(r.reps).toBe(1)
    for (const c of r.checks) expect(Number.isFinite(c.value)).toBe(true)
  },
  { timeout: 240_000 },
)
