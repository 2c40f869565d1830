import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { loopStalledSince, watchLoop } from '../../src/pipeline/loop-watch.ts'
import { startTropa, type Tropa } from '../helpers/start.ts'

/** Holds the event loop (and everything on it: the router, the in-process node) for `ms`. */
function block(ms: number): void {
  const end = performance.now() + ms
  while (performance.now() < end) {}
}

const WORDS = 'the of and to in is was for on that with as by at from his her are this be which or had'.split(
  ' ',
)

/** A prompt of about `n` tokens (common words, one token each) that no earlier request shared. */
function prompt(tag: string, n: number): string {
  const out = [`Case ${tag}:`]
  for (let i = 0; i < n; i++) out.push(WORDS[(i * 7 + tag.length * 3 + (i >> 3)) % WORDS.length]!)
  return out.join(' ')
}

describe('the loop watch', () => {
  test('a stall is seen while the loop comes out of it and after, and not before it began', async () => {
    watchLoop()
    await Bun.sleep(120)
    const before = Date.now()
    await Bun.sleep(120)
    expect(loopStalledSince(before, Date.now())).toBe(false)
    const start = Date.now()
    block(300)
    // The late tick has not run yet: the stall is read from the tick's lateness.
    expect(loopStalledSince(start, Date.now())).toBe(true)
    await Bun.sleep(120)
    // The late tick ran: the stall's end is kept.
    expect(loopStalledSince(start, Date.now())).toBe(true)
    const after = Date.now()
    await Bun.sleep(120)
    expect(loopStalledSince(after, Date.now())).toBe(false)
  })
})

describe('a first token seen late because the router stood still', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({ nodes: [{ name: 'sim-1', prefillTokensPerSec: 4000, itlMs: 5, seed: 1 }] })
  })
  afterAll(() => t.stop())

  const view = async () => {
    const fleet = (await (await t.admin('/v1/admin/fleet')).json()) as {
      data: { node: string; prefill_tokens_per_sec: number | null; itl_ms: number | null }[]
    }
    return fleet.data.find((n) => n.node === 'sim-1')!
  }
  const rate = async () => (await view()).prefill_tokens_per_sec

  const stream = async (content: string, stallMs: number) => {
    // Not awaited: the router answers with headers only once the first token is in.
    const pending = t.client().chat.completions.create({
      model: 'test/chat',
      stream: true,
      max_tokens: 4,
      messages: [{ role: 'user', content }],
    })
    if (stallMs > 0) {
      // The request is at the node (its prefill of ~2,000 tokens at 4,000/s takes ~500 ms).
      const deadline = Date.now() + 2000
      while (t.nodes[0]!.stats().chatRequests < 2 && Date.now() < deadline) await Bun.sleep(5)
      block(stallMs)
    }
    for await (const _ of await pending);
  }

  test('teaches the node no prefill rate; the next one, timed cleanly, does', async () => {
    // Warm: the tokenizer's tables load at the first request that counts tokens (itself a stall).
    await stream('Hello there.', 0)
    const prior = await rate()
    expect(prior).toBe(8000)
    await stream(prompt('stalled', 2000), 900)
    // Without the watch the sample read about 2,000 tokens / 1.2 s and the node fell to ~1,700/s.
    expect(await rate()).toBe(prior)
    await stream(prompt('clean', 2000), 0)
    const learned = (await rate())!
    expect(learned).toBeGreaterThan(3000)
    expect(learned).toBeLessThan(4600)
  })

  test('a stall while a stream decodes teaches no inter-token latency', async () => {
    const itl = (await view()).itl_ms!
    const s = await t.client().chat.completions.create({
      model: 'test/chat',
      stream: true,
      max_tokens: 40,
      messages: [{ role: 'user', content: 'Tell me a long story.' }],
    })
    let chunks = 0
    for await (const _ of s) if (++chunks === 2) block(600)
    // Without the watch the 600 ms, spread over 39 gaps, moved the average.
    expect((await view()).itl_ms).toBe(itl)
  })
})
