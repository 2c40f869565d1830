// Does a running batch stay invisible to interactive users? Open-loop streamed interactive
// traffic on four simulated nodes (16 sequences each, ~512-token prompts), with and without a
// batch of the same requests running, in one run: interactive TTFT p50/p99, inter-token p99 and
// refusals side by side; the batch's throughput in the valleys and the peaks of a bursty load,
// and on an idle fleet against interactive saturation. Issue #25's targets are checked at the end.
//   bun bench/batch-yield.ts [--seconds 20] [--seed 1] [--reps 2] [--priority] [--quick] [--json FILE]
//     [--aa] [--pack-share X] [--quiet-load X] [--fill-load X] [--reserve X] [--reserve-slots N]
//     [--workers N] [--only NAME[,NAME]]
// --only: the scenarios whose names contain one of these (50%, 80%, bursts); the valley and
// peak targets are checked only when the bursts run.
// --aa: an A/A pass, the "with" runs started with no batch either: the ratios it prints are the
// bench's own noise floor for the same seed and length. --pack-share/--quiet-load/--fill-load set
// batches.pack_share/quiet_load/fill_load (0 turns packing off: the behaviour before it);
// --reserve and --reserve-slots set batches.interactive_reserve and reserve_slots.
// Each scenario runs `reps` pairs in ABBA order (without, with, with, without, ...), every pair
// on its own seeded arrivals, the samples of each condition pooled: a drift of the machine over
// the run (a warming cache, another process) then weighs on both sides alike.
// The router and the simulated fleet run as processes of their own; this process only sends
// and times, so the three share the machine's cores but not an event loop.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import type { SimNodeOptions } from '../src/simulator/index.ts'
import { prng } from '../src/simulator/text.ts'
import { freePort, jsonCall, startRouterProcess } from '../test/helpers/process.ts'
import { startSimProcess } from '../test/helpers/sim-process.ts'

const { values } = parseArgs({
  options: {
    seconds: { type: 'string' },
    seed: { type: 'string' },
    json: { type: 'string' },
    quick: { type: 'boolean' },
    priority: { type: 'boolean' },
    reps: { type: 'string' },
    aa: { type: 'boolean' },
    'pack-share': { type: 'string' },
    'quiet-load': { type: 'string' },
    'fill-load': { type: 'string' },
    reserve: { type: 'string' },
    'reserve-slots': { type: 'string' },
    workers: { type: 'string' },
    only: { type: 'string' },
    help: { type: 'boolean' },
  },
})
if (values.help) {
  console.log(`bun bench/batch-yield.ts [options]
  --seconds N      length of a 50% or 80% run (default 20; bursts are 10 s phases)
  --seed N         arrivals' seed (default 1)
  --reps N         ABBA pairs per scenario (default 2)
  --quick          a short smoke run
  --aa             A/A: no batch on either side (the noise floor)
  --priority       nodes marked for vLLM priority scheduling
  --pack-share X, --quiet-load X, --fill-load X, --reserve X, --reserve-slots N
                   batches.pack_share, quiet_load, fill_load, interactive_reserve, reserve_slots
  --workers N      server.workers (default 1): N processes serve the requests, the primary runs the batch
  --only LIST      scenarios whose names contain one of these (comma-separated: 50%,80%,bursts)
  --json FILE      the report as JSON`)
  process.exit(0)
}
const ONLY = values.only?.split(',').filter((x) => x.length > 0)
const QUICK = values.quick === true
const SECONDS = Number(values.seconds ?? (QUICK ? 4 : 20))
const SEED = Number(values.seed ?? 1)
/** Pairs (without, with) per scenario, in ABBA order. */
const REPS = Number(values.reps ?? (QUICK ? 1 : 2))
const NODES = 4
const SEQS = 16
const OUT = 32
const ADMIN = 'bench-admin-token-0123456789'
/** Nodes marked as running vLLM's priority scheduling (batch lines sent at the lowest priority). */
const PRIORITY = values.priority === true
/** A/A: the "with" condition runs without a batch too. */
const AA = values.aa === true
const batchOptions = {
  ...(values['pack-share'] !== undefined && { pack_share: Number(values['pack-share']) }),
  ...(values['quiet-load'] !== undefined && { quiet_load: Number(values['quiet-load']) }),
  ...(values['fill-load'] !== undefined && { fill_load: Number(values['fill-load']) }),
  ...(values.reserve !== undefined && { interactive_reserve: Number(values.reserve) }),
  ...(values['reserve-slots'] !== undefined && { reserve_slots: Number(values['reserve-slots']) }),
}

const node = (i: number): SimNodeOptions => ({
  name: `sim-${i}`,
  maxSeqs: SEQS,
  prefillTokensPerSec: 20_000,
  itlMs: 20,
  iterationOverheadMs: 2,
  seed: i,
  ignoreEos: true,
  ...(PRIORITY && { priorityScheduling: true }),
})

// ~512 tokens of varied text, unique per request (no prefix cache help).
const WORDS =
  'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau'.split(
    ' ',
  )
function prompt(i: number): string {
  const r = prng(i * 7919 + 17)
  const words = [`request ${i}:`]
  for (let k = 0; k < 500; k++) words.push(WORDS[Math.floor(r() * WORDS.length)]!)
  return words.join(' ')
}
const body = (i: number, stream: boolean) => ({
  model: 'bench/chat',
  messages: [{ role: 'user', content: prompt(i) }],
  max_tokens: OUT,
  ...(stream && { stream: true }),
})

const dir = mkdtempSync(join(tmpdir(), 'tropa-batch-yield-'))
const fleet = await startSimProcess(Array.from({ length: NODES }, (_, i) => node(i + 1)))
const configPath = join(dir, 'tropa.json')
writeFileSync(
  configPath,
  JSON.stringify({
    server: { data_dir: dir, admin_token: ADMIN, log_level: 'error' },
    batches: { tick_ms: 50, workers: 2, concurrency: 128, ...batchOptions },
    upstream: { first_byte_timeout_ms: 60_000 },
    models: [
      {
        id: 'bench/chat',
        context_length: 8192,
        pricing: { prompt: '0.000001', completion: '0.000002' },
        routes: fleet.nodes.map((n) => ({
          name: n.name,
          base_url: n.url,
          upstream_model: 'm',
          max_concurrency: SEQS,
          hedge: false,
          ...(PRIORITY && { priority_scheduling: true }),
        })),
      },
    ],
  }),
)
// server.workers: the primary runs the batch, the workers the interactive requests.
const router = await startRouterProcess(configPath, freePort(), { TROPA_WORKERS: values.workers ?? '1' })
const org = await jsonCall(router.url, '/v1/admin/organizations', ADMIN, { name: 'bench', balance_rub: 1e6 })
const key = (await jsonCall(router.url, '/v1/keys', org.master_key as string, { name: 'b' })).key as string
const auth = { authorization: `Bearer ${key}` }

interface Sample {
  /** When it was sent, ms after its run's open loop started. */
  atMs?: number
  ttftMs: number | undefined
  gapsMs: number[]
  status: number
}

/** One streamed request: its TTFT and the gaps between its content events. */
async function streamed(i: number): Promise<Sample> {
  const start = performance.now()
  let res: Response
  try {
    res = await fetch(`${router.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify(body(i, true)),
    })
  } catch {
    return { ttftMs: undefined, gapsMs: [], status: 0 }
  }
  if (res.status !== 200) {
    await res.arrayBuffer()
    return { ttftMs: undefined, gapsMs: [], status: res.status }
  }
  const reader = res.body!.getReader()
  const dec = new TextDecoder()
  let ttftMs: number | undefined
  let last = 0
  const gapsMs: number[] = []
  let carry = ''
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    const now = performance.now()
    carry += dec.decode(value, { stream: true })
    const events = carry.split('\n\n')
    carry = events.pop()!
    for (const e of events) {
      if (!e.includes('"content":"') || e.includes('"content":""')) continue
      if (ttftMs === undefined) ttftMs = now - start
      else gapsMs.push(now - last)
      last = now
    }
  }
  return { ttftMs, gapsMs, status: 200 }
}

/** Rates are read after this much of a measurement, once the first wave of requests has ended. */
const RAMP_MS = 2000

/**
 * Interactive saturation: every slot of the fleet kept busy by a closed loop of the requests the
 * batch is made of (not streamed, so the figure is the fleet's capacity, not this process's SSE
 * parsing); requests a second.
 */
async function saturation(seconds: number): Promise<number> {
  let n = 0
  let next = 1_000_000
  const start = performance.now()
  const until = start + RAMP_MS + seconds * 1000
  await Promise.all(
    Array.from({ length: NODES * SEQS }, async () => {
      while (performance.now() < until) {
        const res = await fetch(`${router.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { ...auth, 'content-type': 'application/json' },
          body: JSON.stringify(body(next++, false)),
        })
        await res.arrayBuffer()
        const now = performance.now()
        if (res.status === 200 && now >= start + RAMP_MS && now <= until) n++
      }
    }),
  )
  return n / seconds
}

type Phase = { seconds: number; load: number; name: string }

/** Open-loop Poisson arrivals through the phases (load as a share of saturation), seeded. */
async function openLoop(phases: readonly Phase[], capacity: number, seed: number, first: number) {
  const r = prng(seed)
  const samples: Promise<Sample & { phase: string; inPhaseMs: number }>[] = []
  let i = first
  const t0 = performance.now()
  let at = 0
  const bounds: { name: string; startMs: number; endMs: number }[] = []
  for (const p of phases) {
    const end = at + p.seconds * 1000
    const phaseStart = at
    bounds.push({ name: p.name, startMs: t0 + at, endMs: t0 + end })
    const rate = (p.load * capacity) / 1000 // per ms
    for (;;) {
      at += -Math.log(1 - r()) / rate
      if (at >= end) break
      const wait = t0 + at - performance.now()
      if (wait > 1) await Bun.sleep(wait)
      const phase = p.name
      const atMs = performance.now() - t0
      const inPhaseMs = atMs - phaseStart
      samples.push(streamed(i++).then((s) => ({ ...s, phase, atMs, inPhaseMs })))
    }
    at = end
  }
  return { samples: await Promise.all(samples), bounds }
}

const pct = (xs: number[], q: number) => {
  if (xs.length === 0) return Number.NaN
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(s.length * q) - 1))]!
}

interface Figures {
  ttftP50: number
  ttftP99: number
  itlP99: number
  refused: number
  requests: number
}
function figures(samples: Sample[]): Figures {
  const ok = samples.filter((s) => s.ttftMs !== undefined)
  return {
    ttftP50: pct(
      ok.map((s) => s.ttftMs!),
      0.5,
    ),
    ttftP99: pct(
      ok.map((s) => s.ttftMs!),
      0.99,
    ),
    itlP99: pct(
      ok.flatMap((s) => s.gapsMs),
      0.99,
    ),
    refused: samples.filter((s) => s.status !== 200).length,
    requests: samples.length,
  }
}

let batchCounter = 0
/** Uploads and starts a batch of `n` lines; resolves once it is running. */
async function startBatch(n: number): Promise<string> {
  const base = 5_000_000 + 100_000 * batchCounter++
  const jsonl = Array.from({ length: n }, (_, i) =>
    JSON.stringify({
      custom_id: `b${i}`,
      method: 'POST',
      url: '/v1/chat/completions',
      body: body(base + i, false),
    }),
  ).join('\n')
  const form = new FormData()
  form.set('purpose', 'batch')
  form.set('file', new Blob([`${jsonl}\n`]), 'yield.jsonl')
  const file = (await (
    await fetch(`${router.url}/v1/files`, { method: 'POST', headers: auth, body: form })
  ).json()) as { id: string }
  const b = await jsonCall(router.url, '/v1/batches', key, {
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
  })
  for (;;) {
    const s = await batchState(b.id as string)
    if (s.status !== 'validating') return b.id as string
    await Bun.sleep(20)
  }
}
async function batchState(id: string) {
  const b = (await (await fetch(`${router.url}/v1/batches/${id}`, { headers: auth })).json()) as {
    status: string
    request_counts: { completed: number; failed: number }
  }
  return { status: b.status, done: b.request_counts.completed + b.request_counts.failed }
}
async function stopBatch(id: string) {
  await fetch(`${router.url}/v1/batches/${id}/cancel`, { method: 'POST', headers: auth })
  for (let i = 0; i < 600; i++) {
    const s = await batchState(id)
    if (['cancelled', 'completed', 'failed', 'expired'].includes(s.status)) break
    await Bun.sleep(100)
  }
  await quiet()
}
/** Until the fleet runs nothing (cancelled lines finish or are aborted). */
async function quiet() {
  for (let i = 0; i < 600; i++) {
    const s = await fleet.stats()
    if (s.running === 0 && s.waiting === 0) return
    await Bun.sleep(100)
  }
}

/** The sample taken nearest to `t`. */
function nearest<T extends { atMs: number }>(xs: readonly T[], t: number): T | undefined {
  let best = xs[0]
  for (const x of xs) if (best && Math.abs(x.atMs - t) < Math.abs(best.atMs - t)) best = x
  return best
}

/** A sampled counter's increase in each whole second of each phase, summed by phase name. */
function perSecond(
  value: (t: number) => number,
  bounds: { name: string; startMs: number; endMs: number }[],
): Map<string, number[]> {
  const out = new Map<string, number[]>()
  for (const b of bounds) {
    const xs = out.get(b.name) ?? []
    for (let t = 0; t + 1000 <= b.endMs - b.startMs + 1; t += 1000)
      xs[t / 1000] = (xs[t / 1000] ?? 0) + value(b.startMs + t + 1000) - value(b.startMs + t)
    out.set(b.name, xs)
  }
  return out
}

/** Adds each phase's per-second figures into `into`. */
function addSeconds(into: Map<string, number[]>, from: Map<string, number[]>): void {
  for (const [ph, xs] of from) {
    const cur = into.get(ph) ?? []
    xs.forEach((x, i) => {
      cur[i] = (cur[i] ?? 0) + x
    })
    into.set(ph, cur)
  }
}

/** Lines done per second while each phase ran, from samples of the batch's count. */
function phaseRates(
  counts: { atMs: number; done: number }[],
  bounds: { name: string; startMs: number; endMs: number }[],
  /** Past each phase's start, where its rate is read from: its first second (the switch-over) by default. */
  skip: (b: { startMs: number; endMs: number }) => number = () => 1000,
) {
  const at = (t: number) => nearest(counts, t)?.done ?? 0
  const byName = new Map<string, { lines: number; seconds: number }>()
  for (const b of bounds) {
    const cur = byName.get(b.name) ?? { lines: 0, seconds: 0 }
    // The first second of a phase is the switch-over; rates are read over the rest.
    const from = b.startMs + skip(b)
    cur.lines += at(b.endMs) - at(from)
    cur.seconds += (b.endMs - from) / 1000
    byName.set(b.name, cur)
  }
  return byName
}

/** The router's view of the fleet's interactive load, as batch admission reads it, and the nodes its plan gives the batch (/metrics). */
async function interactiveLoad(): Promise<{ load: number; held: number; preempted: number }> {
  const text = await (await fetch(`${router.url}/metrics`)).text()
  // With server.workers the series carry a worker label: the primary's (it runs the batch).
  const m = /^tropa_batch_interactive_load(?:\{worker="primary"\})? (\S+)$/m.exec(text)
  const h = /^tropa_batch_held_nodes(?:\{worker="primary"\})? (\S+)$/m.exec(text)
  const p = /^tropa_batch_preempted_total(?:\{worker="primary"\})? (\S+)$/m.exec(text)
  return {
    load: m ? Number(m[1]) : Number.NaN,
    held: h ? Number(h[1]) : Number.NaN,
    preempted: p ? Number(p[1]) : Number.NaN,
  }
}

/** Measured runs so far (each takes prompts no other run sent). */
let runs = 0

async function scenario(name: string, phases: Phase[], capacity: number, withBatch: boolean, rep: number) {
  let batchId: string | undefined
  const counts: { atMs: number; done: number }[] = []
  const loads: { atMs: number; load: number; held: number; preempted: number }[] = []
  const loadSampling = setInterval(() => {
    void interactiveLoad().then(
      (l) => loads.push({ atMs: performance.now(), ...l }),
      () => {},
    )
  }, 250)
  let sampling: ReturnType<typeof setInterval> | undefined
  if (withBatch && !AA) {
    batchId = await startBatch(QUICK ? 600 : 3000)
    await Bun.sleep(1000) // the batch fills the fleet first
    const id = batchId
    sampling = setInterval(() => {
      void batchState(id).then((s) => counts.push({ atMs: performance.now(), done: s.done }))
    }, 250)
  }
  // Prompts of their own in every run: the simulated nodes cache prefixes (4,096 blocks each,
  // about a whole 50% run's prompts), so a run repeating the previous run's prompts had them
  // cached: a pair's second run read up to 45% faster in A/A passes.
  const first = 10_000_000 * ++runs
  const { samples, bounds } = await openLoop(phases, capacity, SEED * 1000 + name.length + rep * 7919, first)
  if (sampling) clearInterval(sampling)
  clearInterval(loadSampling)
  // The load each phase ran at, past its first second (the switch-over).
  const load = new Map<string, number[]>()
  const held = new Map<string, number[]>()
  for (const b of bounds)
    for (const l of loads)
      if (l.atMs >= b.startMs + 1000 && l.atMs < b.endMs) {
        load.set(b.name, [...(load.get(b.name) ?? []), l.load])
        held.set(b.name, [...(held.get(b.name) ?? []), l.held])
      }
  // Lines pre-empted in each second of each phase (the router's counter, sampled every 250 ms).
  const preemptedPerSecond = perSecond((t) => nearest(loads, t)?.preempted ?? Number.NaN, bounds)
  let lines = new Map<string, { lines: number; seconds: number }>()
  let donePerSecond = new Map<string, number[]>()
  let finished = false
  if (batchId) {
    const s = await batchState(batchId)
    finished = s.status !== 'in_progress'
    counts.push({ atMs: performance.now(), done: s.done })
    lines = phaseRates(counts, bounds)
    // Each second of each phase: lines done in it (the ramp into a valley, second by second).
    donePerSecond = perSecond((t) => nearest(counts, t)?.done ?? 0, bounds)
    for (const [k, v] of phaseRates(counts, bounds, (b) => (b.endMs - b.startMs) / 2))
      lines.set(`${k} (second half)`, v)
    await stopBatch(batchId)
  } else await quiet()
  return {
    samples,
    lines,
    donePerSecond,
    preemptedPerSecond,
    load,
    held,
    batchFinishedEarly: finished,
  }
}

const log = (...a: unknown[]) => console.log(...a)

export interface BatchYieldReport {
  seed: number
  seconds: number
  priority: boolean
  /** Interactive saturation, requests a second. */
  capacity: number
  /** Batch lines a second on an idle fleet. */
  idleRate: number
  reps: number
  aa: boolean
  batchOptions: Record<string, number>
  results: {
    name: string
    without: Figures
    with: Figures
    /** The same per phase of the load (peak, valley; steady). */
    phases: Record<string, { without: Figures; with: Figures }>
    rates: Record<string, number>
    load: Record<string, number>
    /** Each ABBA pair's own ratios with / without (the spread within the run). */
    pairs: { ttftP50: number; ttftP99: number; itlP99: number; lateTtftP99: number; lateItlP99: number }[]
    /** Nodes the packing plan gave the batch per phase, with a batch (mean of the router's gauge). */
    held: Record<string, number>
    early: boolean
  }[]
  checks: { what: string; value: number; target: string; met: boolean }[]
}

try {
  // Warm-up: connections, the tokenizer, every node learned.
  await Promise.all(Array.from({ length: 32 }, (_, i) => streamed(900_000 + i)))
  const capacity = await saturation(QUICK ? 3 : 8)
  log(`interactive saturation: ${capacity.toFixed(1)} requests/s`)
  await quiet()

  // Idle fleet: the batch alone, lines a second against interactive saturation.
  const idleId = await startBatch(QUICK ? 300 : 1500)
  await Bun.sleep(RAMP_MS)
  const idleStart = performance.now()
  const idleBegin = await batchState(idleId)
  await Bun.sleep((QUICK ? 3 : 8) * 1000)
  const idleEnd = await batchState(idleId)
  const idleRate = (idleEnd.done - idleBegin.done) / ((performance.now() - idleStart) / 1000)
  await stopBatch(idleId)
  log(
    `batch on an idle fleet: ${idleRate.toFixed(1)} lines/s (${((idleRate / capacity) * 100).toFixed(0)}% of saturation)`,
  )

  // A discarded stretch of open-loop streamed traffic, so that the first measured run is not the
  // first under open-loop load.
  await openLoop([{ seconds: QUICK ? 2 : 8, load: 0.5, name: 'warm-up' }], capacity, SEED * 1000 - 1, 800_000)
  await quiet()

  const S = SECONDS
  const burstHalf = QUICK ? 3 : 10
  const cycles = QUICK ? 1 : 2
  const scenarios: { name: string; phases: Phase[] }[] = [
    { name: 'load 50%', phases: [{ seconds: S, load: 0.5, name: 'steady' }] },
    { name: 'load 80%', phases: [{ seconds: S, load: 0.8, name: 'steady' }] },
    {
      name: 'bursts 90/10%',
      phases: Array.from({ length: cycles }, () => [
        { seconds: burstHalf, load: 0.9, name: 'peak' },
        { seconds: burstHalf, load: 0.1, name: 'valley' },
      ]).flat(),
    },
  ]
  const results = []
  for (const s of scenarios) {
    if (ONLY && !ONLY.some((o) => s.name.includes(o))) continue
    const pooled = {
      without: [] as (Sample & { phase: string; inPhaseMs: number })[],
      with: [] as (Sample & { phase: string; inPhaseMs: number })[],
    }
    const lines = new Map<string, { lines: number; seconds: number }>()
    const doneSeconds = new Map<string, number[]>()
    let withRuns = 0
    const preemptedSeconds = new Map<string, number[]>()
    const loadWithout = new Map<string, number[]>()
    const heldWith = new Map<string, number[]>()
    const pairs: {
      ttftP50: number
      ttftP99: number
      itlP99: number
      lateTtftP99: number
      lateItlP99: number
    }[] = []
    let early = false
    for (let rep = 0; rep < REPS; rep++) {
      // ABBA: even pairs run without the batch first, odd pairs with it first.
      const order = rep % 2 === 0 ? [false, true] : [true, false]
      const pair: { with?: Figures; without?: Figures; withLate?: Figures; withoutLate?: Figures } = {}
      for (const withBatch of order) {
        const run = await scenario(s.name, s.phases, capacity, withBatch, rep)
        pooled[withBatch ? 'with' : 'without'].push(...run.samples)
        pair[withBatch ? 'with' : 'without'] = figures(run.samples)
        const f = pair[withBatch ? 'with' : 'without']!
        log(
          `${s.name}, pair ${rep + 1}, ${withBatch ? 'with' : 'without'}: TTFT p50 ${f.ttftP50.toFixed(0)}, p99 ${f.ttftP99.toFixed(0)}, inter-token p99 ${f.itlP99.toFixed(0)} ms, refused ${f.refused}`,
        )
        // The run past its first 2 s: what the batch's start (a fleet full of lines) leaves out.
        pair[withBatch ? 'withLate' : 'withoutLate'] = figures(
          run.samples.filter((x) => (x.atMs ?? 0) >= 2000),
        )
        if (!withBatch) {
          for (const [ph, xs] of run.load) loadWithout.set(ph, [...(loadWithout.get(ph) ?? []), ...xs])
          continue
        }
        for (const [ph, xs] of run.held) heldWith.set(ph, [...(heldWith.get(ph) ?? []), ...xs])
        early ||= run.batchFinishedEarly
        withRuns++
        addSeconds(preemptedSeconds, run.preemptedPerSecond)
        addSeconds(doneSeconds, run.donePerSecond)
        for (const [phase, done] of run.lines) {
          const cur = lines.get(phase) ?? { lines: 0, seconds: 0 }
          cur.lines += done.lines
          cur.seconds += done.seconds
          lines.set(phase, cur)
        }
      }
      pairs.push({
        ttftP50: pair.with!.ttftP50 / pair.without!.ttftP50,
        ttftP99: pair.with!.ttftP99 / pair.without!.ttftP99,
        itlP99: pair.with!.itlP99 / pair.without!.itlP99,
        lateTtftP99: pair.withLate!.ttftP99 / pair.withoutLate!.ttftP99,
        lateItlP99: pair.withLate!.itlP99 / pair.withoutLate!.itlP99,
      })
    }
    const phaseNames = [...new Set(s.phases.map((p) => p.name))]
    const result = {
      name: s.name,
      without: figures(pooled.without),
      with: figures(pooled.with),
      phases: Object.fromEntries(
        phaseNames.map((ph) => [
          ph,
          {
            without: figures(pooled.without.filter((x) => x.phase === ph)),
            with: figures(pooled.with.filter((x) => x.phase === ph)),
          },
        ]),
      ),
      rates: Object.fromEntries([...lines].map(([k, v]) => [k, v.lines / v.seconds])),
      /** The fleet's interactive load per phase without a batch (mean of the router's gauge). */
      load: Object.fromEntries(
        [...loadWithout].map(([k, xs]) => [k, xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length)]),
      ),
      pairs,
      held: Object.fromEntries(
        [...heldWith].map(([k, xs]) => [k, xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length)]),
      ),
      early,
    }
    results.push(result)
    if (preemptedSeconds.size > 0)
      log(
        `${s.name}: lines pre-empted per run, by phase:`,
        [...preemptedSeconds]
          .map(([k, xs]) => `${k} ${(xs.reduce((a, b) => a + b, 0) / withRuns).toFixed(1)}`)
          .join(', '),
      )
    // Each phase's first half second: where a change of load meets what the batch left running.
    for (const ph of new Set(s.phases.map((p) => p.name))) {
      const onset = (xs: typeof pooled.with) =>
        xs.filter((x) => x.phase === ph && x.inPhaseMs < 500 && x.ttftMs !== undefined).map((x) => x.ttftMs!)
      const a = onset(pooled.without)
      const b = onset(pooled.with)
      log(
        `${s.name}, ${ph}, requests sent in its first 0.5 s: TTFT p50, p90, max without -> with (ms):`,
        `${pct(a, 0.5).toFixed(0)}, ${pct(a, 0.9).toFixed(0)}, ${Math.max(...a).toFixed(0)} -> ${pct(b, 0.5).toFixed(0)}, ${pct(b, 0.9).toFixed(0)}, ${Math.max(...b).toFixed(0)} (${a.length} / ${b.length})`,
      )
    }
    // What the pooled TTFT p99 is made of: the requests over the run without's p99, by phase
    // and whether they were sent in the phase's first half second.
    const over = pct(
      pooled.without.filter((x) => x.ttftMs !== undefined).map((x) => x.ttftMs!),
      0.99,
    )
    const tail = (xs: typeof pooled.with) => {
      const by = new Map<string, number>()
      for (const x of xs)
        if (x.ttftMs !== undefined && x.ttftMs > over) {
          const k = `${x.phase}${x.inPhaseMs < 500 ? ' (first 0.5 s)' : ''}`
          by.set(k, (by.get(k) ?? 0) + 1)
        }
      return [...by].map(([k, n]) => `${k} ${n}`).join(', ') || 'none'
    }
    log(
      `${s.name}: requests over the without runs' TTFT p99 (${over.toFixed(0)} ms), by phase: without ${tail(pooled.without)}; with ${tail(pooled.with)}`,
    )
    for (const [ph, xs] of preemptedSeconds)
      log(
        `${s.name}, ${ph}: lines pre-empted in each second, per run:`,
        xs.map((x) => (x / withRuns).toFixed(1)).join(' '),
      )
    for (const [ph, xs] of doneSeconds) {
      const times = withRuns * s.phases.filter((p) => p.name === ph).length
      log(
        `${s.name}, ${ph}: lines done in each second / idle rate:`,
        xs.map((x) => (x / times / idleRate).toFixed(2)).join(' '),
      )
    }
    log(
      s.name,
      JSON.stringify({
        without: result.without,
        with: result.with,
        phases: result.phases,
        batchRates: result.rates,
        pairs: result.pairs,
      }),
    )
  }

  const ratio = (a: number, b: number) => a / b
  const checks: { what: string; value: number; target: string; met: boolean }[] = []
  for (const r of results) {
    for (const [k, label] of [
      ['ttftP50', 'TTFT p50'],
      ['ttftP99', 'TTFT p99'],
      ['itlP99', 'inter-token p99'],
    ] as const) {
      const v = ratio(r.with[k], r.without[k])
      const each = r.pairs.map((p) => p[k].toFixed(2)).join(', ')
      checks.push({
        what: `${r.name}: ${label} with / without (pairs: ${each})`,
        value: v,
        target: '<= 1.10',
        met: v <= 1.1,
      })
    }
    checks.push({
      what: `${r.name}: refusals with (without ${r.without.refused})`,
      value: r.with.refused,
      target: `<= ${r.without.refused}`,
      met: r.with.refused <= r.without.refused,
    })
    if (r.early)
      checks.push({ what: `${r.name}: the batch ran the whole time`, value: 0, target: 'yes', met: false })
  }
  const bursts = results.find((r) => r.name.startsWith('bursts'))
  if (bursts) {
    const valley = (bursts.rates.valley ?? 0) / idleRate
    const peak = (bursts.rates.peak ?? 0) / idleRate
    checks.push({
      what: 'batch rate in valleys / idle rate',
      value: valley,
      target: '>= 0.80',
      met: valley >= 0.8,
    })
    checks.push({ what: 'batch rate in peaks / idle rate', value: peak, target: '<= 0.10', met: peak <= 0.1 })
  }
  checks.push({
    what: 'idle batch rate / interactive saturation',
    value: idleRate / capacity,
    target: '>= 0.90',
    met: idleRate / capacity >= 0.9,
  })
  const report: BatchYieldReport = {
    seed: SEED,
    seconds: SECONDS,
    reps: REPS,
    aa: AA,
    batchOptions,
    priority: PRIORITY,
    capacity,
    idleRate,
    results,
    checks,
  }
  if (values.json) writeFileSync(values.json, JSON.stringify(report))
  {
    console.log(
      '\n| scenario | TTFT p50 without / with (ms) | TTFT p99 without / with | inter-token p99 without / with | refused without / with | batch lines/s (by phase) |',
    )
    console.log('|---|---|---|---|---|---|')
    const f = (x: number) => x.toFixed(0)
    for (const r of results)
      console.log(
        `| ${r.name} | ${f(r.without.ttftP50)} / ${f(r.with.ttftP50)} | ${f(r.without.ttftP99)} / ${f(r.with.ttftP99)} | ${f(r.without.itlP99)} / ${f(r.with.itlP99)} | ${r.without.refused} / ${r.with.refused} | ${Object.entries(
          r.rates,
        )
          .map(([k, v]) => `${k} ${v.toFixed(1)}`)
          .join(', ')} |`,
      )
    console.log(
      '\n| scenario, phase | interactive load | nodes held for the batch | requests | TTFT p50 without / with (ms) | TTFT p99 without / with | inter-token p99 without / with |',
    )
    console.log('|---|---|---|---|---|---|---|')
    for (const r of results)
      for (const [ph, x] of Object.entries(r.phases))
        console.log(
          `| ${r.name}, ${ph} | ${(r.load[ph] ?? Number.NaN).toFixed(3)} | ${(r.held[ph] ?? Number.NaN).toFixed(2)} | ${x.without.requests} / ${x.with.requests} | ${f(x.without.ttftP50)} / ${f(x.with.ttftP50)} | ${f(x.without.ttftP99)} / ${f(x.with.ttftP99)} | ${f(x.without.itlP99)} / ${f(x.with.itlP99)} |`,
        )
    console.log('\n| target | value | wanted | |')
    console.log('|---|---|---|---|')
    for (const c of checks)
      console.log(`| ${c.what} | ${c.value.toFixed(2)} | ${c.target} | ${c.met ? 'met' : 'MISSED'} |`)
    console.log('\n| scenario | each pair past its first 2 s: TTFT p99 with / without | inter-token p99 |')
    console.log('|---|---|---|')
    for (const r of results)
      console.log(
        `| ${r.name} | ${r.pairs.map((p) => p.lateTtftP99.toFixed(2)).join(', ')} | ${r.pairs.map((p) => p.lateItlP99.toFixed(2)).join(', ')} |`,
      )
  }
} finally {
  router.proc.kill('SIGKILL')
  await router.proc.exited
  await fleet.stop()
  rmSync(dir, { recursive: true, force: true })
}
