import { expect, test } from 'bun:test'
import { runBenchScript } from '../helpers/bench-script.ts'

/**
 * `bun run bench:routing-http`, shortened: three policies (one of the new peers, llm-d's picker,
 * with its own /metrics scrape) over real HTTP against a real simulator fleet process of
 * identical nodes, node 0 stalled for 2 s of the 5; every request answered (a stall is no
 * error), the table and the JSON complete, the stalled node's count reported for each policy.
 * No figure is asserted (CI machines vary); the comparison itself is in BENCHMARKS.md.
 */
test(
  'the HTTP routing benchmark runs three policies end to end, with a stall',
  async () => {
    const { out, json: r } = await runBenchScript<{
      fleet: string
      stall: { atS: number; forS: number }
      ratios: { mean: number; p99: number }
      rows: {
        policy: string
        sent: number
        measured: number
        errors: number
        p99Ms: number
        sentToStalled: number | null
      }[]
    }>([
      'bench/routing-http.ts',
      '--seconds',
      '5',
      '--load',
      '0.3',
      '--fleet',
      'identical',
      '--stall',
      '--stall-seconds',
      '2',
      '--policies',
      'least-busy,llm-d-epp,tropa',
    ])
    expect(out).toContain('| tropa |')
    expect(out).toContain('tropa / best peer')
    expect(r.fleet).toBe('identical')
    expect(r.stall).toEqual({ atS: 2, forS: 2 })
    expect(r.rows.map((x) => x.policy)).toEqual(['least-busy', 'llm-d-epp', 'tropa'])
    for (const row of r.rows) {
      expect(row.errors).toBe(0)
      expect(row.measured).toBeGreaterThan(0)
      expect(row.measured).toBeLessThanOrEqual(row.sent)
      expect(Number.isFinite(row.p99Ms)).toBe(true)
      expect(row.sentToStalled).toBeGreaterThanOrEqual(0)
    }
    expect(Number.isFinite(r.ratios.mean) && Number.isFinite(r.ratios.p99)).toBe(true)
  },
  { timeout: 60_000 },
)
