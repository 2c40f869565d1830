/**
 * `bun bench/vt/compare.ts --fleet identical-8 --workload W1 --load 70 --seed 1 [--peer sglang-v0.4]`:
 * one cell of the virtual-time grid, Tropa and one peer over the same trace, joined request by
 * request. Each request is put in a category by how each policy served it: a prefix-cache hit or
 * a miss (usage's `cached_tokens`), and whether its first attempt went "off" the nodes its first
 * prefix block had been sent to before (another node held the prefix). Per category: how many,
 * each policy's mean TTFT, and the summed difference: where Tropa's mean gains or loses against
 * the peer's. `--policy` picks another Tropa variant (a name in run.ts's VARIANTS); `--by-node`
 * adds each policy's requests per node (their first attempt's), hits and misses apart.
 */
import { parseArgs } from 'node:util'
import type { Attempt, Outcome, RoutingPolicy } from '../../src/routing/policy.ts'
import { cellSetup, type Task, VARIANTS, type Variant } from './run.ts'
import { FLEETS, type FleetName, simulate } from './sim.ts'
import { seeded, WORKLOAD_NAMES, type WorkloadName } from './workloads.ts'

interface Served {
  startMs: number
  ttftMs: number
  cached: number
  off: boolean
  /** The node its first attempt went to. */
  node: string
}

/** Runs one variant over the cell, recording each request's first attempt, TTFT and cached tokens. */
function run(v: Variant, t: Task, durationMs: number): Map<string, Served> {
  const { prepared, sim } = cellSetup(t, durationMs)
  const policy: RoutingPolicy = v.make(seeded(t.seed))
  const served = new Map<string, Served>()
  /** First prefix block -> nodes it was sent to. */
  const holders = new Map<number, Set<string>>()
  // A request is its last prefix block (unique suffixes) and its length.
  const key = (a: Attempt) => `${a.req.prefix[a.req.prefix.length - 1]}:${a.req.promptTokens}`
  const started = policy.started.bind(policy)
  const firstChunk = policy.firstChunk.bind(policy)
  const ended = policy.ended.bind(policy)
  policy.started = (a: Attempt) => {
    // A session warm-up shares its request's prompt (and key): it is no request of the trace.
    if (a.warmup) return started(a)
    const first = a.req.prefix[0] ?? -1
    let h = holders.get(first)
    if (!h) {
      h = new Set()
      holders.set(first, h)
    }
    const k = key(a)
    if (!served.has(k))
      served.set(k, {
        startMs: a.startedAtMs,
        ttftMs: Number.NaN,
        cached: 0,
        off: h.size > 0 && !h.has(a.candidate.node.name),
        node: a.candidate.node.name,
      })
    h.add(a.candidate.node.name)
    started(a)
  }
  policy.firstChunk = (a: Attempt, nowMs: number) => {
    if (a.warmup) return firstChunk(a, nowMs)
    const s = served.get(key(a))
    if (s && Number.isNaN(s.ttftMs)) s.ttftMs = nowMs - s.startMs
    firstChunk(a, nowMs)
  }
  policy.ended = (a: Attempt, nowMs: number, outcome: Outcome, cached: number | undefined, out?: number) => {
    if (a.warmup) return ended(a, nowMs, outcome, cached, out)
    const s = served.get(key(a))
    if (s && outcome === 'ok' && cached !== undefined) s.cached = cached
    ended(a, nowMs, outcome, cached, out)
  }
  simulate(policy, prepared, {
    ...sim,
    metricsEveryMs: v.metricsEveryMs,
    hedge: v.hedge === true,
    ttftBudgetMs: v.ttftBudgetMs,
  })
  return served
}

if (import.meta.main) {
  const { values } = parseArgs({
    options: {
      fleet: { type: 'string', default: 'identical-8' },
      workload: { type: 'string', default: 'W1' },
      load: { type: 'string', default: '70' },
      seed: { type: 'string', default: '1' },
      duration: { type: 'string', default: '60' },
      policy: { type: 'string', default: 'tropa' },
      peer: { type: 'string', default: 'sglang-v0.4' },
      'by-node': { type: 'boolean', default: false },
    },
  })
  if (!(values.fleet! in FLEETS)) throw new Error(`--fleet: one of ${Object.keys(FLEETS).join(', ')}`)
  if (!WORKLOAD_NAMES.includes(values.workload as WorkloadName))
    throw new Error(`--workload: one of ${WORKLOAD_NAMES.join(', ')}`)
  const variant = (name: string) => {
    const v = VARIANTS.find((x) => x.name === name)
    if (!v) throw new Error(`unknown policy ${name} (one of ${VARIANTS.map((x) => x.name).join(', ')})`)
    return v
  }
  const task: Task = {
    fleet: values.fleet as FleetName,
    workload: values.workload as WorkloadName,
    load: Number(values.load) / 100,
    seed: Number(values.seed),
  }
  const durationMs = Number(values.duration) * 1000
  const mine = run(variant(values.policy!), task, durationMs)
  const theirs = run(variant(values.peer!), task, durationMs)
  const label = (s: Served) => `${s.cached > 0 ? 'hit' : 'miss'}${s.off ? ' (off)' : ''}`
  const cats = new Map<string, { n: number; mine: number; theirs: number }>()
  let n = 0
  let sumMine = 0
  let sumTheirs = 0
  for (const [k, a] of mine) {
    const b = theirs.get(k)
    // Measured requests served by both, as the grid measures them (after the first 10%).
    if (!b || a.startMs < durationMs * 0.1 || Number.isNaN(a.ttftMs) || Number.isNaN(b.ttftMs)) continue
    const cat = `${values.policy} ${label(a)} / ${values.peer} ${label(b)}`
    const c = cats.get(cat) ?? { n: 0, mine: 0, theirs: 0 }
    c.n++
    c.mine += a.ttftMs
    c.theirs += b.ttftMs
    cats.set(cat, c)
    n++
    sumMine += a.ttftMs
    sumTheirs += b.ttftMs
  }
  console.log(
    `${task.fleet} ${task.workload} ${values.load}% seed ${task.seed}: ${values.policy} vs ${values.peer}, request by request ("off": its first attempt went to a node its prefix had not been sent to while another had)\n`,
  )
  console.log(
    '| category | requests | mean TTFT (ms), first | mean TTFT (ms), second | summed difference (s) |',
  )
  console.log('| --- | --- | --- | --- | --- |')
  for (const [cat, c] of [...cats].sort((x, y) => y[1].n - x[1].n))
    console.log(
      `| ${cat} | ${c.n} | ${(c.mine / c.n).toFixed(0)} | ${(c.theirs / c.n).toFixed(0)} | ${((c.mine - c.theirs) / 1000).toFixed(1)} |`,
    )
  // The slowest first tokens of each (a cell's p99 is the second or third of a few hundred).
  for (const [name, served, other] of [
    [values.policy!, mine, theirs],
    [values.peer!, theirs, mine],
  ] as const) {
    const worst = [...served]
      .filter(([, a]) => a.startMs >= durationMs * 0.1 && !Number.isNaN(a.ttftMs))
      .sort((x, y) => y[1].ttftMs - x[1].ttftMs)
      .slice(0, 3)
      .map(([k, a]) => {
        const b = other.get(k)
        return `${a.ttftMs.toFixed(0)} ms on ${a.node} (${label(a)}; the other: ${b ? `${b.ttftMs.toFixed(0)} ms on ${b.node}` : '-'})`
      })
    console.log(`${name}, slowest: ${worst.join(', ')}`)
  }
  console.log(
    `| all | ${n} | ${(sumMine / Math.max(1, n)).toFixed(1)} | ${(sumTheirs / Math.max(1, n)).toFixed(1)} | ${((sumMine - sumTheirs) / 1000).toFixed(1)} |`,
  )
  if (values['by-node']) {
    // Where each policy's measured requests went (their first attempt's node) and how they fared.
    console.log(
      '\n| policy | node | requests | hits | mean TTFT (ms) | hits, mean (ms) | misses, mean (ms) |',
    )
    console.log('| --- | --- | --- | --- | --- | --- | --- |')
    for (const [name, served] of [
      [values.policy!, mine],
      [values.peer!, theirs],
    ] as const) {
      const by = new Map<string, { n: number; hits: number; sum: number; hitSum: number }>()
      for (const a of served.values()) {
        if (a.startMs < durationMs * 0.1 || Number.isNaN(a.ttftMs)) continue
        const r = by.get(a.node) ?? { n: 0, hits: 0, sum: 0, hitSum: 0 }
        r.n++
        r.sum += a.ttftMs
        if (a.cached > 0) {
          r.hits++
          r.hitSum += a.ttftMs
        }
        by.set(a.node, r)
      }
      for (const [node, r] of [...by].sort((x, y) => x[0].localeCompare(y[0]))) {
        const misses = r.n - r.hits
        console.log(
          `| ${name} | ${node} | ${r.n} | ${r.hits} | ${(r.sum / r.n).toFixed(0)} | ${r.hits ? (r.hitSum / r.hits).toFixed(0) : '-'} | ${misses ? ((r.sum - r.hitSum) / misses).toFixed(0) : '-'} |`,
        )
      }
    }
  }
}
