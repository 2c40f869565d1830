import { expect, test } from 'bun:test'
import type { BenchReport } from '../../bench/report.ts'
import { runBenchScript } from '../helpers/bench-script.ts'

/**
 * `bun run bench --quick` against direct, the bare proxy (as it is, and reading and writing the
 * JSON) and Tropa: the whole pipeline runs and produces a complete table and JSON. No speed figure
 * is asserted (CI machines vary).
 */
test(
  'quick benchmark of direct, bare, bare-json, Tropa and Tropa on PostgreSQL + Redis produces a complete report',
  async () => {
    const env: Record<string, string> = {}
    for (const [k, v] of Object.entries(process.env))
      if (v !== undefined && !k.startsWith('TROPA_')) env[k] = v
    const { out, json: r } = await runBenchScript<BenchReport>(
      ['bench/run.ts', '--quick', '--only', 'direct,bare,bare-json,tropa,tropa-pg'],
      env,
    )

    for (const heading of ['Non-streaming, open loop', 'Streaming:', 'Memory:', 'Startup:', 'Targets'])
      expect(out).toContain(heading)
    // The warm-up each fresh process gets before anything is recorded, kept and said in the report.
    expect(r.settings.warm).toEqual({ ms: 300, rate: 300, streamMs: 300 })
    expect(out).toContain('first warmed for 0.3 s at 300 RPS, nothing recorded')
    expect(out).toContain('Before it, 0.3 s of the same streams, not recorded.')

    expect(r.contestants.map((c) => c.name)).toEqual(['direct', 'bare', 'bare-json', 'tropa', 'tropa-pg'])
    for (const c of r.contestants) {
      expect(c.available).toBe(true)
      expect(c.notes.filter((n) => n.includes('failed'))).toEqual([])
      // The first ladder step is measured with answers, held or not.
      expect(c.steps[0]?.rate).toBe(500)
      expect(c.steps[0]!.ok).toBeGreaterThan(0)
      expect(c.stream?.ok ?? 0).toBeGreaterThan(0)
      expect(c.stream!.itl.count).toBeGreaterThan(0)
      // The stream fleet stamps its chunks, and every path passes the stamps through.
      expect(c.stream!.addedGap?.count ?? 0).toBeGreaterThan(0)
      expect(c.memory.length).toBe(r.settings.memoryLevels.length)
      for (const m of c.memory) expect(m.opened).toBe(m.streams)
      if (r.settings.wrk !== 'not installed') expect(c.wrk?.requests ?? 0).toBeGreaterThan(0)
    }
    expect(r.ready?.runs).toBe(1)
    expect(r.targets.length).toBe(16)
    // Issue #24's six, each with its figures measured (a quick run's added p99 may still be
    // noise with no ratio, so the verdict itself may be n/a).
    const i24 = r.targets.filter((t) => t.target.startsWith('#24:'))
    expect(i24).toHaveLength(6)
    // (wrk's figure needs wrk: .ci/run installs it; a machine without it reads n/a there.)
    for (const t of i24)
      if (!(r.settings.wrk === 'not installed' && t.target.includes('wrk raw')))
        expect({ target: t.target, value: t.value }).not.toEqual({ target: t.target, value: 'n/a' })
    expect(Object.keys(r.headline)).toContain('tropa_over_bare_added_p50_2000')
  },
  { timeout: 120_000 },
)
