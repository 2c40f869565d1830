#!/usr/bin/env bun
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { chatBody } from './load.ts'
import { log } from './log.ts'
import { longestSeed, plan, runMemory, runStream } from './phases.ts'
import {
  baseEnv,
  fdLimit,
  freePort,
  killAll,
  MAX_HTTP_REQUESTS,
  memoryOf,
  spawnChild,
  WANTED_FDS,
} from './proc.ts'
import { median } from './startup.ts'
import { bare, type Contestant, type RunContext, startContestant, startFleet } from './targets.ts'

/**
 * Issue #24's memory and streaming targets, Tropa against the bare proxy in one run, rounds
 * alternated (ABBA), median of the rounds' ratios:
 * - resident set at start: 1 s after /ready, before any request (a config with a real upstream
 *   list, no simulator; and `--demo`, which runs the simulator in process);
 * - the first request's latency over the median of the next 20 (what lazy loading costs it);
 * - added inter-token p99 of 8 streams against the same 8 straight to the fleet;
 * - resident memory per open stream at N streams (default 2,000; the full bench runs 9,900).
 * `relay` is the bare proxy reading the upstream's body in JavaScript (bare-proxy.ts): the floor
 * of any proxy that looks at what it relays.
 *
 * bun bench/stream-memory.ts [--binary dist/tropa] [--against <other binary>] [--rounds 3] [--streams 2000] [--memory-only | --itl-only]
 * bun bench/stream-memory.ts --render .bench/results/stream-memory-<time>.json
 * `--against` adds a second Tropa (say, the executable of an earlier commit) to every round.
 * `--itl-only`: the added inter-token p99 only (no memory per stream, no `--demo` start): about
 * 20 s a contestant a round, to compare builds on the streams' tail.
 * `--memory-only`: resident at start and per open stream only (no first request, inter-token
 * latency or `--demo` start): a minute a round, for more rounds where per-stream figures move.
 */

const REEXEC = 'BENCH_REEXEC'

async function reexec(): Promise<never> {
  const script = `ulimit -n ${WANTED_FDS} 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$@"`
  const proc = Bun.spawn(['bash', '-c', script, 'bench', process.execPath, ...process.argv.slice(1)], {
    env: { ...process.env, [REEXEC]: '1', BUN_CONFIG_MAX_HTTP_REQUESTS: MAX_HTTP_REQUESTS },
    stdio: ['inherit', 'inherit', 'inherit'],
  })
  process.exit(await proc.exited)
}

interface Row {
  name: string
  startRssKiB: number | null
  demoStartRssKiB: number | null
  firstRequestMs: number | null
  nextRequestsMs: number | null
  itlP99Us: number | null
  addedItlP99Us: number | null
  /** p99 of what the path added to each gap between tokens (stamped chunks), us. */
  gapAddedP99Us?: number | null
  idleRssKiB: number | null
  perStreamKiB: number | null
  opened: number
}

const rssAfterStart = async (pid: number): Promise<number | null> => {
  await Bun.sleep(1000)
  return memoryOf(pid)?.rssKiB ?? null
}

/** `tropa --demo` on a fresh data dir: resident set 1 s after /ready. */
async function demoStart(binary: string, dir: string, logDir: string): Promise<number | null> {
  const dataDir = mkdtempSync(join(dir, 'demo-'))
  const port = freePort()
  const child = spawnChild({
    name: `demo-${port}`,
    cmd: [binary, '--demo', '--port', String(port), '--data-dir', dataDir],
    env: baseEnv(),
    cwd: dataDir,
    logDir,
    raw: true,
  })
  try {
    const t0 = performance.now()
    while (performance.now() - t0 < 20_000) {
      const ok = await fetch(`http://127.0.0.1:${port}/ready`)
        .then((r) => r.status === 200)
        .catch(() => false)
      if (ok) break
      await Bun.sleep(5)
    }
    return await rssAfterStart(child.pid)
  } finally {
    await child.stop()
    rmSync(dataDir, { recursive: true, force: true })
  }
}

/** The first chat request's latency, and the median of the next 20 (one at a time). */
async function firstRequest(c: Contestant): Promise<{ first: number; next: number }> {
  const body = chatBody(c.model('fast'), { stream: false, maxTokens: 16, seed: 1 })
  const e = c.endpoint('fast')
  const one = async () => {
    const t0 = performance.now()
    const res = await fetch(e.urls[0]!, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...e.headers },
      body,
    })
    await res.arrayBuffer()
    if (!res.ok) throw new Error(`first request: HTTP ${res.status}`)
    return performance.now() - t0
  }
  const first = await one()
  const next: number[] = []
  for (let i = 0; i < 20; i++) next.push(await one())
  return { first, next: median(next) }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: process.argv.slice(2),
    options: {
      binary: { type: 'string' },
      against: { type: 'string' },
      rounds: { type: 'string' },
      streams: { type: 'string' },
      render: { type: 'string' },
      'memory-only': { type: 'boolean' },
      'itl-only': { type: 'boolean' },
    },
    strict: true,
  })
  if (values.render) {
    const saved = JSON.parse(readFileSync(values.render, 'utf8')) as { rounds: Row[][]; streams: number }
    return void console.log(render(saved.rounds, saved.streams))
  }
  if (process.env[REEXEC] !== '1') await reexec()
  const repoRoot = resolve(import.meta.dir, '..')
  const binaries: [string, string][] = [['tropa', resolve(values.binary ?? join(repoRoot, 'dist', 'tropa'))]]
  if (values.against) binaries.push(['against', resolve(values.against)])
  const rounds = Number(values.rounds ?? 3)
  const streams = Number(values.streams ?? 2000)
  const memoryOnly = values['memory-only'] === true
  const itlOnly = values['itl-only'] === true
  if (memoryOnly && itlOnly) throw new Error('--memory-only and --itl-only exclude each other')
  const { plan: base } = plan(false, await fdLimit())
  const p = { ...base, memoryLevels: [streams] }
  const dir = mkdtempSync(join(os.tmpdir(), 'tropa-stream-memory-'))
  const logDir = join(dir, 'logs')
  mkdirSync(logDir)
  process.on('SIGINT', () => {
    killAll()
    process.exit(130)
  })
  const fleet = await startFleet(repoRoot, dir, logDir, p.fleet)
  const ctx: RunContext = { repoRoot, dir, logDir, fleet: fleet.urls, fleetPid: fleet.child.pid }
  const seed = await longestSeed(fleet.urls.fast[0]!)
  const direct = await startContestant('direct', ctx, '', '')
  const all: Row[][] = []
  try {
    for (let r = 0; r < rounds; r++) {
      const names = ['bare', 'relay', ...binaries.map(([n]) => n)]
      const order = r % 2 === 0 ? names : [...names].reverse()
      const rows: Row[] = []
      for (const name of order) {
        const binary = binaries.find(([n]) => n === name)?.[1] ?? ''
        log(`round ${r + 1}: ${name}`)
        const c =
          name === 'relay'
            ? await bare(ctx, 'relay')
            : await startContestant(name === 'bare' ? 'bare' : 'tropa', ctx, binary, '')
        const row: Row = {
          name,
          startRssKiB: null,
          demoStartRssKiB: null,
          firstRequestMs: null,
          nextRequestsMs: null,
          itlP99Us: null,
          addedItlP99Us: null,
          idleRssKiB: null,
          perStreamKiB: null,
          opened: 0,
        }
        try {
          row.startRssKiB = await rssAfterStart(c.pid)
          if (!memoryOnly) {
            const fr = await firstRequest(c)
            row.firstRequestMs = fr.first
            row.nextRequestsMs = fr.next
            const s = await runStream(c, direct, p, seed)
            row.itlP99Us = s.itl.p99 * 1000
            row.addedItlP99Us = (s.itl.p99 - s.reference.itl.p99) * 1000
            row.gapAddedP99Us = s.addedGap?.count ? s.addedGap.p99 * 1000 : null
          }
          if (!itlOnly) {
            const m = await runMemory(c, p, seed)
            row.idleRssKiB = m.idle
            const level = m.levels[0]
            row.perStreamKiB = level?.perStreamKiB ?? null
            row.opened = level?.opened ?? 0
          }
        } finally {
          await c.stop()
        }
        if (binary && !memoryOnly && !itlOnly) row.demoStartRssKiB = await demoStart(binary, dir, logDir)
        log(`  ${JSON.stringify(row)}`)
        rows.push(row)
      }
      all.push(rows)
    }
  } finally {
    await fleet.child.stop()
    killAll()
  }
  const out = join(
    repoRoot,
    '.bench',
    'results',
    `stream-memory-${new Date().toISOString().replace(/[:.]/g, '-')}.json`,
  )
  mkdirSync(join(repoRoot, '.bench', 'results'), { recursive: true })
  writeFileSync(out, JSON.stringify({ streams, rounds: all, binaries }, null, 2))
  console.log(render(all, streams))
  console.log(`\nJSON: ${out}`)
  rmSync(dir, { recursive: true, force: true })
}

const mib = (kib: number | null | undefined) => (kib == null ? 'n/a' : `${(kib / 1024).toFixed(1)} MiB`)
const num = (x: number | null | undefined, d = 1) => (x == null ? 'n/a' : x.toFixed(d))

function render(all: Row[][], streams: number): string {
  const names = ['bare', 'relay', 'tropa', 'against'].filter((n) => all[0]!.some((r) => r.name === n))
  const med = (name: string, f: (r: Row) => number | null) => {
    const xs = all
      .map((rows) => rows.find((r) => r.name === name))
      .flatMap((r) => (r && f(r) != null ? [f(r)!] : []))
    return xs.length ? median(xs) : null
  }
  const ratio = (name: string, f: (r: Row) => number | null) => {
    const xs = all.flatMap((rows) => {
      const a = rows.find((r) => r.name === name)
      const b = rows.find((r) => r.name === 'bare')
      const x = a && f(a)
      const y = b && f(b)
      return x != null && y != null && y > 0 ? [x / y] : []
    })
    return xs.length ? `${median(xs).toFixed(2)}x (${xs.map((x) => x.toFixed(2)).join(', ')})` : 'n/a'
  }
  const lines = [
    `| median of ${all.length} rounds | resident at start (config) | resident at start (--demo) | first request / next, ms | added inter-token p99, us | gap added on the way p99, us (stamped) | per open stream at ${streams.toLocaleString('en-US')} streams | idle after warm-up |`,
    '| --- | --- | --- | --- | --- | --- | --- | --- |',
  ]
  for (const n of names)
    lines.push(
      `| ${n} | ${mib(med(n, (r) => r.startRssKiB))} | ${mib(med(n, (r) => r.demoStartRssKiB))} | ${num(
        med(n, (r) => r.firstRequestMs),
        2,
      )} / ${num(
        med(n, (r) => r.nextRequestsMs),
        2,
      )} | ${num(
        med(n, (r) => r.addedItlP99Us),
        0,
      )} | ${num(
        med(n, (r) => r.gapAddedP99Us ?? null),
        0,
      )} | ${num(med(n, (r) => r.perStreamKiB))} KiB | ${mib(med(n, (r) => r.idleRssKiB))} |`,
    )
  lines.push(
    '',
    '| ratio to the bare proxy, median of the rounds (each round) | added inter-token p99 | gap added on the way p99 (stamped) | per open stream |',
    '| --- | --- | --- | --- |',
  )
  for (const n of names.filter((x) => x !== 'bare'))
    lines.push(
      `| ${n} | ${ratio(n, (r) => r.addedItlP99Us)} | ${ratio(n, (r) => r.gapAddedP99Us ?? null)} | ${ratio(n, (r) => r.perStreamKiB)} |`,
    )
  const ratioOf = (name: string, f: (r: Row) => number | null) =>
    median(
      all.flatMap((rows) => {
        const x = rows.find((r) => r.name === name)
        const y = rows.find((r) => r.name === 'bare')
        const a = x && f(x)
        const b = y && f(y)
        return a != null && b != null && b > 0 ? [a / b] : []
      }),
    )
  // The stamped figure when the run has it: the unstamped one moves with the node's own jitter.
  const stamped = all.every((rows) => rows.every((r) => r.gapAddedP99Us != null))
  const itl = ratioOf('tropa', (r) => (stamped ? (r.gapAddedP99Us ?? null) : r.addedItlP99Us))
  const mem = ratioOf('tropa', (r) => r.perStreamKiB)
  const start =
    Math.max(med('tropa', (r) => r.startRssKiB) ?? 0, med('tropa', (r) => r.demoStartRssKiB) ?? 0) / 1024
  const met = (ok: boolean) => (ok ? 'met' : 'missed')
  const itlRun = all.some((rows) => rows.some((r) => r.addedItlP99Us != null))
  const memRun = all.some((rows) => rows.some((r) => r.perStreamKiB != null))
  lines.push(
    '',
    '| target (issue #24) | this run | |',
    '| --- | --- | --- |',
    itlRun
      ? `| added inter-token p99 <= 1.2x the bare proxy's${stamped ? ' (stamped)' : ''} | ${itl.toFixed(2)}x | ${met(itl <= 1.2)} |`
      : "| added inter-token p99 <= 1.2x the bare proxy's | not measured (--memory-only) | |",
    memRun
      ? `| memory per open stream <= 1.5x the bare proxy's | ${mem.toFixed(2)}x | ${met(mem <= 1.5)} |`
      : "| memory per open stream <= 1.5x the bare proxy's | not measured (--itl-only) | |",
    `| resident at start < 80 MiB (config and --demo) | ${start.toFixed(1)} MiB | ${met(start < 80)} |`,
  )
  return lines.join('\n')
}

if (import.meta.main) await main()
