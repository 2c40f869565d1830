import { expect, test } from 'bun:test'
import { runBenchScript } from '../helpers/bench-script.ts'

/**
 * `bun run bench:routing-http`, shortened: two policies over real HTTP against a real simulator
 * fleet process, every request answered, the table and the JSON complete. No figure is asserted
 * (CI machines vary); the comparison itself is in BENCHMARKS.md.
 */
test(
  'the HTTP routing benchmark runs two policies end to end',
  async () => {
    const { out, json: r } = await runBenchScript<{
      rows: { policy: string; sent: number; measured: number; errors: number; p99Ms: number }[]
    }>(['bench/routing-http.ts', '--seconds', '3', '--load', '0.3', '--policies', 'least-busy,tropa'])
    expect(out).toContain('| tropa |')
    expect(r.rows.map((x) => x.policy)).toEqual(['least-busy', 'tropa'])
    for (const row of r.rows) {
      expect(row.errors).toBe(0)
      expect(row.measured).toBeGreaterThan(0)
      expect(row.measured).toBeLessThanOrEqual(row.sent)
      expect(Number.isFinite(row.p99Ms)).toBe(true)
    }
  },
  { timeout: 60_000 },
)
