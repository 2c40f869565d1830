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

/**
 * The same with node 0 slowed down (`--slow 4`) rather than stalled: it answers all along, so
 * every request is answered under every policy, and round-robin, which ignores speed, keeps
 * sending it requests through the slowdown (the count of sends into the fault is taken).
 */
test(
  'the HTTP routing benchmark runs with a slowed node',
  async () => {
    const { out, json: r } = await runBenchScript<{
      stall: { atS: number; forS: number; factor?: number }
      rows: { policy: string; sent: number; measured: number; errors: number; sentToStalled: number | null }[]
    }>([
      'bench/routing-http.ts',
      '--seconds',
      '8',
      '--load',
      '0.5',
      '--fleet',
      'identical',
      '--slow',
      '4',
      '--stall-seconds',
      '4',
      '--policies',
      'round-robin,tropa',
    ])
    expect(out).toContain('4x slower')
    expect(r.stall).toEqual({ atS: 3.2, forS: 4, factor: 4 })
    expect(r.rows.map((x) => x.policy)).toEqual(['round-robin', 'tropa'])
    for (const row of r.rows) {
      expect(row.errors).toBe(0)
      expect(row.measured).toBeGreaterThan(0)
      expect(row.sentToStalled).toBeGreaterThanOrEqual(0)
    }
    // 2 s of the fault past its first 2 s at about 7 requests a second, a quarter of them to node 0.
    expect(r.rows[0]!.sentToStalled).toBeGreaterThan(0)
  },
  { timeout: 60_000 },
)
