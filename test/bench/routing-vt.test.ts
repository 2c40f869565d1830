import { describe, expect, test } from 'bun:test'
import {
  LiteLlmLatency,
  P2CLeastRequest,
  PeakEwma,
  RoundRobin,
  SglangCacheAware,
} from '../../bench/vt/policies.ts'
import { renderTables, runMatrix } from '../../bench/vt/run.ts'
import { FLEET, fleetCapacity, nodeCapacity } from '../../bench/vt/sim.ts'
import { blockHashes, seeded, trace } from '../../bench/vt/workloads.ts'
import type { Candidate } from '../../src/routing/nodes.ts'
import { Attempt, type RouteRequest } from '../../src/routing/policy.ts'
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
    const p = new SglangCacheAware(0.5, 4, 1.0001, 1000)
    const prefix = blockHashes([{ id: 7, tokens: 64 * 10 }], 64, 1)
    const first = p.choose(cands, req(0, { prefix }))!
    p.started(new Attempt(first, req(0, { prefix }), 0))
    expect(p.choose(cands, req(1, { prefix }))).toBe(first)
    for (let i = 0; i < 6; i++) pool.begin(first.node)
    expect(p.choose(cands, req(2, { prefix }))).not.toBe(first)
  })
})

describe('virtual-time routing benchmark', () => {
  test('capacity model: the fast node serves most', () => {
    const [fast, , , , , , slow] = FLEET
    expect(nodeCapacity(fast!, 2000, 200)).toBeGreaterThan(5 * nodeCapacity(slow!, 2000, 200))
    expect(fleetCapacity(FLEET, 2000, 200)).toBeGreaterThan(10)
  })

  test('traces depend on the seed only', () => {
    expect(trace('W2', 5, 20_000, 4)).toEqual(trace('W2', 5, 20_000, 4))
    expect(trace('W1', 5, 20_000, 4)).not.toEqual(trace('W1', 5, 20_000, 5))
  })

  test('W1 (shared prefixes) at 70% load: every Tropa variant beats every peer on mean and p99 TTFT', () => {
    const cells = runMatrix({ workloads: ['W1'], loads: [0.7], durationMs: 60_000, seed: 3 })
    const tropa = cells.filter((c) => c.policy.startsWith('tropa'))
    const peers = cells.filter((c) => !c.policy.startsWith('tropa'))
    expect(tropa).toHaveLength(3)
    expect(peers).toHaveLength(6)
    const mean = (c: (typeof cells)[number]) =>
      c.unserved > c.requests * 0.01 ? Number.POSITIVE_INFINITY : c.meanMs
    const bestPeerMean = Math.min(...peers.map(mean))
    const bestPeerP99 = Math.min(...peers.map((c) => c.p99Ms))
    for (const t of tropa) {
      expect(t.unserved).toBe(0)
      // The margins: mean at least 30% lower, p99 at least 2x lower than the best peer's.
      expect(mean(t)).toBeLessThan(0.7 * bestPeerMean)
      expect(t.p99Ms).toBeLessThan(0.5 * bestPeerP99)
    }
  })

  test('a short run gives a complete table, the same twice', () => {
    const opts = { workloads: ['W1', 'W3'] as const, loads: [0.5], durationMs: 15_000, seed: 2 }
    const a = runMatrix(opts)
    const b = runMatrix(opts)
    expect(a).toEqual(b)
    expect(a).toHaveLength(2 * 9)
    for (const c of a) {
      expect(c.requests).toBeGreaterThan(0)
      expect(Number.isFinite(c.p50Ms)).toBe(true)
    }
    const table = renderTables(a)
    for (const p of ['round-robin', 'litellm-latency', 'sglang-cache-aware', 'tropa (hedging)'])
      expect(table).toContain(p)
  })
})
