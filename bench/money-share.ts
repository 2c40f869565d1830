/**
 * `bun run bench:money`: what the money path (admission with reservation, settlement, ledger)
 * costs the router, measured more tightly than the one wrk run per contestant of `bun run
 * bench`: Tropa with billing and Tropa with billing off run side by side on one simulated
 * fleet, and wrk alternates between them (on, off, on, off, ...) so that drifts of a noisy
 * machine fall on both. Per-request cost is 1 / throughput; the money path's share is
 * cost(on) / cost(off) - 1, from the medians. `--rounds N` (default 7), `--seconds S` (default
 * 5), `--build` compiles the working tree instead of using dist/tropa.
 */
import { mkdirSync, mkdtempSync } from 'node:fs'
import os from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { chatBody } from './load.ts'
import { killAll } from './proc.ts'
import { type RunContext, startContestant, startFleet, tropaExecutable } from './targets.ts'
import { runWrk, wrkPath } from './wrk.ts'

const repoRoot = resolve(import.meta.dir, '..')
const log = (m: string) => console.error(`[money] ${m}`)

async function main() {
  const { values } = parseArgs({
    options: { rounds: { type: 'string' }, seconds: { type: 'string' }, build: { type: 'boolean' } },
  })
  if (!wrkPath()) throw new Error('wrk is not installed (apt-get install wrk)')
  const rounds = Number(values.rounds ?? 7)
  const seconds = Number(values.seconds ?? 5)
  const dir = mkdtempSync(join(os.tmpdir(), 'tropa-money-'))
  const logDir = join(dir, 'logs')
  mkdirSync(logDir)
  const exe = await tropaExecutable(repoRoot, dir, log, values.build === true)
  const fleet = await startFleet(repoRoot, dir, logDir, { nodesPerFleet: 3, streamItlMs: 5, holdItlMs: 1000 })
  const ctx: RunContext = { repoRoot, dir, logDir, fleet: fleet.urls, fleetPid: fleet.child.pid }
  const on = await startContestant('tropa', ctx, exe.path, '')
  const off = await startContestant('tropa-nobill', ctx, exe.path, '')
  const rps: Record<'on' | 'off', number[]> = { on: [], off: [] }
  try {
    const wrk = (c: typeof on) =>
      runWrk({
        url: c.wrkUrl('fast'),
        headers: c.endpoint('fast').headers,
        body: chatBody(c.model('fast'), { stream: false, maxTokens: 16, seed: 1 }),
        connections: 64,
        threads: 1,
        durationS: seconds,
      })
    // Warm both (JIT, tokenizer, connection pools) before measuring.
    await wrk(on)
    await wrk(off)
    for (let i = 0; i < rounds; i++) {
      // Alternate which goes first, so neither always follows the other.
      const order = i % 2 === 0 ? (['on', 'off'] as const) : (['off', 'on'] as const)
      for (const which of order) {
        const r = await wrk(which === 'on' ? on : off)
        if (r.errors > 0) log(`round ${i + 1} ${which}: ${r.errors} errors`)
        rps[which].push(r.rps)
        log(`round ${i + 1} billing ${which}: ${Math.round(r.rps)} RPS, p99 ${r.p99.toFixed(2)} ms`)
      }
    }
  } finally {
    await on.stop()
    await off.stop()
    await fleet.child.stop()
  }
  const median = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b)
    return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
  }
  const mOn = median(rps.on)
  const mOff = median(rps.off)
  const share = mOff / mOn - 1
  const perPair = rps.on.map((x, i) => rps.off[i]! / x - 1).sort((a, b) => a - b)
  console.log(
    [
      `| | median RPS | per-request cost, us | runs (RPS) |`,
      `| --- | --- | --- | --- |`,
      `| Tropa, billing on | ${Math.round(mOn)} | ${(1e6 / mOn).toFixed(1)} | ${rps.on.map(Math.round).join(', ')} |`,
      `| Tropa, billing off | ${Math.round(mOff)} | ${(1e6 / mOff).toFixed(1)} | ${rps.off.map(Math.round).join(', ')} |`,
      '',
      `money path: ${(share * 100).toFixed(1)}% of the router's per-request cost (target under 5%); per round ${(perPair[0]! * 100).toFixed(1)}% to ${(perPair[perPair.length - 1]! * 100).toFixed(1)}%, median ${(median(perPair) * 100).toFixed(1)}%`,
    ].join('\n'),
  )
}

process.on('exit', killAll)
await main()
