#!/usr/bin/env bun
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { chatBody } from './load.ts'
import { log } from './log.ts'
import { emptyResult, longestSeed, plan, runLadder, runMemory, runStream } from './phases.ts'
import { fdLimit, killAll, MAX_HTTP_REQUESTS, WANTED_FDS } from './proc.ts'
import {
  type BenchReport,
  type ContestantResult,
  checkTargets,
  headline,
  type ReadyResult,
  renderTables,
} from './report.ts'
import { median, timeToReady, timeToVersion } from './startup.ts'
import {
  CONTESTANTS,
  type Contestant,
  type ContestantName,
  noBillingSupport,
  type RunContext,
  startContestant,
  startFleet,
  tropaExecutable,
} from './targets.ts'
import { runWrk, wrkPath } from './wrk.ts'

/**
 * `bun run bench`: every contestant side by side in one run, on one simulator fleet.
 * See BENCHMARKS.md for what each row means. `--quick` is the CI smoke (seconds, not minutes).
 */

const HELP = `bun bench/run.ts [--quick] [--only direct,bare,bare-json,tropa,tropa-nobill,tropa-pg,portkey] [--json <file>]

  --quick     a second or so per row (CI smoke); figures are rough
  --only      a subset of the contestants (direct is always run: it is the floor)
  --json      where to write the JSON summary (default .bench/results/bench-<time>.json)
  --build     compile the working tree into the run directory instead of using dist/tropa
  --render    print the tables of a saved JSON summary (no run)
  --median    with saved JSON summaries as arguments: each target on the median of their figures (no run)`

const REEXEC = 'BENCH_REEXEC'
const NOT_RUN = 'not run (Tropa not selected)'
const repoRoot = resolve(import.meta.dir, '..')

/**
 * Re-runs this script under `ulimit -n` raised and with Bun's fetch allowed more than 256
 * requests at once: both must be set before the process starts, and the load generator needs
 * thousands of sockets for the memory test.
 */
async function reexec(): Promise<never> {
  const script = `ulimit -n ${WANTED_FDS} 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$@"`
  const proc = Bun.spawn(['bash', '-c', script, 'bench', process.execPath, ...process.argv.slice(1)], {
    env: { ...process.env, [REEXEC]: '1', BUN_CONFIG_MAX_HTTP_REQUESTS: MAX_HTTP_REQUESTS },
    stdio: ['inherit', 'inherit', 'inherit'],
  })
  const forward = (sig: NodeJS.Signals) => () => proc.kill(sig)
  process.on('SIGINT', forward('SIGINT'))
  process.on('SIGTERM', forward('SIGTERM'))
  process.exit(await proc.exited)
}

function machine(fds: number): BenchReport['machine'] {
  const cpuinfo = readFileSync('/proc/cpuinfo', 'utf8')
  const cpu = /^model name\s*:\s*(.+)$/m.exec(cpuinfo)?.[1]?.trim() ?? 'unknown'
  return {
    nproc: os.availableParallelism(),
    cpu,
    bun: Bun.version,
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    fdLimit: fds,
    kernel: os.release(),
    // Other work on the machine skews everything; worth knowing when comparing runs.
    loadAverageAtEnd: os.loadavg().map((x) => Math.round(x * 100) / 100),
  }
}

function gitCommit(): string {
  const head = Bun.spawnSync(['git', 'rev-parse', '--short', 'HEAD'], { cwd: repoRoot })
  const commit = head.exitCode === 0 ? head.stdout.toString().trim() : 'unknown'
  const dirty = Bun.spawnSync(['git', 'status', '--porcelain', '--', 'src'], { cwd: repoRoot })
  return dirty.stdout.toString().trim().length > 0 ? `${commit} (src/ has uncommitted changes)` : commit
}

/**
 * The targets on the median of several saved runs' figures (each headline figure's median over
 * the runs that have it), with every run's own value beside it.
 */
function medianOfRuns(files: string[]): string {
  if (files.length === 0) throw new Error('--median needs saved JSON summaries')
  const heads = files.map((f) => headline(JSON.parse(readFileSync(f, 'utf8')) as BenchReport))
  const mid: Record<string, number | null> = {}
  for (const k of Object.keys(heads[0]!)) {
    const xs = heads.map((h) => h[k]).filter((x): x is number => typeof x === 'number')
    mid[k] = xs.length ? median(xs) : null
  }
  const each = heads.map((h) => checkTargets(h))
  const rows = checkTargets(mid).map((t, i) => [
    t.target,
    ...each.map((c) => c[i]!.value),
    t.value,
    t.met === null ? 'n/a' : t.met ? 'yes' : 'no',
  ])
  const head = ['target', ...files.map((_, i) => `run ${i + 1}`), `median of ${files.length}`, 'met']
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`
  return [`Runs: ${files.join(', ')}`, '', line(head), line(head.map(() => '---')), ...rows.map(line)].join(
    '\n',
  )
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    args: process.argv.slice(2),
    options: {
      quick: { type: 'boolean' },
      only: { type: 'string' },
      json: { type: 'string' },
      build: { type: 'boolean' },
      render: { type: 'string' },
      median: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
    allowPositionals: true,
  })
  if (values.help) return void console.log(HELP)
  if (values.median) return void console.log(medianOfRuns(positionals))
  if (values.render) {
    // Headline and targets are recomputed, so a report re-renders with the current rules.
    const saved = JSON.parse(readFileSync(values.render, 'utf8')) as BenchReport
    const h = headline(saved)
    return void console.log(renderTables({ ...saved, headline: h, targets: checkTargets(h) }))
  }
  if (process.env[REEXEC] !== '1') await reexec()

  const quick = values.quick === true
  const wanted = (values.only?.split(',').map((s) => s.trim()) ?? [...CONTESTANTS]) as ContestantName[]
  for (const w of wanted)
    if (!CONTESTANTS.includes(w))
      throw new Error(`unknown contestant ${w} (known: ${CONTESTANTS.join(', ')})`)
  const selected = CONTESTANTS.filter((c) => c === 'direct' || wanted.includes(c))

  const fds = await fdLimit()
  const { plan: p, memoryNote } = plan(quick, fds)
  const dir = mkdtempSync(join(os.tmpdir(), 'tropa-bench-'))
  const logDir = join(dir, 'logs')
  mkdirSync(logDir)
  const portkeyDir = join(repoRoot, '.bench', 'portkey')
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  const jsonPath = resolve(values.json ?? join(repoRoot, '.bench', 'results', `bench-${stamp}.json`))
  const wrk = wrkPath()
  log(`run dir ${dir}; ${quick ? 'quick' : 'full'} run of ${selected.join(', ')}; fd limit ${fds}`)
  if (!wrk) log('wrk is not installed: the raw-throughput (wrk) rows are skipped')

  const onSignal = () => {
    killAll()
    process.exit(130)
  }
  process.on('SIGINT', onSignal)
  process.on('SIGTERM', onSignal)

  const results: ContestantResult[] = []
  let ready: ReadyResult | null = null
  let noise: ContestantResult | null = null
  let readyNote = NOT_RUN
  let tropaNote = ''
  try {
    const needsTropa = selected.some((c) => c.startsWith('tropa'))
    const exe = needsTropa ? await tropaExecutable(repoRoot, dir, log, values.build === true) : undefined
    if (exe) tropaNote = exe.note
    const noBill = exe ? await noBillingSupport(repoRoot, exe.path) : undefined

    const fleet = await startFleet(repoRoot, dir, logDir, p.fleet)
    const ctx: RunContext = { repoRoot, dir, logDir, fleet: fleet.urls, fleetPid: fleet.child.pid }
    const seed = await longestSeed(fleet.urls.fast[0]!)
    // The reference for streaming comparisons (no process of its own: it is the fleet).
    const direct = await startContestant('direct', ctx, '', portkeyDir)
    log(`fleet up (pid ${fleet.child.pid}); streams use seed ${seed}`)

    for (const name of selected) {
      const res = emptyResult(name)
      results.push(res)
      if (name === 'tropa-nobill' && noBill) {
        res.available = false
        res.notes.push(noBill)
        log(`${name}: ${noBill}`)
        continue
      }
      const start = () => startContestant(name, ctx, exe?.path ?? '', portkeyDir)
      // Phase 1, a fresh process: latency ladder, raw throughput, streaming.
      let c: Contestant
      try {
        log(`${name}: starting`)
        c = await start()
      } catch (err) {
        res.available = false
        res.notes.push((err as Error).message.split('\n')[0]!.slice(0, 300))
        log(`${name}: unavailable: ${res.notes[0]}`)
        continue
      }
      try {
        const lad = await runLadder(c, p)
        res.steps = lad.steps
        res.maxHeldRps = lad.max
        res.maxHeldIsLadderTop = lad.top
        if (wrk) {
          const body = chatBody(c.model('fast'), { stream: false, maxTokens: 16, seed: 1 })
          res.wrk = await runWrk({
            url: c.wrkUrl('fast'),
            headers: c.endpoint('fast').headers,
            body,
            connections: p.wrkConnections,
            threads: 1,
            durationS: p.wrkS,
          })
          log(
            `  ${name} wrk: ${Math.round(res.wrk.rps)} RPS, p99 ${res.wrk.p99.toFixed(2)} ms, ${res.wrk.errors} errors`,
          )
          await Bun.sleep(p.pauseMs)
        } else res.notes.push('wrk not installed')
        res.stream = await runStream(c, direct, p, seed)
        log(
          `  ${name} streams: ${res.stream.ok} ok, ITL p50 ${res.stream.itl.p50.toFixed(3)} p99 ${res.stream.itl.p99.toFixed(3)} ms, TTFT p50 ${res.stream.ttft.p50.toFixed(2)} ms`,
        )
      } catch (err) {
        res.notes.push(`phase 1 failed: ${(err as Error).message.slice(0, 300)}`)
        log(`${name}: phase 1 failed: ${(err as Error).message}`)
      } finally {
        await c.stop()
      }
      // Phase 2, another fresh process: memory with many open streams.
      try {
        const m = name === 'direct' ? c : await start()
        try {
          const mem = await runMemory(m, p, seed)
          res.idleRssKiB = mem.idle
          res.memory = mem.levels
        } finally {
          await m.stop()
        }
      } catch (err) {
        res.notes.push(`memory phase failed: ${(err as Error).message.slice(0, 300)}`)
        log(`${name}: memory phase failed: ${(err as Error).message}`)
      }
    }
    // The same measurement of direct again: what "added" reads when nothing is added.
    if (!p.quick) {
      const again: ContestantResult = {
        ...emptyResult('direct'),
        label: 'direct, measured again (noise floor)',
      }
      try {
        const c = await startContestant('direct', ctx, '', portkeyDir)
        log('direct again (noise floor)')
        again.steps = (await runLadder(c, p, p.fixedRates)).steps
        noise = again
      } catch (err) {
        log(`noise floor failed: ${(err as Error).message}`)
      }
    }
    await fleet.child.stop()

    if (exe) {
      const runs: { healthMs: number; readyMs: number }[] = []
      const versionMs: number[] = []
      try {
        for (let i = 0; i < p.readyRuns; i++) {
          versionMs.push(await timeToVersion(exe.path))
          runs.push(await timeToReady(exe.path, dir, logDir))
          await Bun.sleep(200)
        }
        ready = {
          runs: runs.length,
          versionMs,
          medianVersionMs: median(versionMs),
          healthMs: runs.map((r) => r.healthMs),
          readyMs: runs.map((r) => r.readyMs),
          medianHealthMs: median(runs.map((r) => r.healthMs)),
          medianReadyMs: median(runs.map((r) => r.readyMs)),
        }
        log(
          `startup: /health ${ready.medianHealthMs.toFixed(0)} ms, /ready ${ready.medianReadyMs.toFixed(0)} ms (median of ${runs.length})`,
        )
      } catch (err) {
        readyNote = (err as Error).message.slice(0, 300)
      }
    }
  } finally {
    killAll()
  }

  const base: Omit<BenchReport, 'headline' | 'targets'> = {
    date: new Date().toISOString(),
    commit: gitCommit(),
    machine: machine(fds),
    command: `bun run bench${process.argv.slice(2).length ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`,
    quick,
    settings: {
      ladder: p.ladder,
      fixedRates: p.fixedRates,
      stepMs: p.stepMs,
      fixedStepMs: p.fixedStepMs,
      warmupMs: p.warmupMs,
      warm: { ms: p.warmMs, rate: p.warmRate, streamMs: p.streamWarmMs },
      p99BoundMs: p.p99BoundMs,
      streamItlMs: p.fleet.streamItlMs,
      streamConcurrency: p.streamConcurrency,
      holdItlMs: p.fleet.holdItlMs,
      memoryLevels: p.memoryLevels,
      memoryNote,
      wrk: wrk ? `${p.wrkConnections} connections, 1 thread, ${p.wrkS} s` : 'not installed',
      tropaExecutable: tropaNote,
    },
    contestants: results,
    noise,
    ready,
    readyNote,
  }
  const h = headline(base)
  const report: BenchReport = { ...base, headline: h, targets: checkTargets(h) }
  mkdirSync(dirname(jsonPath), { recursive: true })
  writeFileSync(jsonPath, `${JSON.stringify(report, null, 2)}\n`)
  console.log(renderTables(report))
  console.log(`\nJSON summary: ${jsonPath}`)
  rmSync(join(dir, 'tropa'), { force: true })
  if (results.some((r) => r.notes.some((n) => n.includes('failed'))) || readyNote !== NOT_RUN)
    log(`logs kept in ${logDir}`)
  else rmSync(dir, { recursive: true, force: true })
  log('done')
}

if (import.meta.main) {
  // Exit at once when done: races against timers (drain deadlines) may leave a timer pending.
  main().then(
    () => process.exit(0),
    (err) => {
      killAll()
      console.error(`bench: ${(err as Error)?.stack ?? err}`)
      process.exit(1)
    },
  )
}
