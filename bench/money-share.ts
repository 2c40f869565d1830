/**
 * `bun run bench:money`: what the money path (admission with reservation, settlement, the
 * ledger row) costs the router. Tropa with billing and Tropa with billing off run side by side
 * on one simulated fleet, and wrk alternates between them round after round (on, off, off, on,
 * ...) so that drifts of a noisy machine fall on both.
 *
 * Measures, per request answered: throughput (1 / RPS also pays for wrk and the fleet), the
 * router process's CPU time (all its threads, from /proc), and the same per thread. The money
 * path's share is cost(on) / cost(off) - 1, from the medians and from each round's pair. On a
 * small shared machine that difference of two noisy figures moves by several percent from run
 * to run (`--aa` runs billing on against itself to show how much), so the money path is also
 * put together from parts measured directly: the ledger thread's CPU per request (a thread only
 * billing has, read straight from /proc) plus the event loop's money calls, timed in-process by
 * money-loop.ts.
 *
 * `--rounds N` (default 21), `--seconds S` (default 4), `--build` compiles the working tree
 * instead of using dist/tropa, `--pin` puts Tropa on CPU 0 and everything else on the others
 * (steadier, but the ledger thread then shares the event loop's core, which a deployment does
 * not), `--together` (both loaded at once, 32 connections each, so each round's pair shares the
 * same moments of the machine), `--repeat K` (K fresh pairs of routers one after the other, each
 * for all the rounds, pooled: the mean of the pairs' mean ratios and its standard error), `--aa`
 * (both billing on), `--against EXE` (the other side is another executable, an older build, with
 * billing on: the ratio is what the working tree costs per request against it), `--json FILE`
 * (default .bench/results/money-<time>.json).
 */
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { chatBody } from './load.ts'
import { measureEventLoopMoneyPath } from './money-loop.ts'
import { cpuUs, killAll } from './proc.ts'
import { type RunContext, startContestant, startFleet, tropaExecutable } from './targets.ts'
import { runWrk, wrkPath } from './wrk.ts'

const repoRoot = resolve(import.meta.dir, '..')

/** CPU time per thread name (a thread's `comm`; the event loop is the thread whose id is the pid). */
function cpuByThread(pid: number): Map<string, number> {
  const out = new Map<string, number>()
  let tids: string[] = []
  try {
    tids = readdirSync(`/proc/${pid}/task`)
  } catch {
    return out
  }
  for (const tid of tids) {
    try {
      const name =
        Number(tid) === pid ? 'event loop' : readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim()
      out.set(name, (out.get(name) ?? 0) + cpuUs(pid, Number(tid)))
    } catch {
      // the thread ended between the listing and the read
    }
  }
  return out
}

/** Sets the CPUs of a process and all its threads (threads it starts later inherit them). */
function pin(pid: number, cpus: string): void {
  const r = Bun.spawnSync(['taskset', '-a', '-p', '-c', cpus, String(pid)], {
    stdout: 'ignore',
    stderr: 'pipe',
  })
  if (r.exitCode !== 0) throw new Error(`taskset failed for ${pid}: ${r.stderr.toString()}`)
}

const log = (m: string) => console.error(`[money] ${m}`)
const median = (xs: readonly number[]) => {
  const s = [...xs].sort((a, b) => a - b)
  if (s.length === 0) return Number.NaN
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}
const pct = (x: number) => `${(x * 100).toFixed(1)}%`

type Side = 'on' | 'off'

async function main() {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string' },
      seconds: { type: 'string' },
      build: { type: 'boolean' },
      aa: { type: 'boolean' },
      against: { type: 'string' },
      pin: { type: 'boolean' },
      together: { type: 'boolean' },
      repeat: { type: 'string' },
      json: { type: 'string' },
    },
  })
  if (!wrkPath()) throw new Error('wrk is not installed (apt-get install wrk)')
  const rounds = Number(values.rounds ?? 21)
  const repeats = Math.max(1, Number(values.repeat ?? 1))
  const seconds = Number(values.seconds ?? 4)
  const together = values.together === true
  const pinned = values.pin === true && os.availableParallelism() >= 2 && Bun.which('taskset') !== null
  if (pinned) pin(process.pid, `1-${os.availableParallelism() - 1}`)
  const dir = mkdtempSync(join(os.tmpdir(), 'tropa-money-'))
  const logDir = join(dir, 'logs')
  mkdirSync(logDir)

  // The event loop's part, in-process, before anything else runs.
  log('timing the money calls on the event loop in-process (money-loop.ts) ...')
  const loop = await measureEventLoopMoneyPath()

  const exe = await tropaExecutable(repoRoot, dir, log, values.build === true)
  const fleet = await startFleet(repoRoot, dir, logDir, { nodesPerFleet: 3, streamItlMs: 5, holdItlMs: 1000 })
  const ctx: RunContext = { repoRoot, dir, logDir, fleet: fleet.urls, fleetPid: fleet.child.pid }
  log(
    `${values.against ? `this tree against ${values.against} (both with billing on)` : values.aa ? 'A/A run (both with billing on)' : 'billing on against billing off'}; ${pinned ? 'Tropa pinned to CPU 0, fleet and wrk to the others' : 'not pinned'}; ${repeats > 1 ? `${repeats} pairs of routers, ` : ''}${rounds} rounds of ${seconds} s, ${together ? 'both loaded at once (32 connections each)' : 'one after the other'}`,
  )
  const sideA = values.against ? 'this tree' : 'billing on'
  const sideB = values.against ? `${values.against}` : values.aa ? 'billing on (A/A)' : 'billing off'
  const rps: Record<Side, number[]> = { on: [], off: [] }
  const cpu: Record<Side, number[]> = { on: [], off: [] }
  const byThread: Record<Side, Map<string, number[]>> = { on: new Map(), off: new Map() }
  /** Each pair of routers' mean of its rounds' CPU ratios (on / off - 1). */
  const pairMeans: number[] = []
  try {
    for (let rep = 0; rep < repeats; rep++) {
      const from = cpu.on.length
      await onePair(rep)
      const ratios = cpu.on.slice(from).map((x, i) => x / cpu.off[from + i]! - 1)
      pairMeans.push(ratios.reduce((a, b) => a + b, 0) / Math.max(1, ratios.length))
      if (repeats > 1)
        log(`pair ${rep + 1} of ${repeats}: CPU on / off - 1, mean of its rounds ${pct(pairMeans[rep]!)}`)
    }
  } finally {
    await fleet.child.stop()
  }

  /** A fresh pair of routers (new processes, new data dirs) loaded for `rounds` rounds. */
  async function onePair(rep: number) {
    const on = await startContestant('tropa', ctx, exe.path, '')
    // --aa: both with billing on, an A/A run that shows the measure's own noise. --against EXE:
    // the other side is another executable (an older build), billing on: what a change costs.
    const off = await startContestant(
      values.against || values.aa ? 'tropa' : 'tropa-nobill',
      ctx,
      values.against ? resolve(values.against) : exe.path,
      '',
    )
    if (pinned) for (const c of [on, off]) pin(c.pid, '0')
    try {
      const wrk = (c: typeof on, connections = 64) =>
        runWrk({
          url: c.wrkUrl('fast'),
          headers: c.endpoint('fast').headers,
          body: chatBody(c.model('fast'), { stream: false, maxTokens: 16, seed: 1 }),
          connections,
          threads: 1,
          durationS: seconds,
        })
      const measure = async (which: Side, round: number, load = wrk) => {
        const c = which === 'on' ? on : off
        const before = cpuUs(c.pid)
        const threadsBefore = cpuByThread(c.pid)
        const r = await load(c)
        const n = Math.max(1, r.requests)
        const after = cpuByThread(c.pid)
        for (const name of new Set([...threadsBefore.keys(), ...after.keys()])) {
          const list = byThread[which].get(name) ?? []
          list.push(((after.get(name) ?? 0) - (threadsBefore.get(name) ?? 0)) / n)
          byThread[which].set(name, list)
        }
        const perRequest = (cpuUs(c.pid) - before) / n
        if (r.errors > 0) log(`round ${round + 1} ${which}: ${r.errors} errors`)
        rps[which].push(r.rps)
        cpu[which].push(perRequest)
        log(
          `${repeats > 1 ? `pair ${rep + 1} ` : ''}round ${round + 1} billing ${which}: ${Math.round(r.rps)} RPS, p99 ${r.p99.toFixed(2)} ms, ${perRequest.toFixed(1)} us CPU per request`,
        )
      }
      // Warm both (JIT, tokenizer, connection pools) before measuring.
      await wrk(on)
      await wrk(off)
      if (together) {
        // Both loaded over the same seconds, half the connections each: whatever the machine does
        // meanwhile (another tenant, a slower moment) falls on both sides of the pair at once.
        const half = (c: typeof on) => wrk(c, 32)
        for (let i = 0; i < rounds; i++) await Promise.all([measure('on', i, half), measure('off', i, half)])
      } else
        for (let i = 0; i < rounds; i++)
          // Alternate which goes first, so neither always follows the other.
          for (const which of i % 2 === 0 ? (['on', 'off'] as const) : (['off', 'on'] as const))
            await measure(which, i)
    } finally {
      await on.stop()
      await off.stop()
    }
  }

  const paired = (xs: Record<Side, number[]>, invert = false) =>
    xs.on.map((x, i) => (invert ? xs.off[i]! / x : x / xs.off[i]!) - 1).sort((a, b) => a - b)
  const threadMedian = (side: Side, name: string) => median(byThread[side].get(name) ?? [0])
  const cOn = median(cpu.on)
  const cOff = median(cpu.off)
  const cpuPairs = paired(cpu)
  const rpsPairs = paired(rps, true)
  // The ledger thread: Bun names a Worker's thread "Worker"; only billing starts one here.
  const ledgerUs = threadMedian('on', 'Worker') - threadMedian('off', 'Worker')
  const loopUs = loop.onUs - loop.offUs
  const parts = (ledgerUs + loopUs) / cOff
  const names = [...new Set([...byThread.on.keys(), ...byThread.off.keys()])].sort()
  // Mean of every pair of routers' mean ratio, with its standard error (pairs of routers are
  // independent; rounds of one pair are not quite, as a process keeps its own memory layout).
  const grand = pairMeans.reduce((a, b) => a + b, 0) / pairMeans.length
  const se =
    pairMeans.length > 1
      ? Math.sqrt(
          pairMeans.reduce((a, b) => a + (b - grand) ** 2, 0) / (pairMeans.length - 1) / pairMeans.length,
        )
      : Number.NaN
  const lines = [
    `| | median RPS | Tropa CPU per request, us (median) | runs (RPS) |`,
    `| --- | --- | --- | --- |`,
    `| Tropa, ${sideA} | ${Math.round(median(rps.on))} | ${cOn.toFixed(1)} | ${rps.on.map(Math.round).join(', ')} |`,
    `| Tropa, ${sideB} | ${Math.round(median(rps.off))} | ${cOff.toFixed(1)} | ${rps.off.map(Math.round).join(', ')} |`,
    '',
    `| thread | ${sideA}, us per request | ${sideB}, us per request |`,
    '| --- | --- | --- |',
    ...names.map(
      (name) =>
        `| ${name} | ${threadMedian('on', name).toFixed(1)} | ${threadMedian('off', name).toFixed(1)} |`,
    ),
    '',
    values.aa
      ? `A/A: the ledger thread on both sides (${threadMedian('on', 'Worker').toFixed(2)} and ${threadMedian('off', 'Worker').toFixed(2)} us per request); the differences below are the measure's noise`
      : `money path, from its parts: ${pct(parts)} of the router's CPU per request (${(ledgerUs + loopUs).toFixed(1)} of ${cOff.toFixed(1)} us): ledger thread ${ledgerUs.toFixed(2)} us + event loop ${loopUs.toFixed(2)} us (timed in a tight loop: ${loop.onUs.toFixed(2)} on, ${loop.offUs.toFixed(2)} off, which understates the same calls inside the router; a lower bound, see BENCHMARKS.md); target under 5%`,
    `money path, CPU on minus off (all threads): ${pct(cOn / cOff - 1)} from the medians; per round median ${pct(median(cpuPairs))}, from ${pct(cpuPairs[0]!)} to ${pct(cpuPairs[cpuPairs.length - 1]!)}`,
    ...(repeats > 1
      ? [
          `money path, CPU on minus off (all threads), pooled over ${repeats} pairs of routers: ${pct(grand)} +- ${pct(se)} (mean of the pairs' means +- its standard error); pairs: ${pairMeans.map(pct).join(', ')}`,
        ]
      : []),
    `money path, throughput: ${pct(median(rps.off) / median(rps.on) - 1)} from the medians; per round median ${pct(median(rpsPairs))}, from ${pct(rpsPairs[0]!)} to ${pct(rpsPairs[rpsPairs.length - 1]!)}`,
  ]
  console.log(lines.join('\n'))
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  const jsonPath = resolve(values.json ?? join(repoRoot, '.bench', 'results', `money-${stamp}.json`))
  mkdirSync(dirname(jsonPath), { recursive: true })
  writeFileSync(
    jsonPath,
    JSON.stringify(
      {
        date: new Date().toISOString(),
        aa: values.aa === true,
        pinned,
        together,
        repeats,
        pairMeans,
        rounds,
        seconds,
        rps,
        cpu,
        threads: Object.fromEntries(
          names.map((n) => [n, { on: byThread.on.get(n), off: byThread.off.get(n) }]),
        ),
        eventLoop: loop,
        summary: lines,
      },
      null,
      2,
    ),
  )
  log(`wrote ${jsonPath}`)
}

process.on('exit', killAll)
await main()
