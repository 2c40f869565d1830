/**
 * `bun run bench:money`: what the money path (admission with reservation, settlement, ledger)
 * costs the router, measured more tightly than the one wrk run per contestant of `bun run
 * bench`: Tropa with billing and Tropa with billing off run side by side on one simulated
 * fleet, and wrk alternates between them (on, off, on, off, ...) so that drifts of a noisy
 * machine fall on both. Two measures of the per-request cost: 1 / throughput (which also pays
 * for wrk and the fleet on a small machine) and the router process's own CPU time (all its
 * threads, from /proc) per request answered; the money path's share is cost(on) / cost(off) - 1,
 * from the medians. `--rounds N` (default 7), `--seconds S` (default
 * 5), `--build` compiles the working tree instead of using dist/tropa.
 */
import { mkdirSync, mkdtempSync, readFileSync } from 'node:fs'
import os from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { chatBody } from './load.ts'
import { killAll } from './proc.ts'
import { type RunContext, startContestant, startFleet, tropaExecutable } from './targets.ts'
import { runWrk, wrkPath } from './wrk.ts'

const repoRoot = resolve(import.meta.dir, '..')

/** CPU time a process has used (all its threads, user + system), in microseconds. */
function cpuUs(pid: number, thread?: number): number {
  // Fields after the command name: utime and stime are the 12th and 13th (clock ticks, 100/s).
  const stat = readFileSync(
    thread === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${thread}/stat`,
    'utf8',
  )
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  return (Number(f[11]) + Number(f[12])) * 10_000
}
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
  // The router's own cost: its process's CPU time per request answered (wrk's and the fleet's excluded).
  const cpu: Record<'on' | 'off', number[]> = { on: [], off: [] }
  // The event loop's thread alone (its thread id is the process id): the request path itself.
  const main: Record<'on' | 'off', number[]> = { on: [], off: [] }
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
        const c = which === 'on' ? on : off
        const before = cpuUs(c.pid)
        const mainBefore = cpuUs(c.pid, c.pid)
        const r = await wrk(c)
        const perRequest = (cpuUs(c.pid) - before) / Math.max(1, r.requests)
        main[which].push((cpuUs(c.pid, c.pid) - mainBefore) / Math.max(1, r.requests))
        if (r.errors > 0) log(`round ${i + 1} ${which}: ${r.errors} errors`)
        rps[which].push(r.rps)
        cpu[which].push(perRequest)
        log(
          `round ${i + 1} billing ${which}: ${Math.round(r.rps)} RPS, p99 ${r.p99.toFixed(2)} ms, ${perRequest.toFixed(1)} us CPU per request`,
        )
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
  const cOn = median(cpu.on)
  const cOff = median(cpu.off)
  const tOn = median(main.on)
  const tOff = median(main.off)
  console.log(
    [
      `| | median RPS | 1 / RPS, us | Tropa CPU per request, us (median) | runs (RPS) |`,
      `| --- | --- | --- | --- | --- |`,
      `| Tropa, billing on | ${Math.round(mOn)} | ${(1e6 / mOn).toFixed(1)} | ${cOn.toFixed(1)} | ${rps.on.map(Math.round).join(', ')} |`,
      `| Tropa, billing off | ${Math.round(mOff)} | ${(1e6 / mOff).toFixed(1)} | ${cOff.toFixed(1)} | ${rps.off.map(Math.round).join(', ')} |`,
      '',
      `money path, throughput: ${(share * 100).toFixed(1)}% of the per-request cost (per round ${(perPair[0]! * 100).toFixed(1)}% to ${(perPair[perPair.length - 1]! * 100).toFixed(1)}%, median ${(median(perPair) * 100).toFixed(1)}%)`,
      `money path, the router's own CPU (all its threads): ${((cOn / cOff - 1) * 100).toFixed(1)}% (${(cOn - cOff).toFixed(1)} us of ${cOff.toFixed(1)} us per request); target under 5%`,
      `money path, the event loop's thread alone: ${((tOn / tOff - 1) * 100).toFixed(1)}% (${tOn.toFixed(1)} against ${tOff.toFixed(1)} us per request)`,
    ].join('\n'),
  )
}

process.on('exit', killAll)
await main()
