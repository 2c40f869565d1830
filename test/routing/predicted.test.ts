import { describe, expect, test } from 'bun:test'
import { seeded } from '../../bench/vt/workloads.ts'
import { ShareBudget } from '../../src/routing/budget.ts'
import type { Candidate, NodePool } from '../../src/routing/nodes.ts'
import { Attempt, type RouteRequest } from '../../src/routing/policy.ts'
import { PredictedTtft } from '../../src/routing/predicted.ts'
import { BlockHasher, chainSeed } from '../../src/routing/prefix.ts'
import { routeFleet } from '../helpers/fleet.ts'

const fleet = routeFleet

/** A seeded generator so choices are repeatable. */
const rng = (seed = 1) => seeded(seed)

function prefixOf(text: string): number[] {
  const h = new BlockHasher(chainSeed('m/x'))
  h.push(text)
  return h.hashes
}

const req = (over: Partial<RouteRequest> & { nowMs: number }): RouteRequest => ({
  modelId: 'm/x',
  promptTokens: 1000,
  prefix: [],
  blockTokens: 64,
  session: undefined,
  stream: true,
  exclude: new Set(),
  ...over,
})

/** Runs one attempt through its life: started, first chunk after `ttftMs`, ended after `totalMs`. */
function serve(
  p: PredictedTtft,
  pool: NodePool,
  c: Candidate,
  r: RouteRequest,
  ttftMs: number,
  totalMs = ttftMs,
) {
  pool.begin(c.node, r.nowMs)
  const a = new Attempt(c, r, r.nowMs)
  p.started(a)
  p.firstChunk(a, r.nowMs + ttftMs)
  pool.end(c.node, true, r.nowMs + totalMs)
  p.ended(a, r.nowMs + totalMs, 'ok', undefined, 10)
  return a
}

describe('PredictedTtft', () => {
  test('sends a prompt to the node that holds its prefix when loads are equal', () => {
    const { pool, cands } = fleet(8)
    const p = new PredictedTtft({ rng: rng(), sampled: 2 })
    const shared = 'system prompt '.repeat(400)
    const first = req({ nowMs: 0, prefix: prefixOf(`${shared}question one`), promptTokens: 1500 })
    const home = p.choose(cands, first)!
    serve(p, pool, home, first, 200)
    for (let i = 0; i < 20; i++) {
      const r = req({
        nowMs: 1000 + i * 1000,
        prefix: prefixOf(`${shared}question ${i}`),
        promptTokens: 1500,
      })
      const c = p.choose(cands, r)!
      expect(c).toBe(home)
      serve(p, pool, c, r, 50)
    }
  })

  test('a silent node (requests out, no first token) is priced out within a couple of seconds, and back when it answers', () => {
    const { pool, cands } = fleet(3)
    const p = new PredictedTtft({ rng: rng() })
    const prefix = prefixOf('y'.repeat(256 * 20))
    const r0 = req({ nowMs: 0, prefix, promptTokens: 1500 })
    const home = p.choose(cands, r0)!
    for (let i = 0; i < 5; i++)
      serve(p, pool, home, req({ nowMs: i * 1000, prefix, promptTokens: 1500 }), 100)
    // home stops answering: one request goes out at 10 s and nothing comes back
    const stuck = new Attempt(home, req({ nowMs: 10_000, prefix, promptTokens: 1500 }), 10_000)
    pool.begin(home.node, 10_000)
    p.started(stuck)
    // at first the prefix keeps it home; 2 s into the silence it goes elsewhere
    expect(p.choose(cands, req({ nowMs: 10_050, prefix, promptTokens: 1500 }))).toBe(home)
    expect(p.choose(cands, req({ nowMs: 12_000, prefix, promptTokens: 1500 }))).not.toBe(home)
    // it answers (late, so its rate dips and recovers over ~10 s): back to the prefix's home
    p.firstChunk(stuck, 12_500)
    pool.end(home.node, true, 13_000)
    p.ended(stuck, 13_000, 'ok', undefined, 10)
    expect(p.choose(cands, req({ nowMs: 40_000, prefix, promptTokens: 1500 }))).toBe(home)
  })

  test('a node given up on without a first token is priced by its silence at once', () => {
    const { pool, cands } = fleet(3)
    const p = new PredictedTtft({ rng: rng() })
    const prefix = prefixOf('y'.repeat(256 * 20))
    const home = p.choose(cands, req({ nowMs: 0, prefix, promptTokens: 1500 }))!
    for (let i = 0; i < 5; i++)
      serve(p, pool, home, req({ nowMs: i * 1000, prefix, promptTokens: 1500 }), 100)
    // A request sent home at 10 s gets no first token; a hedge elsewhere wins at 10.7 s.
    const lost = new Attempt(home, req({ nowMs: 10_000, prefix, promptTokens: 1500 }), 10_000)
    pool.begin(home.node, 10_000)
    p.started(lost)
    pool.end(home.node, true, 10_700)
    p.ended(lost, 10_700, 'cancelled', undefined)
    // 0.9 s of silence, short of the 1 s a node with requests merely queued is allowed: the
    // prefix no longer draws the next one there.
    expect(p.choose(cands, req({ nowMs: 10_900, prefix, promptTokens: 1500 }))).not.toBe(home)
    // Suspicion lapses (suspectMaxMs) with nothing sent there: back to the prefix's home.
    expect(p.choose(cands, req({ nowMs: 41_000, prefix, promptTokens: 1500 }))).toBe(home)
  })

  test('a low rate at a request end dips the node from then only when it is slow next to the fleet and its first token recent', () => {
    // Four nodes measured at 8k tokens/s; then first tokens at a quarter of that (slots full),
    // on every node (a burst) or on one alone, the requests ending at `endMs`.
    const run = (slowAlone: boolean, endMs: number) => {
      const { pool, cands } = fleet(4)
      const p = new PredictedTtft({ rng: rng(), recoveryMs: 10_000 })
      for (const c of cands) serve(p, pool, c, req({ nowMs: 0, promptTokens: 2000 }), 250)
      const open: Attempt[] = []
      for (const [i, c] of cands.entries())
        for (let k = 0; k < 3; k++) {
          const r = req({ nowMs: 1000, promptTokens: 2000 })
          pool.begin(c.node, 1000)
          const a = new Attempt(c, r, 1000)
          p.started(a)
          // (one at a time in the queue: each first token is its own sample)
          const slow = !slowAlone || i === 0
          p.firstChunk(a, slow ? 2000 + k : 1250 + k)
          open.push(a)
        }
      for (const a of open) {
        pool.end(a.candidate.node, true, endMs)
        p.ended(a, endMs, 'ok', 0, 200)
      }
      return p.model(cands[0]!.node).rate(endMs)
    }
    // The whole fleet was slow (load, now gone): the dip dates from the first tokens, 10 s
    // back, and has mostly recovered.
    expect(run(false, 12_000)).toBeGreaterThan(4_000)
    // Only this node was slow, a second ago: it is priced down from the end.
    expect(run(true, 3_000)).toBeLessThan(2_500)
    // Only this node was slow, but 10 s ago (a long answer's end reports a first token that
    // waited for a slot in a burst): dated from that first token too, not priced out anew.
    expect(run(true, 12_000)).toBeGreaterThan(4_000)
  })

  test('a hung node with only streams decoding there (its /metrics frozen) is priced out, and back when they move', () => {
    const { pool, cands } = fleet(3)
    const p = new PredictedTtft({ rng: rng() })
    const prefix = prefixOf('z'.repeat(256 * 20))
    const home = p.choose(cands, req({ nowMs: 0, prefix, promptTokens: 1500 }))!
    for (let i = 0; i < 5; i++)
      serve(p, pool, home, req({ nowMs: i * 1000, prefix, promptTokens: 1500 }), 100)
    // a stream is decoding on home (first chunk at 9.1 s, no end): nothing of ours awaits a first token
    const streaming = new Attempt(home, req({ nowMs: 9000, prefix, promptTokens: 1500 }), 9000)
    pool.begin(home.node, 9000)
    p.started(streaming)
    p.firstChunk(streaming, 9100)
    const poll = (nowMs: number, homeKv: number) => {
      for (const c of cands)
        p.nodeMetrics(c.node, { waiting: 0, running: 1, kvUsage: c === home ? homeKv : nowMs / 1e6 }, nowMs)
    }
    const next = (nowMs: number) => p.choose(cands, req({ nowMs, prefix, promptTokens: 1500 }))
    // one unchanged poll is not enough (a long prefill can hold the KV use still for a while)
    poll(10_000, 0.1)
    poll(11_000, 0.1)
    expect(next(11_050)).toBe(home)
    // two seconds without its KV use moving while a stream of ours decodes there: hung
    poll(12_000, 0.1)
    expect(next(12_050)).not.toBe(home)
    // its KV use moves again: back to the prefix's home
    poll(13_000, 0.11)
    expect(next(13_050)).toBe(home)
  })

  test('frozen /metrics on a node with nothing of ours decoding there is no sign of a hang', () => {
    const { pool, cands } = fleet(3)
    const p = new PredictedTtft({ rng: rng() })
    const prefix = prefixOf('w'.repeat(256 * 20))
    const home = p.choose(cands, req({ nowMs: 0, prefix, promptTokens: 1500 }))!
    for (let i = 0; i < 5; i++)
      serve(p, pool, home, req({ nowMs: i * 1000, prefix, promptTokens: 1500 }), 100)
    for (let t = 10_000; t <= 15_000; t += 1000)
      for (const c of cands)
        p.nodeMetrics(c.node, { waiting: 0, running: 2, kvUsage: c === home ? 0.2 : t / 1e6 }, t)
    expect(p.choose(cands, req({ nowMs: 15_050, prefix, promptTokens: 1500 }))).toBe(home)
  })

  test('load outweighs the prefix: a node with a long queue loses to an idle one', () => {
    const { pool, cands } = fleet(2)
    const p = new PredictedTtft({ rng: rng() })
    const shared = 'x'.repeat(256 * 8)
    const r0 = req({ nowMs: 0, prefix: prefixOf(shared), promptTokens: 600 })
    const home = p.choose(cands, r0)!
    serve(p, pool, home, r0, 100)
    // Queue 50k uncached tokens on the home node (sent, no first chunk yet).
    for (let i = 0; i < 10; i++) {
      const r = req({ nowMs: 1000, promptTokens: 5000, exclude: new Set(cands.filter((c) => c !== home)) })
      pool.begin(home.node, 1000)
      p.started(new Attempt(home, r, 1000))
    }
    const next = p.choose(cands, req({ nowMs: 1001, prefix: prefixOf(`${shared}more`), promptTokens: 600 }))
    expect(next).not.toBe(home)
  })

  test("a batch line's prompt counts as work queued on its node until the node has likely prefilled it", () => {
    const { pool, cands } = fleet(2)
    const p = new PredictedTtft({ rng: rng() })
    const [a, b] = cands as [Candidate, Candidate]
    // Both nodes prefill 10k tokens/s.
    serve(p, pool, a, req({ nowMs: 0, promptTokens: 2000 }), 200)
    serve(p, pool, b, req({ nowMs: 0, promptTokens: 2000 }), 200)
    const ttft = (c: Candidate, nowMs: number) => p.predict(p.model(c.node), 1000, 0, nowMs)
    const even = ttft(b, 1000)
    expect(ttft(a, 1000)).toBeCloseTo(even, 0)
    // Two lines of 2,000 prompt tokens start on a: 400 ms of prefill ahead of a request sent now.
    pool.beginBatch(a.node, 2000, 1000)
    pool.beginBatch(a.node, 2000, 1000)
    expect(ttft(a, 1000) - even).toBeGreaterThan(380)
    expect(ttft(a, 1000) - even).toBeLessThan(420)
    expect(p.choose(cands, req({ nowMs: 1000, promptTokens: 1000 }))).toBe(b)
    // Half done after 200 ms; done after 400 (the lines decode on: no queue left).
    expect(ttft(a, 1200) - ttft(b, 1200)).toBeCloseTo(200, -1)
    expect(ttft(a, 1400)).toBeCloseTo(ttft(b, 1400), 0)
    // A pre-empted line (the newest first) takes its prefill with it.
    pool.beginBatch(a.node, 2000, 2000)
    pool.preemptBatch(a.node, 2000)
    expect(ttft(a, 2000)).toBeCloseTo(ttft(b, 2000), 0)
  })

  test('learns prefill rates from first tokens: the fast node gets the traffic', () => {
    const { pool, cands } = fleet(2, 1000)
    const p = new PredictedTtft({ rng: rng() })
    const [a, b] = cands as [Candidate, Candidate]
    // a prefills 20k tokens/s, b 2k tokens/s
    serve(p, pool, a, req({ nowMs: 0, promptTokens: 2000 }), 100)
    serve(p, pool, b, req({ nowMs: 0, promptTokens: 2000 }), 1000)
    expect(p.model(a.node).rate(1000)).toBeCloseTo(20_000, -2)
    expect(p.model(b.node).rate(1000)).toBeCloseTo(2_000, -2)
    let onA = 0
    for (let i = 0; i < 100; i++) {
      const r = req({ nowMs: 2000 + i, promptTokens: 2000 })
      const c = p.choose(cands, r)!
      pool.begin(c.node, r.nowMs)
      p.started(new Attempt(c, r, r.nowMs))
      if (c === a) onA++
    }
    // With nothing answered, queues build: a takes about ten times b's share.
    expect(onA).toBeGreaterThan(80)
    expect(onA).toBeLessThan(100)
  })

  test("a node not measured yet is priced at its measured twins' rate: the same KV-cache size in /metrics", () => {
    const { pool, cands } = fleet(4, 1000)
    const p = new PredictedTtft({ rng: rng() })
    const [fast, fastTwin, lone, other] = cands as [Candidate, Candidate, Candidate, Candidate]
    const blocks = new Map([
      [fast, 37_500],
      [fastTwin, 37_500],
      [lone, 1_000],
      [other, 12_500],
    ])
    const poll = (nowMs: number) => {
      for (const [c, cacheBlocks] of blocks)
        p.nodeMetrics(c.node, { waiting: 0, running: 0, kvUsage: 0, cacheBlocks }, nowMs)
    }
    poll(0)
    const prior = p.model(fastTwin.node).rate(0)
    const priorItl = p.model(fastTwin.node).itlMs
    expect(p.model(lone.node).rate(0)).toBe(prior)
    // `fast` is measured at 20k tokens/s and 40 ms a token: its unmeasured twin takes both at once
    // (before the next poll); the nodes with no twin keep the priors.
    serve(p, pool, fast, req({ nowMs: 100, promptTokens: 2000 }), 100, 100 + 9 * 40)
    expect(p.model(fast.node).measured).toBe(true)
    expect(p.model(fastTwin.node).measured).toBe(false)
    expect(p.model(fastTwin.node).rate(600)).toBeCloseTo(20_000, -2)
    expect(p.model(fastTwin.node).itlMs).toBe(p.model(fast.node).itlMs)
    expect(p.model(fast.node).itlMs).not.toBe(priorItl)
    for (const c of [lone, other]) {
      expect(p.model(c.node).rate(600)).toBe(prior)
      expect(p.model(c.node).itlMs).toBe(priorItl)
    }
    expect(p.choose([fastTwin, other], req({ nowMs: 600, promptTokens: 3000 }))).toBe(fastTwin)
    poll(1_000)
    expect(p.model(fastTwin.node).rate(1_000)).toBeCloseTo(20_000, -2)
    expect(p.model(other.node).rate(1_000)).toBe(prior)
    // Once measured itself, a node learns from its own requests only, and lends nothing back to
    // a measured twin.
    serve(p, pool, fastTwin, req({ nowMs: 2_000, promptTokens: 2000 }), 500)
    poll(3_000)
    poll(4_100)
    expect(p.model(fastTwin.node).rate(4_100)).toBeCloseTo(4_000, -2)
    expect(p.model(fast.node).rate(4_100)).toBeCloseTo(20_000, -2)
  })

  test('a twin measured before its cache size was known lends its rate at the next poll; a twin gone or a size changed gives the prior back', () => {
    const { pool, cands } = fleet(3, 1000)
    const p = new PredictedTtft({ rng: rng() })
    const [a, b, c] = cands as [Candidate, Candidate, Candidate]
    const prior = p.model(b.node).rate(0)
    // a is measured before any poll: no size known at its end, so nothing to lend yet.
    serve(p, pool, a, req({ nowMs: 0, promptTokens: 2000 }), 100)
    expect(p.model(b.node).rate(200)).toBe(prior)
    const poll = (nowMs: number, sizes: [Candidate, number | undefined][]) => {
      for (const [n, cacheBlocks] of sizes)
        p.nodeMetrics(
          n.node,
          { waiting: 0, running: 0, kvUsage: 0, ...(cacheBlocks && { cacheBlocks }) },
          nowMs,
        )
    }
    // b and c are polled before a's size is read: no twin for them in this round.
    poll(1_000, [
      [b, 500],
      [c, 500],
      [a, 500],
    ])
    expect(p.model(b.node).rate(1_000)).toBe(prior)
    expect(p.model(c.node).rate(1_000)).toBe(prior)
    poll(2_100, [
      [a, 500],
      [b, 500],
      [c, 500],
    ])
    expect(p.model(b.node).rate(2_100)).toBeCloseTo(20_000, -2)
    expect(p.model(c.node).rate(2_100)).toBeCloseTo(20_000, -2)
    // b's engine restarts with another cache size, c's page loses the figure: both are priced at
    // the prior again, not at a twin they no longer have.
    poll(3_200, [
      [a, 500],
      [b, 800],
      [c, undefined],
    ])
    expect(p.model(b.node).rate(3_200)).toBe(prior)
    expect(p.model(c.node).rate(3_200)).toBe(prior)
    // a forgotten (removed from the config): its old twins lose its rate.
    poll(4_300, [[c, 500]])
    expect(p.model(c.node).rate(4_300)).toBeCloseTo(20_000, -2)
    p.forget(a.node)
    poll(4_400, [[c, 500]])
    expect(p.model(c.node).rate(4_400)).toBe(prior)
  })

  test('without a reported cache size, an unmeasured node keeps the prior whatever the others measure', () => {
    const { pool, cands } = fleet(2, 1000)
    const p = new PredictedTtft({ rng: rng() })
    const [a, b] = cands as [Candidate, Candidate]
    for (const c of cands) p.nodeMetrics(c.node, { waiting: 0, running: 0, kvUsage: 0 }, 0)
    const prior = p.model(b.node).rate(0)
    serve(p, pool, a, req({ nowMs: 100, promptTokens: 2000 }), 100)
    expect(p.model(a.node).rate(300)).toBeCloseTo(20_000, -2)
    expect(p.model(b.node).rate(300)).toBe(prior)
  })

  test('a first token that waited mostly on decode steps teaches no prefill rate', () => {
    const { pool, cands } = fleet(2)
    const p = new PredictedTtft({ rng: rng() })
    const a = cands[0]!
    serve(p, pool, a, req({ nowMs: 0, promptTokens: 2000 }), 250) // 8k tok/s, idle
    const m = p.model(a.node)
    expect(m.rate(300)).toBeCloseTo(8_000, -2)
    // Under load: 30 streams decoding there, and an inter-token latency learned at 80 ms (it
    // counts prefill chunks): the prediction gives a first token 1.5 x 80 x (1 + 0.05 x 30) =
    // 300 ms of decode steps. One that came after 400 ms leaves 100 ms for 2000 tokens: no sample.
    m.itlMs = 80
    for (let i = 0; i < 30; i++) {
      const r = req({ nowMs: 1000, promptTokens: 100 })
      pool.begin(a.node, 1000)
      const d = new Attempt(a, r, 1000)
      p.started(d)
      p.firstChunk(d, 1010)
    }
    expect(m.decoding).toBe(30)
    serve(p, pool, a, req({ nowMs: 2000, promptTokens: 2000 }), 400, 2400)
    expect(m.rate(5000)).toBeCloseTo(8_000, -2)
    // One whose wait was mostly prefill still teaches it: 2000 tokens in 1000 - 300 ms.
    serve(p, pool, a, req({ nowMs: 6000, promptTokens: 2000 }), 1000, 1400)
    expect(m.rate(8000)).toBeLessThan(7_800)
  })

  test('a node slowed down under short uncached prompts is priced up at its next first token, and back when it answers on time', () => {
    // Prompts of 100 uncached tokens teach no rate (under minRateSampleTokens): the slowdown
    // shows only as first tokens later than predicted.
    const { pool, cands } = fleet(4)
    const p = new PredictedTtft({ rng: rng(2) })
    for (const c of cands) serve(p, pool, c, req({ nowMs: 0, promptTokens: 1000 }), 100) // 10k tok/s
    let now = 1000
    for (let i = 0; i < 24; i++, now += 50)
      serve(p, pool, cands[i % 4]!, req({ nowMs: now, promptTokens: 100 }), 10)
    const slow = cands[0]!
    const m = p.model(slow.node)
    expect(m.slowness(now)).toBe(1)
    expect(m.rate(now)).toBeCloseTo(10_000, -2)
    serve(p, pool, slow, req({ nowMs: now, promptTokens: 100 }), 80) // 8x its prediction
    now += 100
    expect(m.slowness(now)).toBeGreaterThan(6)
    expect(m.rate(now)).toBeCloseTo(10_000, -2) // no rate was learned from it
    for (let i = 0; i < 20; i++, now += 50) {
      const r = req({ nowMs: now, promptTokens: 100 })
      const c = p.choose(cands, r)!
      expect(c).not.toBe(slow)
      serve(p, pool, c, r, 10)
    }
    // Still slow: a first token as late again sets it afresh (its lateness is measured against
    // the node's speed, not the raised prediction).
    serve(p, pool, slow, req({ nowMs: now, promptTokens: 100 }), 80)
    expect(m.slowness(now + 80)).toBeGreaterThan(7.9)
    // It recovers with time, and at once when a first token comes on time.
    expect(m.slowness(now + 30_000)).toBeLessThan(1.5)
    now += 200
    serve(p, pool, slow, req({ nowMs: now, promptTokens: 100 }), 10)
    expect(m.slowness(now + 10)).toBeLessThan(1.3)
  })

  test('a short first token prices its node up by its lateness over its speed or an inter-token time, at most 8x; not when under one inter-token time late, nor with slowShare 0', () => {
    const run = (slowShare: number, lateMs: number) => {
      const { pool, cands } = fleet(2)
      const p = new PredictedTtft({ rng: rng(2), slowShare })
      for (const c of cands) serve(p, pool, c, req({ nowMs: 0, promptTokens: 1000 }), 100, 300) // itl ~22 ms
      // The fleet's short first tokens on time (10 ms for 100 tokens at 10k tokens/s).
      for (let i = 0; i < 10; i++)
        serve(p, pool, cands[i % 2]!, req({ nowMs: 500 + i * 10, promptTokens: 100 }), 10, 210)
      const m = p.model(cands[0]!.node)
      expect(m.itlMs).toBeGreaterThan(20)
      serve(p, pool, cands[0]!, req({ nowMs: 1000, promptTokens: 100 }), lateMs, lateMs + 200)
      return m.slowness(1000 + lateMs)
    }
    // 80 ms against 10 predicted: the factor is over the inter-token time (22 ms), not the 10 ms.
    expect(run(2, 80)).toBeGreaterThan(3)
    expect(run(2, 80)).toBeLessThan(4)
    expect(run(2, 2000)).toBeCloseTo(8, 1) // capped
    expect(run(2, 25)).toBe(1) // 15 ms late: under one inter-token time
    expect(run(0, 80)).toBe(1)
  })

  test('first tokens late on every node at once (a burst, a fleet slower than learned) price no node up', () => {
    const { pool, cands } = fleet(4)
    const p = new PredictedTtft({ rng: rng(2) })
    for (const c of cands) serve(p, pool, c, req({ nowMs: 0, promptTokens: 1000 }), 100) // 10k tok/s
    for (let i = 0; i < 40; i++)
      serve(p, pool, cands[i % 4]!, req({ nowMs: 1000 + i * 50, promptTokens: 100 }), 30)
    for (const c of cands) expect(p.model(c.node).slowness(3000)).toBe(1)
    // One node alone three times later than the rest is priced up.
    serve(p, pool, cands[0]!, req({ nowMs: 3000, promptTokens: 100 }), 90)
    expect(p.model(cands[0]!.node).slowness(3090)).toBeGreaterThan(7.9)
  })

  test('a rate dip drops the slowness, so a slowed node is not priced twice', () => {
    const { pool, cands } = fleet(2)
    const p = new PredictedTtft({ rng: rng(2) })
    for (const c of cands) serve(p, pool, c, req({ nowMs: 0, promptTokens: 1000 }), 100)
    for (let i = 0; i < 10; i++)
      serve(p, pool, cands[i % 2]!, req({ nowMs: 500 + i * 10, promptTokens: 100 }), 10, 210)
    const m = p.model(cands[0]!.node)
    serve(p, pool, cands[0]!, req({ nowMs: 1000, promptTokens: 100 }), 100)
    expect(m.slowness(1100)).toBeGreaterThan(3)
    // A long prompt's first token at a quarter of the rate: the rate dips, the slowness goes.
    serve(p, pool, cands[0]!, req({ nowMs: 1200, promptTokens: 1000 }), 400)
    expect(m.rate(1600)).toBeLessThan(3_000)
    expect(m.slowness(1600)).toBe(1)
  })

  test('a slow sample or a 429 prices a node down at once, and it recovers with time', () => {
    const { pool, cands } = fleet(2)
    const p = new PredictedTtft({ rng: rng(), recoveryMs: 10_000 })
    const a = cands[0]!
    serve(p, pool, a, req({ nowMs: 0, promptTokens: 1000 }), 100) // 10k tok/s
    const m = p.model(a.node)
    expect(m.rate(100)).toBeCloseTo(10_000, -2)
    const r = req({ nowMs: 200 })
    pool.begin(a.node, 200)
    const at = new Attempt(a, r, 200)
    p.started(at)
    pool.end(a.node, false, 210)
    p.ended(at, 210, 'overloaded', undefined)
    expect(m.rate(210)).toBeLessThan(10_000 / 7)
    expect(m.rate(210 + 10_000)).toBeGreaterThan(10_000 * 0.6)
    expect(m.rate(210 + 60_000)).toBeGreaterThan(m.baseRate * 0.99)
  })

  test('never picks an excluded, ejected or full node while another can take the request', () => {
    const { pool, cands } = fleet(3, 1)
    const p = new PredictedTtft({ rng: rng() })
    const [a, b, c] = cands as [Candidate, Candidate, Candidate]
    b.node.eject(0, 5_000)
    pool.begin(c.node, 0) // c is at its cap of 1
    for (let i = 0; i < 50; i++) expect(p.choose(cands, req({ nowMs: 10 + i }))).toBe(a)
    expect(p.choose(cands, req({ nowMs: 10, exclude: new Set([a]) }))).toBe(b) // soonest back
  })

  test('a session returns to its node on a near-tie', () => {
    const { pool, cands } = fleet(4)
    const p = new PredictedTtft({ rng: rng(3) })
    for (const c of cands) serve(p, pool, c, req({ nowMs: 0 }), 100)
    const first = req({ nowMs: 1000, session: 'user-7' })
    const home = p.choose(cands, first)!
    serve(p, pool, home, first, 100)
    for (let i = 0; i < 20; i++) {
      const r = req({ nowMs: 2000 + i * 500, session: 'user-7' })
      const c = p.choose(cands, r)!
      expect(c).toBe(home)
      serve(p, pool, c, r, 100)
    }
  })

  test('a new session stays with a long prefix it shares on a busier node, and spreads off a short one', () => {
    // A new session finding its prompt's prefix cached on a node decoding 4 more requests than
    // the others: spreading recomputes the prefix (its prefill, once) to put the session's
    // turns on a calmer node. Worth it for a 1k-token system prompt; not for a 2k-token one.
    // Without warm-ups the first turn itself goes to the calmer node and pays that prefill; with
    // them (the default) it is served where the prefix is cached, the calmer node is warmed with
    // its prompt, and the session's next turn goes there.
    const placeNew = (prefixTokens: number, warmSessions: boolean) => {
      const { pool, cands } = fleet(4)
      const p = new PredictedTtft({ rng: rng(5), warmSessions })
      for (const c of cands) serve(p, pool, c, req({ nowMs: 0 }), 100)
      const shared = 'tool prompt '.repeat(Math.ceil((prefixTokens * 4) / 12)).slice(0, prefixTokens * 4)
      const turn = (i: number, nowMs: number, more = '') =>
        req({
          nowMs,
          session: `agent-${i}`,
          prefix: prefixOf(`${shared}the first turn of agent ${i}${more}`),
          promptTokens: prefixTokens + 400 + more.length / 4,
        })
      const first = turn(0, 1000)
      const home = p.choose(cands, first)!
      const others = new Set(cands.filter((c) => c !== home))
      // Four sessions decoding on the prefix's node (sent, first chunk in, not ended).
      for (let i = 0; i < 4; i++) {
        const r = i === 0 ? first : { ...turn(i, 1000 + i * 10), exclude: others }
        pool.begin(home.node, r.nowMs)
        const a = new Attempt(home, r, r.nowMs)
        p.started(a)
        p.firstChunk(a, r.nowMs + 100)
      }
      // The new session's first turn, served (and its warm-up, if one is asked for).
      const r9 = turn(9, 2000)
      const next = p.choose(cands, r9)!
      pool.begin(next.node, r9.nowMs)
      const a9 = new Attempt(next, r9, r9.nowMs)
      p.started(a9)
      const warm = p.takeWarmup()?.candidate
      if (warm) {
        // Sent as the router sends it: streamed, one token.
        pool.begin(warm.node, r9.nowMs)
        const w = new Attempt(warm, { ...r9, session: undefined }, r9.nowMs)
        w.warmup = true
        p.started(w)
        p.firstChunk(w, r9.nowMs + 190)
        pool.end(warm.node, true, r9.nowMs + 200)
        p.ended(w, r9.nowMs + 200, 'ok', 0, 1)
      }
      p.firstChunk(a9, 2100)
      pool.end(next.node, true, 2400)
      p.ended(a9, 2400, 'ok', undefined, 10)
      const second = p.choose(cands, turn(9, 4000, ', answered, and the second turn'.repeat(8)))
      return { home, next, warm, second }
    }
    const long = placeNew(2000, false)
    expect(long.next).toBe(long.home)
    expect(long.warm).toBeUndefined()
    // With warm-ups a spread costs the turn nothing, and the long prefix spreads at 1.5 decoding
    // requests more per 1,000 tokens (3 here, under the holder's 4): served there, the other warmed.
    const longWarm = placeNew(2000, true)
    expect(longWarm.next).toBe(longWarm.home)
    expect(longWarm.warm).toBeDefined()
    expect(longWarm.second).toBe(longWarm.warm)
    const spread = placeNew(1000, false)
    expect(spread.next).not.toBe(spread.home)
    expect(spread.warm).toBeUndefined()
    expect(spread.second).toBe(spread.next)
    const warmed = placeNew(1000, true)
    expect(warmed.next).toBe(warmed.home)
    expect(warmed.warm).toBeDefined()
    expect(warmed.warm).not.toBe(warmed.home)
    // The session lives at the warmed node: its next turn goes there, not to the prefix's holder.
    expect(warmed.second).toBe(warmed.warm)
  })

  test('a warm-up is asked for only by the choice just made, and not on routes without warm_sessions', () => {
    const { pool, cands } = fleet(4)
    const p = new PredictedTtft({ rng: rng(5) })
    for (const c of cands) serve(p, pool, c, req({ nowMs: 0 }), 100)
    const shared = 'tool prompt '.repeat(334).slice(0, 4000)
    const turn = (i: number, nowMs: number) =>
      req({ nowMs, session: `s-${i}`, prefix: prefixOf(`${shared} turn of ${i}`), promptTokens: 1400 })
    const first = turn(0, 1000)
    const home = p.choose(cands, first)!
    for (let i = 0; i < 4; i++) {
      const r =
        i === 0 ? first : { ...turn(i, 1000 + i * 10), exclude: new Set(cands.filter((c) => c !== home)) }
      pool.begin(home.node, r.nowMs)
      const a = new Attempt(home, r, r.nowMs)
      p.started(a)
      p.firstChunk(a, r.nowMs + 100)
    }
    expect(p.choose(cands, turn(8, 2000))).toBe(home)
    // Not taken: the next choice (a request refused before it started, say) clears it.
    p.choose(cands, req({ nowMs: 2001 }))
    expect(p.takeWarmup()).toBeUndefined()
    // The calmer nodes' routes do not allow warm-ups: the session spreads as without them.
    const withWarm = (on: boolean | undefined) =>
      cands.map((c) => (c === home ? c : { ...c, route: { ...c.route, warmSessions: on } }))
    const placed = p.choose(withWarm(false), turn(9, 2002))!
    expect(placed.node).not.toBe(home.node)
    expect(p.takeWarmup()).toBeUndefined()
    // By default (undefined) only nodes that report Prometheus metrics, self-hosted engines, are warmed.
    const auto = withWarm(undefined)
    expect(p.choose(auto, turn(10, 2003))!.node).not.toBe(home.node)
    expect(p.takeWarmup()).toBeUndefined()
    for (const c of auto) p.nodeMetrics(c.node, { waiting: 0, running: 0, kvUsage: 0 }, 2004)
    const r11 = turn(11, 2005)
    const served = p.choose(auto, r11)!
    expect(served.node).toBe(home.node)
    pool.begin(served.node, r11.nowMs)
    const a11 = new Attempt(served, r11, r11.nowMs)
    p.started(a11)
    const taken = p.takeWarmup()
    expect(taken?.reason).toBe('session')
    const warm = taken?.candidate
    expect(warm).toBeDefined()
    expect(warm!.node).not.toBe(home.node)
    expect(p.sessionHome('s-11')).toBe(warm!.node)
    // A failed warm-up is undone only while the session is still bound for its node.
    p.declineWarmup(a11, home.node)
    expect(p.sessionHome('s-11')).toBe(warm!.node)
    // Declined (the router could not send it, or it failed): the session stays where its first
    // turn is served.
    p.declineWarmup(a11, warm!.node)
    expect(p.sessionHome('s-11')).toBe(home.node)
    expect(p.choose(auto, turn(11, 2006))!.node).toBe(home.node)
  })

  test('a node never measured is measured by a warm-up of a long prompt, the request served on a measured node', () => {
    const setup = (opts: { exploreSlack?: number; warmSessions?: boolean } = {}) => {
      const fleet3 = fleet(3)
      const { pool } = fleet3
      // Routes with `warm_sessions` (the helper's), or without.
      const cands = fleet3.cands.map((x) =>
        opts.warmSessions === false ? { ...x, route: { ...x.route, warmSessions: false } } : x,
      )
      const p = new PredictedTtft({ rng: rng(3), exploreSlack: opts.exploreSlack ?? 1.5 })
      const [a, b, c] = cands as [Candidate, Candidate, Candidate]
      // a and b measured a little slower than the prior (8k tokens/s); c never sent anything,
      // priced at the prior, wins.
      serve(p, pool, a, req({ nowMs: 100, promptTokens: 2000 }), 300)
      serve(p, pool, b, req({ nowMs: 100, promptTokens: 2000 }), 300)
      // Polled; no cache size reported, so no twins.
      for (const x of cands) p.nodeMetrics(x.node, { waiting: 0, running: 0, kvUsage: 0 }, 500)
      return { pool, p, cands, a, b, c }
    }
    // The router's first attempt at a chat request, under its cap of warm-ups in flight.
    const long = (nowMs: number, over: Partial<RouteRequest> = {}) =>
      req({ nowMs, promptTokens: 2000, canExplore: true, ...over })
    // Off, on routes without warm-ups, where the router could not send one (a failover, an
    // embedding, the cap reached), or where the measured node would miss the request's TTFT
    // budget (a and b predict 300 ms): the request itself explores c.
    for (const [opts, over] of [
      [{ exploreSlack: 0 }, {}],
      [{ warmSessions: false }, {}],
      [{}, { canExplore: false }],
      [{}, { ttftBudgetMs: 280 }],
    ] as const) {
      const { p, cands, c } = setup(opts)
      expect(p.choose(cands, long(1000, over))).toBe(c)
      expect(p.takeWarmup()).toBeUndefined()
    }
    const { pool, p, cands, c } = setup()
    // A prompt too short to teach a prefill rate explores c itself, with no warm-up.
    expect(p.choose(cands, long(1000, { promptTokens: 300 }))).toBe(c)
    expect(p.takeWarmup()).toBeUndefined()
    // A long one is served on a measured node, and c is warmed with it.
    const r = long(1000)
    const served = p.choose(cands, r)!
    expect(served).not.toBe(c)
    pool.begin(served.node, r.nowMs)
    const a1 = new Attempt(served, r, r.nowMs)
    p.started(a1)
    const warm = p.takeWarmup()
    expect(warm?.reason).toBe('explore')
    expect(warm?.candidate).toBe(c)
    pool.begin(c.node, r.nowMs)
    const w = new Attempt(c, r, r.nowMs)
    w.warmup = true
    p.started(w)
    // While it runs, c is still avoided, and not warmed twice.
    expect(p.choose(cands, long(1100))).not.toBe(c)
    expect(p.takeWarmup()).toBeUndefined()
    // Its first token says c is slow (2,000 tokens in 800 ms): measured, c is priced so from now.
    p.firstChunk(w, r.nowMs + 800)
    pool.end(c.node, true, r.nowMs + 810)
    p.ended(w, r.nowMs + 810, 'ok', 0, 1)
    expect(p.snapshot(2000).find((n) => n.node === c.node.name)!.tokensPerSec).toBeLessThan(4_000)
    expect(p.choose(cands, long(2000))).not.toBe(c)
    expect(p.takeWarmup()).toBeUndefined()
  })

  test('a node a warm-up did not measure is warmed again only after a while, and is explored by a request meanwhile', () => {
    const { pool, cands } = fleet(3)
    const p = new PredictedTtft({ rng: rng(3) })
    const [a, b, c] = cands as [Candidate, Candidate, Candidate]
    serve(p, pool, a, req({ nowMs: 100, promptTokens: 2000 }), 300)
    serve(p, pool, b, req({ nowMs: 100, promptTokens: 2000 }), 300)
    const long = (nowMs: number) => req({ nowMs, promptTokens: 2000, canExplore: true })
    const r = long(1000)
    expect(p.choose(cands, r)).not.toBe(c)
    expect(p.takeWarmup()?.candidate).toBe(c)
    // The warm-up is answered but teaches no rate (no first chunk seen): c is still not measured.
    pool.begin(c.node, r.nowMs)
    const w = new Attempt(c, r, r.nowMs)
    w.warmup = true
    p.started(w)
    pool.end(c.node, true, r.nowMs + 50)
    p.ended(w, r.nowMs + 50, 'ok', 0, 1)
    // Within 10 s the next long prompt that picks c is c's own exploration, with no warm-up.
    let sent: Candidate | undefined
    for (let t = 1100; t < 10_000 && sent !== c; t += 500) {
      sent = p.choose(cands, long(t))
      expect(p.takeWarmup()).toBeUndefined()
    }
    expect(sent).toBe(c)
  })

  test("a prefix's holder busy with an earlier prefill wins once that prefill is mostly done, unless it is the prefix's own", () => {
    const setup = () => {
      const { pool, cands } = fleet(2)
      const p = new PredictedTtft({ rng: rng(2) })
      // Both nodes measured at 8k tokens/s.
      for (const c of cands) serve(p, pool, c, req({ nowMs: 0, promptTokens: 1000 }), 125)
      return { pool, cands, p }
    }
    const shared = 'you are a helpful agent. '.repeat(320) // 8000 characters: 31 blocks
    const ask = (nowMs: number, q: string) =>
      req({ nowMs, prefix: prefixOf(`${shared}${q}`), promptTokens: 2200 })
    {
      // The holder answered the prefix before; since t=1000 it prefills 7000 tokens of another prompt.
      const { pool, cands, p } = setup()
      const first = ask(100, 'question one')
      const home = p.choose(cands, first)!
      serve(p, pool, home, first, 275)
      pool.begin(home.node, 1000)
      p.started(new Attempt(home, req({ nowMs: 1000, promptTokens: 7000 }), 1000))
      // 700 ms in, 1400 tokens of it are left (175 ms) and the request's own 216 (27 ms): 202 ms
      // against 275 ms for all 2200 on the idle node. Priced by its queued tokens, 902 ms.
      expect(p.choose(cands, ask(1700, 'question two'))).toBe(home)
      // Just after it started, the whole queue is ahead: the idle node.
      expect(p.choose(cands, ask(1010, 'question three'))).not.toBe(home)
    }
    {
      // The holder's only prefill is the prefix's first sighting, sent 700 ms ago without a first
      // token: its blocks are not cached yet, and sending now would compute them again.
      const { pool, cands, p } = setup()
      const first = ask(1000, 'question one')
      const home = p.choose(cands, first)!
      pool.begin(home.node, 1000)
      p.started(new Attempt(home, first, 1000))
      expect(p.choose(cands, ask(1700, 'question two'))).not.toBe(home)
    }
  })

  test('hedges only once it knows what late means, and later than the prediction', () => {
    const { pool, cands } = fleet(2)
    const p = new PredictedTtft({ rng: rng(), hedgeMinMs: 50 })
    const c = cands[0]!
    const early = new Attempt(c, req({ nowMs: 0 }), 0)
    p.started(early)
    expect(p.hedgeAtMs(early)).toBeUndefined()
    for (let i = 0; i < 40; i++) serve(p, pool, c, req({ nowMs: 1000 + i * 1000 }), 100)
    const r = req({ nowMs: 60_000 })
    const a = new Attempt(c, r, 60_000)
    p.started(a)
    const at = p.hedgeAtMs(a)!
    expect(at).toBeGreaterThanOrEqual(60_000 + Math.max(50, a.predictedTtftMs! * 1.5))
    expect(p.hedgeAtMs(new Attempt(c, req({ nowMs: 60_000, stream: false }), 60_000))).toBeUndefined()
  })

  test('a hedge of a request placed by its cached prefix waits past what a cold start elsewhere would take', () => {
    const { pool, cands } = fleet(2)
    const p = new PredictedTtft({ rng: rng(), hedgeMinMs: 50 })
    const prefix = prefixOf('h'.repeat(256 * 100))
    // both nodes learn their rates and what late means; the prefix lives on one of them
    for (let i = 0; i < 40; i++)
      serve(p, pool, cands[i % 2]!, req({ nowMs: i * 1000, promptTokens: 2000 }), 250)
    const home = p.choose(cands, req({ nowMs: 41_000, prefix, promptTokens: 7000 }))!
    serve(p, pool, home, req({ nowMs: 41_000, prefix, promptTokens: 7000 }), 900)
    const r = req({ nowMs: 60_000, prefix, promptTokens: 7000 })
    expect(p.choose(cands, r)).toBe(home)
    const a = new Attempt(home, r, 60_000)
    p.started(a)
    const other = cands.find((c) => c !== home)!
    const cold = p.estimateTtftMs(other, r)
    // the prefix makes home far quicker; the hedge comes no sooner than twice the cold start
    expect(a.predictedTtftMs! * 1.5).toBeLessThan(cold)
    expect(a.alternativeTtftMs).toBeCloseTo(cold, 0)
    expect(p.hedgeAtMs(a)!).toBeGreaterThanOrEqual(60_000 + 2 * cold)
  })

  test('a node /metrics showed full counts the requests of ours sent or ended there since', () => {
    const { pool, cands } = fleet(2)
    const p = new PredictedTtft({ rng: rng() })
    const c = cands[0]!
    // learn a service time (dispatch to end): 4 s
    for (let i = 0; i < 10; i++) serve(p, pool, c, req({ nowMs: i * 100 }), 100, 4000)
    // two streams of ours decode there; /metrics says 1 request waits for one of 2 slots
    const streams = [0, 1].map((k) => {
      const a = new Attempt(c, req({ nowMs: 10_000 + k }), 10_000 + k)
      pool.begin(c.node, a.startedAtMs)
      p.started(a)
      p.firstChunk(a, 10_100 + k)
      return a
    })
    // (two polls in a row: one alone is no backlog, see below)
    p.nodeMetrics(c.node, { waiting: 1, running: 2, kvUsage: 0.5 }, 9_500)
    p.nodeMetrics(c.node, { waiting: 1, running: 2, kvUsage: 0.5 }, 10_500)
    const full = p.estimateTtftMs(c, req({ nowMs: 10_600 }))
    // (1 waiting + this one) x 4 s / 2 slots on top of the prefill
    expect(full).toBeGreaterThan(4000)
    // both streams end before the next poll: their slots took the waiting request and this one
    for (const a of streams) {
      pool.end(c.node, true, 10_700)
      p.ended(a, 10_700, 'ok', undefined, 10)
    }
    expect(p.estimateTtftMs(c, req({ nowMs: 10_800 }))).toBeLessThan(1000)
  })

  test('one poll showing a request waiting is a step boundary, not a queue for slots', () => {
    const { pool, cands } = fleet(2)
    const p = new PredictedTtft({ rng: rng() })
    const c = cands[0]!
    for (let i = 0; i < 10; i++) serve(p, pool, c, req({ nowMs: i * 100 }), 100, 4000)
    const a = new Attempt(c, req({ nowMs: 10_000 }), 10_000)
    pool.begin(c.node, a.startedAtMs)
    p.started(a)
    p.firstChunk(a, 10_100)
    const idle = p.estimateTtftMs(c, req({ nowMs: 10_150 }))
    // an engine lists a request that arrived during a step as waiting until the step ends
    p.nodeMetrics(c.node, { waiting: 1, running: 1, kvUsage: 0.1 }, 10_200)
    expect(p.estimateTtftMs(c, req({ nowMs: 10_250 }))).toBeLessThan(idle + 100)
    p.nodeMetrics(c.node, { waiting: 0, running: 2, kvUsage: 0.1 }, 11_200)
    p.nodeMetrics(c.node, { waiting: 1, running: 2, kvUsage: 0.1 }, 12_200)
    expect(p.estimateTtftMs(c, req({ nowMs: 12_250 }))).toBeLessThan(idle + 100)
    // still waiting at the next poll: the slots are full, the wait counts
    p.nodeMetrics(c.node, { waiting: 1, running: 2, kvUsage: 0.1 }, 13_200)
    expect(p.estimateTtftMs(c, req({ nowMs: 13_250 }))).toBeGreaterThan(idle + 2000)
  })

  test('learns how often predicted prefix hits are real', () => {
    const { pool, cands } = fleet(1)
    const p = new PredictedTtft({ rng: rng() })
    const c = cands[0]!
    const prefix = prefixOf('y'.repeat(256 * 10))
    serve(p, pool, c, req({ nowMs: 0, prefix, promptTokens: 700 }), 100)
    for (let i = 0; i < 30; i++) {
      const r = req({ nowMs: 1000 + i, prefix, promptTokens: 700 })
      pool.begin(c.node, r.nowMs)
      const a = new Attempt(c, r, r.nowMs)
      p.started(a)
      expect(a.predictedCachedTokens).toBe(640)
      pool.end(c.node, true, r.nowMs + 1)
      p.ended(a, r.nowMs + 1, 'ok', 0) // the node had evicted it: nothing was cached
    }
    expect(p.model(c.node).hitRatio).toBeLessThan(0.1)
  })
})

describe('ShareBudget', () => {
  test('allows the burst, then about `share` of requests', () => {
    const b = new ShareBudget(0.05, 10)
    let used = 0
    for (let i = 0; i < 1000; i++) {
      b.earn()
      if (b.take()) used++
    }
    expect(used).toBeGreaterThanOrEqual(58)
    expect(used).toBeLessThanOrEqual(61)
    expect(b.used).toBe(used)
  })
})

test("an attempt shed after its first chunk (a stream's, kept for its life) ends as one not shed: the policy reads neither its prefix blocks nor the nodes tried then", () => {
  const run = (shed: boolean) => {
    const { pool, cands } = fleet(4)
    const p = new PredictedTtft({ rng: rng(3) })
    const shared = 'tool prompt '.repeat(300)
    const attempts: Attempt[] = []
    for (let i = 0; i < 30; i++) {
      const r = req({
        nowMs: i * 150,
        prefix: prefixOf(`${shared}turn ${i}`),
        promptTokens: 1200,
        session: `s${i % 5}`,
      })
      const c = p.choose(cands, r)!
      pool.begin(c.node, r.nowMs)
      const a = new Attempt(c, r, r.nowMs)
      p.started(a)
      attempts.push(a)
      p.firstChunk(a, r.nowMs + 120)
      if (shed) {
        a.shed()
        expect(a.req.prefix).toEqual([])
        expect(a.req.exclude.size).toBe(0)
        expect([a.req.promptTokens, a.req.session, a.req.modelId]).toEqual([1200, `s${i % 5}`, 'm/x'])
      }
    }
    // They end after all were sent: some still stream while later ones are chosen.
    attempts.forEach((a, i) => {
      pool.end(a.candidate.node, true, 5000 + i)
      p.ended(a, 5000 + i, 'ok', 900, 40)
    })
    return { nodes: attempts.map((a) => a.candidate.node.name), snapshot: p.snapshot(6000) }
  }
  const kept = run(false)
  const shed = run(true)
  expect(shed.nodes).toEqual(kept.nodes)
  expect(shed.snapshot).toEqual(kept.snapshot)
})
