import { describe, expect, test } from 'bun:test'
import { Engine, type EngineEvent, type EngineParams, promptBlockHashes } from '../../src/simulator/engine.ts'

const params: EngineParams = {
  prefillTokensPerSec: 1000, // 1 ms per prefill token keeps the arithmetic readable
  itlMs: 10,
  iterationOverheadMs: 0,
  maxSeqs: 2,
  prefillBudgetTokens: 10_000,
  cacheBlocks: 100,
  decodeMsPerSeq: 0, // exact arithmetic below; the batch-size term has its own test
}

/** Runs the engine to idle in virtual time, returning every event. */
function drain(e: Engine): EngineEvent[] {
  const out: EngineEvent[] = []
  for (let t = e.nextEventAt(); t !== undefined; t = e.nextEventAt()) out.push(...e.advance(t))
  return out
}
const blocks = (tag: string, n: number) => Array.from({ length: n }, (_, i) => `${tag}${i}`)
const at = (events: EngineEvent[], kind: EngineEvent['kind'], id: string) =>
  events.find((e) => e.kind === kind && e.id === id)

describe('engine timing model', () => {
  test('prefill then one token per iteration', () => {
    const e = new Engine(params)
    e.submit({ id: 'a', promptBlocks: blocks('a', 6), promptTokens: 100, outputTokens: 3 }, 0)
    const ev = drain(e)
    expect(at(ev, 'first_token', 'a')?.at).toBe(100)
    expect(ev.filter((x) => x.kind === 'token').map((x) => x.at)).toEqual([110, 120])
    expect(at(ev, 'done', 'a')?.at).toBe(120)
  })

  test('a cached prefix is not prefilled again', () => {
    const e = new Engine(params)
    e.submit({ id: 'a', promptBlocks: blocks('p', 6), promptTokens: 100, outputTokens: 1 }, 0)
    drain(e)
    e.submit({ id: 'b', promptBlocks: blocks('p', 6), promptTokens: 100, outputTokens: 1 }, 1000)
    const first = at(drain(e), 'first_token', 'b') as { at: number; cachedTokens: number }
    expect(first.cachedTokens).toBe(96)
    expect(first.at).toBe(1004) // only 4 uncached tokens
  })

  test('FCFS queueing once maxSeqs are running', () => {
    const e = new Engine(params)
    for (const id of ['a', 'b', 'c']) e.submit({ id, promptBlocks: [], promptTokens: 10, outputTokens: 5 }, 0)
    // continuous batching: arrivals join at the next iteration boundary
    expect([e.running(), e.waiting()]).toEqual([1, 2])
    e.advance(e.nextEventAt()!)
    expect([e.running(), e.waiting()]).toEqual([2, 1])
    const ev = drain(e)
    expect(at(ev, 'first_token', 'c')!.at).toBeGreaterThan(at(ev, 'done', 'a')!.at)
  })

  test('chunked prefill spreads a long prompt over iterations, interleaved with decoding', () => {
    const e = new Engine({ ...params, prefillBudgetTokens: 50, maxSeqs: 4 })
    e.submit({ id: 'short', promptBlocks: [], promptTokens: 10, outputTokens: 20 }, 0)
    e.advance(e.nextEventAt()!) // short has its first token
    e.submit({ id: 'long', promptBlocks: [], promptTokens: 200, outputTokens: 1 }, 10)
    const ev = drain(e)
    // joins at the next boundary (20 ms), then 4 chunks of 50 tokens, each iteration also
    // decoding `short`: 4 x (50 + 10) ms
    expect(at(ev, 'first_token', 'long')!.at).toBe(20 + 4 * 60)
    expect(
      ev.filter((x) => x.kind === 'token' && x.id === 'short' && x.at <= 250).length,
    ).toBeGreaterThanOrEqual(4)
  })

  test('the LRU evicts the oldest blocks beyond capacity', () => {
    const e = new Engine({ ...params, cacheBlocks: 4 })
    e.submit({ id: 'a', promptBlocks: blocks('a', 4), promptTokens: 64, outputTokens: 1 }, 0)
    drain(e)
    e.submit({ id: 'b', promptBlocks: blocks('b', 4), promptTokens: 64, outputTokens: 1 }, 100)
    drain(e)
    expect(e.cacheUsage()).toBe(1)
    e.submit({ id: 'a2', promptBlocks: blocks('a', 4), promptTokens: 64, outputTokens: 1 }, 200)
    expect((at(drain(e), 'first_token', 'a2') as { cachedTokens: number }).cachedTokens).toBe(0)
  })

  test('KV use counts what running sequences hold (shared prompt blocks once), not cached prefixes', () => {
    const e = new Engine({ ...params, blockSize: 16 })
    // two 64-token prompts sharing their first 3 blocks, 5 tokens out each
    e.submit({ id: 'a', promptBlocks: ['s0', 's1', 's2', 'a3'], promptTokens: 64, outputTokens: 5 }, 0)
    e.submit({ id: 'b', promptBlocks: ['s0', 's1', 's2', 'b3'], promptTokens: 64, outputTokens: 5 }, 0)
    expect(e.kvUsage()).toBeCloseTo(4 / 100) // a runs; b waits for the next iteration
    e.advance(e.nextEventAt()!) // a has its first token; b joins, its shared prefix cached
    // 5 distinct prompt blocks + a block for a's generated token
    expect(e.kvUsage()).toBeCloseTo(6 / 100)
    drain(e)
    expect(e.kvUsage()).toBe(0)
    expect(e.cacheUsage()).toBeCloseTo(5 / 100) // the prefixes stay cached, but nothing holds them
    e.submit({ id: 'c', promptBlocks: ['s0', 's1', 's2', 'c3'], promptTokens: 64, outputTokens: 50 }, 1000)
    e.advance(e.nextEventAt()!)
    e.cancel('c', e.nextEventAt()!)
    expect(e.kvUsage()).toBe(0)
  })

  test('slowdown multiplies iteration time; cancel frees the slot', () => {
    const e = new Engine({ ...params, maxSeqs: 1 })
    e.setSlowdown(5)
    e.submit({ id: 'a', promptBlocks: [], promptTokens: 10, outputTokens: 100 }, 0)
    e.submit({ id: 'b', promptBlocks: [], promptTokens: 10, outputTokens: 1 }, 0)
    expect(e.nextEventAt()).toBe(50)
    e.advance(50)
    e.cancel('a', 50)
    const ev = drain(e)
    expect(ev.some((x) => x.id === 'a')).toBe(false)
    // the iteration under way when `a` is cancelled still runs (50..100); then b's prefill, slowed
    expect(at(ev, 'first_token', 'b')!.at).toBe(150)
  })

  test('a decode step grows slowly with the number of sequences decoding', () => {
    const e = new Engine({ ...params, maxSeqs: 8, decodeMsPerSeq: 1 })
    for (const id of ['a', 'b', 'c', 'd'])
      e.submit({ id, promptBlocks: [], promptTokens: 10, outputTokens: 3 }, 0)
    const ev = drain(e)
    // a: alone 10 ms prefill; then b, c, d join and prefill (30 ms) while a decodes (10 + 1x1)
    const tokens = ev.filter((x) => x.kind === 'token' && x.id === 'b').map((x) => x.at)
    expect(tokens[1]! - tokens[0]!).toBe(10 + 3) // three sequences decoding: itl + 3 x 1 ms
  })

  test('block hashes chain: a shared prefix gives shared hashes, seeded by model', () => {
    const x = promptBlockHashes(
      'm',
      Array.from({ length: 40 }, (_, i) => i),
    )
    const y = promptBlockHashes('m', [
      ...Array.from({ length: 32 }, (_, i) => i),
      99,
      98,
      97,
      96,
      95,
      94,
      93,
      92,
    ])
    expect(x.length).toBe(2)
    expect(y.slice(0, 2)).toEqual(x)
    expect(
      promptBlockHashes(
        'other',
        Array.from({ length: 40 }, (_, i) => i),
      )[0],
    ).not.toBe(x[0])
    const z = promptBlockHashes('m', [7, ...Array.from({ length: 39 }, (_, i) => i)])
    expect(z[1]).not.toBe(x[1]) // a different first block changes every later hash
  })
})

describe('priority scheduling (vLLM --scheduling-policy priority)', () => {
  const full = (priorityScheduling: boolean) => {
    const e = new Engine({ ...params, maxSeqs: 1, priorityScheduling })
    // One running, then a low-priority request, then a high-priority (0) one waiting behind it.
    e.submit({ id: 'run', promptBlocks: blocks('r', 1), promptTokens: 10, outputTokens: 2 }, 0)
    e.submit({ id: 'low', promptBlocks: blocks('l', 1), promptTokens: 10, outputTokens: 2, priority: 100 }, 1)
    e.submit({ id: 'high', promptBlocks: blocks('h', 1), promptTokens: 10, outputTokens: 2 }, 2)
    return drain(e)
  }
  test('with it, a waiting request of a lower priority value is admitted first', () => {
    const ev = full(true)
    expect(at(ev, 'first_token', 'high')!.at).toBeLessThan(at(ev, 'first_token', 'low')!.at)
  })
  test('without it, first come first served', () => {
    const ev = full(false)
    expect(at(ev, 'first_token', 'low')!.at).toBeLessThan(at(ev, 'first_token', 'high')!.at)
  })
})
