import { describe, expect, test } from 'bun:test'
import {
  type BenchRouteRequest,
  LiteLlmLatency,
  LlmdEndpointPicker,
  P2CLeastRequest,
  PeakEwma,
  RoundRobin,
  SglangCacheAware,
  VllmPrefixAware,
  VllmSession,
} from '../../bench/vt/policies.ts'
import { renderGrid, runTask, summarize, VARIANTS } from '../../bench/vt/run.ts'
import { FLEET, FLEETS, fleetCapacity, nodeCapacity, prepare, simulate } from '../../bench/vt/sim.ts'
import { blockHashes, seeded, trace } from '../../bench/vt/workloads.ts'
import type { Candidate } from '../../src/routing/nodes.ts'
import { Attempt, LeastInFlight, type RouteRequest } from '../../src/routing/policy.ts'
import { routeFleet } from '../helpers/fleet.ts'

const fleet = (n: number) => routeFleet(n, 1000)
const req = (nowMs: number, over: Partial<RouteRequest> = {}): RouteRequest => ({
  modelId: 'm/x',
  promptTokens: 100,
  prefix: [],
  blockTokens: 64,
  session: undefined,
  stream: true,
  exclude: new Set(),
  nowMs,
  ...over,
})

describe('baseline policies', () => {
  test('round-robin rotates and skips excluded nodes', () => {
    const { cands } = fleet(3)
    const p = new RoundRobin()
    expect([0, 1, 2, 3].map(() => p.choose(cands, req(0))!.node.name)).toEqual(['n0', 'n1', 'n2', 'n0'])
    expect(p.choose(cands, req(0, { exclude: new Set([cands[1]!]) }))!.node.name).toBe('n2')
  })

  test('P2C least-request takes the less busy of its two samples', () => {
    const { pool, cands } = fleet(2)
    for (let i = 0; i < 5; i++) pool.begin(cands[0]!.node)
    const p = new P2CLeastRequest(seeded(3))
    const picks = Array.from({ length: 200 }, () => p.choose(cands, req(0))!.node.name)
    // n0 only wins when both samples are n0 (a quarter of the time).
    const n0 = picks.filter((n) => n === 'n0').length
    expect(n0).toBeGreaterThan(25)
    expect(n0).toBeLessThan(75)
  })

  test('peak EWMA: a slow first byte counts at once, and cost grows with load', () => {
    const { pool, cands } = fleet(2)
    const p = new PeakEwma(seeded(1))
    for (const [c, ms] of [
      [cands[0]!, 100],
      [cands[1]!, 1000],
    ] as const) {
      const a = new Attempt(c, req(0), 0)
      p.firstChunk(a, ms)
    }
    const picks = Array.from({ length: 100 }, () => p.choose(cands, req(2000))!.node.name)
    expect(picks.filter((n) => n === 'n0').length).toBeGreaterThan(70)
    for (let i = 0; i < 20; i++) pool.begin(cands[0]!.node)
    const loaded = Array.from({ length: 100 }, () => p.choose(cands, req(2000))!.node.name)
    expect(loaded.filter((n) => n === 'n1').length).toBeGreaterThan(70)
  })

  test("LiteLLM latency: untried first, then the lowest average; a full list replaces only its last entry (as LiteLLM's does)", () => {
    const { cands } = fleet(2)
    const p = new LiteLlmLatency(seeded(1), 3)
    const serve = (c: Candidate, ttftMs: number, t: number) => {
      const a = new Attempt(c, req(t), t)
      a.firstAtMs = t + ttftMs
      p.ended(a, t + ttftMs + 10, 'ok', undefined, 1)
    }
    serve(cands[0]!, 100, 0)
    expect(p.choose(cands, req(1))!.node.name).toBe('n1') // never used: latency 0
    serve(cands[1]!, 50, 0)
    expect(p.choose(cands, req(1))!.node.name).toBe('n1')
    // n1 turns slow: its list [50] -> [50, 900, 900], average 617 ms > n0's 100 ms
    serve(cands[1]!, 900, 10)
    serve(cands[1]!, 900, 20)
    expect(p.choose(cands, req(30))!.node.name).toBe('n0')
    // n0 gets slow for a while: its list becomes [100, 2000, 2000] ms, so n1 (617 ms) wins.
    for (let i = 0; i < 10; i++) serve(cands[0]!, 2000, 40 + i)
    expect(p.choose(cands, req(100))!.node.name).toBe('n1')
    // n0 is fast again, but only the last slot ever changes: [100, 2000, 50] still averages 717.
    for (let i = 0; i < 10; i++) serve(cands[0]!, 50, 200 + i)
    expect(p.choose(cands, req(300))!.node.name).toBe('n1')
  })

  test('SGLang cache-aware: prefix match over the threshold wins; imbalance goes to the least loaded', () => {
    const { pool, cands } = fleet(2)
    const p = new SglangCacheAware('sglang', 0.5, 4, 1.0001, 1000)
    const prefix = blockHashes([{ id: 7, tokens: 64 * 10 }], 64, 1)
    const first = p.choose(cands, req(0, { prefix }))!
    p.started(new Attempt(first, req(0, { prefix }), 0))
    expect(p.choose(cands, req(1, { prefix }))).toBe(first)
    for (let i = 0; i < 6; i++) pool.begin(first.node)
    expect(p.choose(cands, req(2, { prefix }))).not.toBe(first)
  })
})

describe("today's serving routers", () => {
  const fine = (id: number, blocks: number) => blockHashes([{ id, tokens: 16 * blocks }], 16, 1)
  const breq = (nowMs: number, f: number[], over: Partial<RouteRequest> = {}): BenchRouteRequest => ({
    ...req(nowMs, over),
    fine: f,
  })

  test('llm-d EPP: weighted 2/2/3 queue, KV use and prefix scores; the prefix wins unless the queue and KV say otherwise', () => {
    const { cands } = fleet(3)
    const p = new LlmdEndpointPicker(seeded(1))
    const m = (waiting: number, kv: number) => ({ waiting, running: 1, kvUsage: kv, cacheBlocks: 1000 })
    for (const c of cands) p.nodeMetrics(c.node, m(0, 0))
    const f = fine(5, 20)
    const first = p.choose(cands, breq(0, f))!
    p.started(new Attempt(first, breq(0, f), 0))
    expect(p.choose(cands, breq(1, f))).toBe(first) // prefix 3 + queue 2 + kv 2
    // its queue is the longest and its KV cache full: 3 + 0 + 0 < 0 + 2 + 2
    p.nodeMetrics(first.node, m(4, 1))
    expect(p.choose(cands, breq(2, f))).not.toBe(first)
    // at most 256 blocks count: two prompts equal on their first 256 blocks score the same
    const long = fine(9, 300)
    p.nodeMetrics(first.node, m(0, 0))
    p.started(new Attempt(first, breq(3, long), 3))
    const other = [...long.slice(0, 256), ...fine(10, 44)]
    expect(p.choose(cands, breq(4, other))).toBe(first)
  })

  test('vLLM prefixaware: the longest match, at random among equals, with no load term', () => {
    const { pool, cands } = fleet(3)
    const p = new VllmPrefixAware(seeded(2))
    const f = fine(3, 10)
    const first = p.choose(cands, breq(0, f))!
    p.started(new Attempt(first, breq(0, f), 0))
    for (let i = 0; i < 50; i++) pool.begin(first.node)
    expect(p.choose(cands, breq(1, [...f, ...fine(4, 2)]))).toBe(first)
    const fresh = new Set(
      Array.from({ length: 60 }, (_, i) => p.choose(cands, breq(2, fine(100 + i, 3)))!.node.name),
    )
    expect(fresh.size).toBe(3)
  })

  test('vLLM session: a session sticks to its hash-ring node; without one, the lowest QPS', () => {
    const { cands } = fleet(4)
    const p = new VllmSession()
    const a = p.choose(cands, req(0, { session: 'user-1' }))!
    for (let t = 0; t < 20; t++) p.started(new Attempt(a, req(t), t))
    expect(p.choose(cands, req(30, { session: 'user-1' }))).toBe(a)
    const users = new Set(
      Array.from({ length: 40 }, (_, i) => p.choose(cands, req(40, { session: `u${i}` }))!.node.name),
    )
    expect(users.size).toBe(4)
    // never-used nodes first, then the fewest requests within the last 60 s
    const b = p.choose(cands, req(50))!
    expect(b).not.toBe(a)
    for (const c of cands) if (c !== a) p.started(new Attempt(c, req(5000), 5000))
    expect(p.choose(cands, req(61_000))).toBe(a) // its 20 starts left the window; the others' did not
  })
})

describe('virtual-time routing benchmark', () => {
  test('capacity model: the fast node serves most', () => {
    const [fast, , , , , , slow] = FLEET
    expect(nodeCapacity(fast!, 2000, 200)).toBeGreaterThan(5 * nodeCapacity(slow!, 2000, 200))
    expect(fleetCapacity(FLEET, 2000, 200)).toBeGreaterThan(10)
    expect(FLEETS['mixed-32']).toHaveLength(32)
    expect(new Set(FLEETS['identical-16'].map((n) => n.prefillTokensPerSec)).size).toBe(1)
  })

  test('traces depend on the seed only; agentic turns carry the whole previous context', () => {
    expect(trace('W2', 5, 20_000, 4)).toEqual(trace('W2', 5, 20_000, 4))
    expect(trace('W1', 5, 20_000, 4)).not.toEqual(trace('W1', 5, 20_000, 5))
    const s = trace('agentic', 5, 20_000, 1)[0]!
    const second = s.next!
    expect(second.segments.slice(0, s.segments.length)).toEqual([...s.segments])
    expect(second.promptTokens).toBe(s.promptTokens + 200 + 400)
    expect(second.thinkMs).toBeGreaterThanOrEqual(1000)
  })

  test('a closed loop sends the next turn only after the previous one ends', () => {
    const prepared = prepare(trace('agentic', 1, 30_000, 2))
    const opts = {
      fleet: FLEETS['identical-8'],
      metricsEveryMs: undefined,
      hedge: false,
      slowdowns: [],
      stalls: [],
      measureFromMs: 0,
      measureToMs: 30_000,
      horizonMs: 150_000,
    }
    const r = simulate(new LeastInFlight(), prepared, opts)
    // more requests than sessions (turns follow), fewer than every turn of every session
    expect(r.measured).toBeGreaterThan(prepared.length)
    expect(r.measured).toBeLessThan(prepared.length * 10)
    expect(r.unserved).toBe(0)
  })

  test('a stalled node answers nothing for its 30 s; a policy that keeps sending to it is counted', () => {
    const prepared = prepare(trace('W3', 4, 60_000, 3))
    const opts = {
      fleet: FLEETS['identical-8'],
      metricsEveryMs: undefined,
      hedge: false,
      slowdowns: [],
      stalls: [[0, 10_000, 40_000] as const],
      measureFromMs: 0,
      measureToMs: 60_000,
      horizonMs: 200_000,
    }
    const rr = simulate(new RoundRobin(), prepared, opts)
    const sorted = [...rr.ttftMs].sort((a, b) => a - b)
    // round-robin keeps sending an eighth of the traffic into the stall: those wait up to 30 s
    expect(rr.sentToStalledAfter2s).toBeGreaterThan(10) // 4 req/s x 28 s / 8
    expect(sorted[sorted.length - 1]!).toBeGreaterThan(25_000)
    expect(rr.unserved).toBe(0)
  })

  test('a short grid is complete and the same twice; the summary compares Tropa with the best peer', () => {
    const task = { fleet: 'identical-8' as const, workload: 'W3' as const, load: 0.5, seed: 2 }
    const a = runTask(task, 15_000, VARIANTS)
    expect(runTask(task, 15_000, VARIANTS)).toEqual(a)
    expect(a).toHaveLength(VARIANTS.length)
    for (const c of a) {
      expect(c.requests).toBeGreaterThan(0)
      expect(Number.isFinite(c.p50Ms)).toBe(true)
    }
    const [s] = summarize(a)
    const best = Math.min(...a.filter((c) => !c.policy.startsWith('tropa')).map((c) => c.meanMs))
    expect(s!.mean[0]).toBeCloseTo(a.find((c) => c.policy === 'tropa')!.meanMs / best)
    const grid = renderGrid(summarize(a))
    expect(grid.text).toContain('identical-8 | W3 | 50%')
    expect(grid.total).toBe(2)
  })
})
