/**
 * `bun run bench:routing`: every routing policy over the same seeded traces, on a grid of
 * fleets x workloads x offered loads x seeds, in virtual time. Prints, per cell, Tropa's mean
 * and p99 TTFT as ratios to the best peer's (and goodput at 110%), with the spread over seeds,
 * checks the issue's targets, and writes every figure to JSON. Subsets: --fleets, --workloads,
 * --loads, --seeds, --policies; --quick for a smoke run; --jobs N to use N processes.
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { LeastInFlight, type RoutingPolicy } from '../../src/routing/policy.ts'
import { PredictedTtft } from '../../src/routing/predicted.ts'
import {
  LiteLlmLatency,
  LlmdEndpointPicker,
  P2CLeastRequest,
  PeakEwma,
  RoundRobin,
  SglangCacheAware,
  VllmPrefixAware,
  VllmSession,
} from './policies.ts'
import {
  FLEETS,
  type FleetName,
  fleetCapacity,
  type PreparedRequest,
  prepare,
  type SimOptions,
  simulate,
} from './sim.ts'
import {
  OUTPUT_TOKENS,
  PROMPT_TOKENS_PER_REQUEST,
  seeded,
  trace,
  WORKLOAD_NAMES,
  WORKLOADS,
  type WorkloadName,
} from './workloads.ts'

export interface Variant {
  readonly name: string
  readonly make: (rng: () => number) => RoutingPolicy
  /** Poll the nodes' /metrics this often (ms). */
  readonly metricsEveryMs?: number
  readonly hedge?: boolean
  /** Deadline-aware admission: every request carries this TTFT budget, ms. */
  readonly ttftBudgetMs?: number
  /** Tropa's own (compared with the best of the others). */
  readonly tropa?: boolean
}

const TROPA = 'tropa'
const TROPA_BUDGET = 'tropa (ttft budget 1 s)'
export const VARIANTS: readonly Variant[] = [
  { name: 'round-robin', make: () => new RoundRobin() },
  { name: 'least-busy', make: () => new LeastInFlight() },
  { name: 'p2c-least-request', make: (rng) => new P2CLeastRequest(rng) },
  { name: 'peak-ewma', make: (rng) => new PeakEwma(rng) },
  { name: 'litellm-latency', make: (rng) => new LiteLlmLatency(rng) },
  {
    name: 'sglang-v0.4',
    make: () => new SglangCacheAware('sglang-v0.4', 0.5, 32, 1.0001, 2 ** 24 / 256, 60_000),
  },
  { name: 'sglang-cache-aware', make: () => new SglangCacheAware() },
  { name: 'llm-d-epp', make: (rng) => new LlmdEndpointPicker(rng), metricsEveryMs: 50 },
  { name: 'vllm-prefixaware', make: (rng) => new VllmPrefixAware(rng) },
  { name: 'vllm-session', make: () => new VllmSession() },
  // As shipped: /metrics every second (routing.metrics_poll_ms), hedging 5% (routing.hedge_share).
  {
    name: 'tropa',
    make: (rng) => new PredictedTtft({ rng }),
    metricsEveryMs: 1000,
    hedge: true,
    tropa: true,
  },
  // The same with deadline-aware admission: every request asks for its first token within 1 s
  // (goodput's bound), and is refused at once when no node is predicted to make it.
  {
    name: TROPA_BUDGET,
    make: (rng) => new PredictedTtft({ rng }),
    metricsEveryMs: 1000,
    hedge: true,
    tropa: true,
    ttftBudgetMs: 1000,
  },
  { name: 'tropa (no metrics, no hedging)', make: (rng) => new PredictedTtft({ rng }), tropa: true },
]
/** The grid's default set: every peer but LiteLLM's (the worst in every cell of the last run). */
const DEFAULT_POLICIES = VARIANTS.filter(
  (v) => v.name !== 'litellm-latency' && v.name !== 'tropa (no metrics, no hedging)',
)

export interface Cell {
  fleet: FleetName
  workload: WorkloadName
  load: number
  seed: number
  rps: number
  policy: string
  requests: number
  meanMs: number
  p50Ms: number
  p99Ms: number
  /** Requests per second with TTFT <= 1 s. */
  goodput: number
  unserved: number
  hedges: number
  cacheHit: number
  sentToStalledAfter2s: number
  /** Refused by deadline-aware admission (the budget variant only). */
  refused?: number
  /** Nodes warmed with a new session's prompt (Tropa's `takeWarmup`; absent in older files). */
  warmups?: number
}

const quantile = (sorted: number[], q: number) =>
  sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!

export interface Task {
  fleet: FleetName
  workload: WorkloadName
  load: number
  seed: number
}

/** One cell's trace and the world it runs in (every policy's the same; the variant adds its own settings). */
export function cellSetup(
  t: Task,
  durationMs: number,
): { rps: number; prepared: PreparedRequest[]; sim: SimOptions } {
  const fleet = FLEETS[t.fleet]
  const capacity = fleetCapacity(fleet, PROMPT_TOKENS_PER_REQUEST[t.workload], OUTPUT_TOKENS)
  const rps = capacity * t.load
  const prepared = prepare(trace(t.workload, rps, durationMs, t.seed))
  const D = durationMs
  const sim: SimOptions = {
    fleet,
    metricsEveryMs: undefined,
    hedge: false,
    slowdowns:
      t.workload === 'W4'
        ? [[0, D * 0.25, D * 0.5, 5]]
        : t.workload === 'slow' || t.workload === 'slow-zipf'
          ? [[0, D * 0.3, D * 0.7, 4]]
          : [],
    stalls: t.workload === 'stall' ? [[0, D * 0.4, D * 0.4 + 30_000]] : [],
    measureFromMs: D * 0.1,
    measureToMs: D,
    horizonMs: D + 120_000,
  }
  return { rps, prepared, sim }
}

export function runTask(t: Task, durationMs: number, variants: readonly Variant[]): Cell[] {
  const { rps, prepared, sim } = cellSetup(t, durationMs)
  const cells: Cell[] = []
  for (const v of variants) {
    const r = simulate(v.make(seeded(t.seed)), prepared, {
      ...sim,
      metricsEveryMs: v.metricsEveryMs,
      hedge: v.hedge === true,
      ttftBudgetMs: v.ttftBudgetMs,
    })
    const sorted = [...r.ttftMs].sort((a, b) => a - b)
    const measuredSec = (sim.measureToMs - sim.measureFromMs) / 1000
    cells.push({
      ...t,
      rps,
      policy: v.name,
      requests: r.measured,
      meanMs: sorted.reduce((s, x) => s + x, 0) / Math.max(1, sorted.length),
      p50Ms: quantile(sorted, 0.5),
      p99Ms: r.unserved > r.measured * 0.01 ? Number.POSITIVE_INFINITY : quantile(sorted, 0.99),
      goodput: sorted.filter((x) => x <= 1000).length / measuredSec,
      unserved: r.unserved,
      hedges: r.hedges,
      cacheHit: r.cacheHitShare,
      sentToStalledAfter2s: r.sentToStalledAfter2s,
      refused: r.refused,
      warmups: r.warmups,
    })
  }
  return cells
}

/** The mean over served requests; a cell leaving more than 1% unserved has none worth comparing. */
const meanOf = (c: Cell) => (c.unserved > c.requests * 0.01 ? Number.POSITIVE_INFINITY : c.meanMs)
/** Tropa's figure over the best peer's; equal when both are infinite (both leave requests unserved). */
const ratio = (mine: number, best: number) => (mine === best ? 1 : !Number.isFinite(best) ? 0 : mine / best)

interface Summary {
  fleet: FleetName
  workload: WorkloadName
  load: number
  /** Per seed: Tropa over the best peer. */
  mean: number[]
  p99: number[]
  goodput: number[]
  /** Goodput of Tropa with deadline-aware admission (1 s budget) over the best peer's, when run. */
  goodputBudget: number[]
  bestMeanPeer: string[]
  bestP99Peer: string[]
  sentToStalledAfter2s: number[]
}

export function summarize(cells: readonly Cell[], tropa = TROPA): Summary[] {
  const groups = new Map<string, Cell[]>()
  for (const c of cells) {
    const k = `${c.fleet}|${c.workload}|${c.load}`
    let g = groups.get(k)
    if (!g) {
      g = []
      groups.set(k, g)
    }
    g.push(c)
  }
  const out: Summary[] = []
  for (const g of groups.values()) {
    const s: Summary = {
      fleet: g[0]!.fleet,
      workload: g[0]!.workload,
      load: g[0]!.load,
      mean: [],
      p99: [],
      goodput: [],
      goodputBudget: [],
      bestMeanPeer: [],
      bestP99Peer: [],
      sentToStalledAfter2s: [],
    }
    for (const seed of [...new Set(g.map((c) => c.seed))].sort((a, b) => a - b)) {
      const here = g.filter((c) => c.seed === seed)
      const t = here.find((c) => c.policy === tropa)
      const peers = here.filter((c) => !c.policy.startsWith('tropa'))
      if (!t || peers.length === 0) continue
      const bm = peers.reduce((a, b) => (meanOf(b) < meanOf(a) ? b : a))
      const bp = peers.reduce((a, b) => (b.p99Ms < a.p99Ms ? b : a))
      const bg = Math.max(...peers.map((c) => c.goodput))
      s.mean.push(ratio(meanOf(t), meanOf(bm)))
      s.p99.push(ratio(t.p99Ms, bp.p99Ms))
      s.goodput.push(bg === 0 ? 1 : t.goodput / bg)
      const tb = here.find((c) => c.policy === TROPA_BUDGET)
      if (tb) s.goodputBudget.push(bg === 0 ? 1 : tb.goodput / bg)
      s.bestMeanPeer.push(bm.policy)
      s.bestP99Peer.push(bp.policy)
      s.sentToStalledAfter2s.push(t.sentToStalledAfter2s)
    }
    out.push(s)
  }
  return out
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length === 0
    ? Number.NaN
    : s.length % 2
      ? s[(s.length - 1) / 2]!
      : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}
const f2 = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : 'inf')
/** "median (min-max)" over seeds. */
const spread = (xs: number[]) =>
  xs.length <= 1
    ? f2(xs[0] ?? Number.NaN)
    : `${f2(median(xs))} (${f2(Math.min(...xs))}-${f2(Math.max(...xs))})`
const mostCommon = (xs: string[]) => {
  const n = new Map<string, number>()
  for (const x of xs) n.set(x, (n.get(x) ?? 0) + 1)
  return [...n.entries()].sort((a, b) => b[1] - a[1])[0]?.[0] ?? ''
}

const PREFIX_WORKLOADS = new Set<WorkloadName>(['W1', 'zipf', 'agentic'])

/** Which of the issue's targets a summary row is held to, and whether the worst seed meets them. */
function targetsOf(s: Summary): { text: string; met: boolean }[] {
  const out: { text: string; met: boolean }[] = []
  const worst = (xs: number[]) => Math.max(...xs)
  if (s.load <= 0.9 + 1e-9) {
    out.push({ text: 'mean <= 1.05', met: worst(s.mean) <= 1.05 })
    out.push({ text: 'p99 <= 1.10', met: worst(s.p99) <= 1.1 })
    if (PREFIX_WORKLOADS.has(s.workload)) {
      const cap = s.fleet.startsWith('mixed') ? 0.7 : 0.9
      out.push({ text: `mean <= ${cap.toFixed(2)}`, met: worst(s.mean) <= cap })
    }
    if (s.workload === 'stall') {
      out.push({ text: 'p99 <= 1.20', met: worst(s.p99) <= 1.2 })
      out.push({ text: 'off the node within 2 s', met: worst(s.sentToStalledAfter2s) === 0 })
    }
  } else {
    // The deadline-aware admission mode is what the goodput target is for, when it was run.
    const g = s.goodputBudget.length > 0 ? s.goodputBudget : s.goodput
    out.push({ text: 'goodput >= 1.00', met: Math.min(...g) >= 1 - 1e-9 })
  }
  return out
}

export function renderGrid(sums: readonly Summary[]): { text: string; met: number; total: number } {
  const lines = [
    '| fleet | workload | load | mean / best peer | p99 / best peer | goodput / best peer | goodput, 1 s budget | best peer (mean, p99) | targets missed |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  ]
  let met = 0
  let total = 0
  const sorted = [...sums].sort(
    (a, b) =>
      a.fleet.localeCompare(b.fleet) ||
      WORKLOAD_NAMES.indexOf(a.workload) - WORKLOAD_NAMES.indexOf(b.workload) ||
      a.load - b.load,
  )
  for (const s of sorted) {
    const ts = targetsOf(s)
    total += ts.length
    met += ts.filter((t) => t.met).length
    const missed = ts.filter((t) => !t.met).map((t) => t.text)
    lines.push(
      `| ${s.fleet} | ${s.workload} | ${Math.round(s.load * 100)}% | ${spread(s.mean)} | ${spread(s.p99)} | ${spread(s.goodput)} | ${s.goodputBudget.length > 0 ? spread(s.goodputBudget) : '-'} | ${mostCommon(s.bestMeanPeer)}, ${mostCommon(s.bestP99Peer)} | ${missed.length === 0 ? '-' : missed.join('; ')} |`,
    )
  }
  return { text: lines.join('\n'), met, total }
}

function parseList<T extends string>(v: string | undefined, all: readonly T[], dflt: readonly T[]): T[] {
  if (v === undefined) return [...dflt]
  if (v === 'all') return [...all]
  const out = v.split(',').map((x) => x.trim()) as T[]
  for (const x of out) if (!all.includes(x)) throw new Error(`unknown: ${x} (one of ${all.join(', ')})`)
  return out
}

if (import.meta.main) {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean' },
      fleets: { type: 'string' },
      workloads: { type: 'string' },
      loads: { type: 'string' },
      seeds: { type: 'string' },
      policies: { type: 'string' },
      duration: { type: 'string' },
      jobs: { type: 'string' },
      json: { type: 'string' },
      render: { type: 'string' },
      peers: { type: 'string' },
      worker: { type: 'string' },
    },
  })
  const quick = values.quick === true
  const fleetNames = Object.keys(FLEETS) as FleetName[]
  const fleets = parseList(values.fleets, fleetNames, quick ? ['identical-8', 'mixed-8'] : fleetNames)
  const workloads = parseList(
    values.workloads,
    WORKLOAD_NAMES,
    quick ? ['W1', 'W3', 'burst', 'stall'] : WORKLOAD_NAMES,
  )
  const loads = (values.loads ?? (quick ? '70,110' : '50,70,90,110')).split(',').map((x) => Number(x) / 100)
  const seeds = (values.seeds ?? (quick ? '1' : '1,2,3')).split(',').map(Number)
  const variants =
    values.policies === undefined
      ? DEFAULT_POLICIES
      : values.policies === 'all'
        ? VARIANTS
        : VARIANTS.filter((v) => values.policies!.split(',').includes(v.name))
  const durationMs = Number(values.duration ?? (quick ? 40 : 150)) * 1000
  const tasks: Task[] = []
  for (const fleet of fleets)
    for (const workload of workloads)
      for (const load of loads) for (const seed of seeds) tasks.push({ fleet, workload, load, seed })

  if (values.worker !== undefined) {
    // A child: run every jobs-th task from its index, write the cells to the given file.
    const [i, n, file] = values.worker.split(':') as [string, string, string]
    const mine = tasks.filter((_, k) => k % Number(n) === Number(i))
    const cells = mine.flatMap((t) => runTask(t, durationMs, variants))
    writeFileSync(file, JSON.stringify(cells))
    process.exit(0)
  }

  const started = performance.now()
  let cells: Cell[]
  if (values.render !== undefined) cells = JSON.parse(readFileSync(values.render, 'utf8')).cells
  else {
    const jobs = Math.max(1, Number(values.jobs ?? 1))
    if (jobs === 1) cells = tasks.flatMap((t) => runTask(t, durationMs, variants))
    else {
      const dir = join(tmpdir(), `vt-${process.pid}`)
      mkdirSync(dir, { recursive: true })
      const args = process.argv.slice(2).filter((a, k, all) => a !== '--jobs' && all[k - 1] !== '--jobs')
      const procs = Array.from({ length: jobs }, (_, i) =>
        Bun.spawn(['bun', import.meta.path, ...args, '--worker', `${i}:${jobs}:${join(dir, `${i}.json`)}`], {
          stdout: 'inherit',
          stderr: 'inherit',
        }),
      )
      await Promise.all(procs.map((p) => p.exited))
      cells = procs.flatMap((_, i) => JSON.parse(readFileSync(join(dir, `${i}.json`), 'utf8')) as Cell[])
      rmSync(dir, { recursive: true, force: true })
    }
  }
  if (values.peers !== undefined) {
    // The peers are deterministic: take their cells from an earlier run of the same grid
    // (same fleets, workloads, loads, seeds and duration) instead of running them again.
    const saved = JSON.parse(readFileSync(values.peers, 'utf8')) as { durationMs: number; cells: Cell[] }
    if (saved.durationMs !== durationMs)
      throw new Error(`--peers ran ${saved.durationMs / 1000} s, not ${durationMs / 1000}`)
    const want = new Set(tasks.map((t) => `${t.fleet}|${t.workload}|${t.load}|${t.seed}`))
    const ran = new Set(cells.map((c) => c.policy))
    for (const c of saved.cells)
      if (
        !ran.has(c.policy) &&
        !c.policy.startsWith('tropa') &&
        want.has(`${c.fleet}|${c.workload}|${c.load}|${c.seed}`)
      )
        cells.push(c)
  }
  // JSON has no Infinity: unserved p99s come back as null.
  for (const c of cells) if (c.p99Ms === null) c.p99Ms = Number.POSITIVE_INFINITY
  const took = (performance.now() - started) / 1000
  const sums = summarize(cells)
  const grid = renderGrid(sums)
  console.log(
    `Tropa (${TROPA}) over the best peer per cell: median over seeds (min-max); <1 is better for TTFT, >1 for goodput.\n`,
  )
  console.log(grid.text)
  console.log(`\ntargets met: ${grid.met} of ${grid.total}`)
  console.log(
    `${cells.length} runs (${tasks.length} cells x ${variants.length} policies, ${durationMs / 1000} s each) in ${took.toFixed(0)} s of wall clock`,
  )
  if (values.render === undefined) {
    const file =
      values.json ??
      join(
        resolve(import.meta.dir, '../..'),
        '.bench',
        'results',
        `routing-${new Date().toISOString().replace(/[:.]/g, '-')}.json`,
      )
    mkdirSync(resolve(file, '..'), { recursive: true })
    writeFileSync(
      file,
      JSON.stringify(
        { fleets, workloads, loads, seeds, durationMs, workloadsDoc: WORKLOADS, cells },
        null,
        1,
      ),
    )
    console.log(`JSON: ${file}`)
  }
}
