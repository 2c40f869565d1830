import { expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'

const root = resolve(import.meta.dir, '../..')

/**
 * `bun run bench:routing-http`, shortened: two policies over real HTTP against a real simulator
 * fleet process, every request answered, the table and the JSON complete. No figure is asserted
 * (CI machines vary); the comparison itself is in BENCHMARKS.md.
 */
test(
  'the HTTP routing benchmark runs two policies end to end',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tropa-routing-http-smoke-'))
    try {
      const json = join(dir, 'out.json')
      const proc = Bun.spawn(
        [
          process.execPath,
          'bench/routing-http.ts',
          '--seconds',
          '3',
          '--load',
          '0.3',
          '--policies',
          'least-busy,tropa',
          '--json',
          json,
        ],
        { cwd: root, stdout: 'pipe', stderr: 'pipe' },
      )
      const [out, err] = await Promise.all([
        new Response(proc.stdout).text(),
        new Response(proc.stderr).text(),
      ])
      const code = await proc.exited
      if (code !== 0) console.error(err.slice(-3000))
      expect(code).toBe(0)
      expect(out).toContain('| tropa |')
      const r = JSON.parse(readFileSync(json, 'utf8')) as {
        rows: { policy: string; sent: number; measured: number; errors: number; p99Ms: number }[]
      }
      expect(r.rows.map((x) => x.policy)).toEqual(['least-busy', 'tropa'])
      for (const row of r.rows) {
        expect(row.errors).toBe(0)
        expect(row.measured).toBeGreaterThan(0)
        expect(row.measured).toBeLessThanOrEqual(row.sent)
        expect(Number.isFinite(row.p99Ms)).toBe(true)
      }
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  },
  { timeout: 60_000 },
)
