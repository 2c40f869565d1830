import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// Text with no spaces used to cost the tokenizer time quadratic in its length (40,000 repeated
// letters: seconds of the event loop, every tenant frozen). Counting is now linear and sliced:
// a 100 KB run is answered or refused while /health keeps answering within 100 ms.
let t: Tropa
beforeAll(async () => {
  t = await startTropa({
    models: (nodes) => [
      {
        id: 'test/chat',
        context_length: 1_000_000,
        pricing: CHAT_PRICE,
        routes: nodes.map((n) => ({ name: n.name, base_url: n.url, upstream_model: 'chat-up' })),
      },
      {
        id: 'test/embed',
        kind: 'embedding',
        context_length: 1_000_000,
        dimensions: 16,
        pricing: { prompt: '0.000002', completion: '0.000000' },
        routes: nodes.map((n) => ({ name: n.name, base_url: n.url, upstream_model: 'embed-up' })),
      },
      {
        id: 'test/small',
        context_length: 4096,
        pricing: CHAT_PRICE,
        routes: nodes.map((n) => ({ name: n.name, base_url: n.url, upstream_model: 'chat-up' })),
      },
    ],
  })
  // the tokenizer is loaded by the first request; load it before timing anything
  await t
    .client()
    .chat.completions.create({ model: 'test/chat', messages: [{ role: 'user', content: 'hi' }] })
})
afterAll(() => t.stop())

/** Runs `work` while polling /health; returns its result and the slowest /health seen. */
async function withHealthPolling<T>(work: () => Promise<T>): Promise<{ result: T; worstMs: number }> {
  let done = false
  let worstMs = 0
  let polls = 0
  const poller = (async () => {
    while (!done) {
      const started = performance.now()
      const res = await fetch(`${t.url}/health`)
      await res.arrayBuffer()
      worstMs = Math.max(worstMs, performance.now() - started)
      polls++
      await Bun.sleep(5)
    }
  })()
  await Bun.sleep(20)
  try {
    const result = await work()
    return { result, worstMs }
  } finally {
    done = true
    await poller
    expect(polls).toBeGreaterThan(0)
  }
}

const runs = {
  latin: 'a'.repeat(100_000),
  cyrillic: 'ж'.repeat(100_000),
}

describe('a long run of one character', () => {
  for (const [name, text] of Object.entries(runs)) {
    test(`${name}, 100k characters, as a chat message: answered, /health stays fast`, async () => {
      const { result, worstMs } = await withHealthPolling(() =>
        t.client().chat.completions.create({
          model: 'test/chat',
          messages: [{ role: 'user', content: text }],
          max_tokens: 5,
        }),
      )
      expect(result.choices[0]!.message.content).toBeTruthy()
      expect(result.usage!.prompt_tokens).toBeGreaterThan(text.length / 10)
      expect(worstMs).toBeLessThan(100)
    }, 20_000)

    test(`${name}, 100k characters, as an embeddings input: answered, /health stays fast`, async () => {
      const { result, worstMs } = await withHealthPolling(() =>
        t.client().embeddings.create({ model: 'test/embed', input: [text, 'short'] }),
      )
      expect(result.data).toHaveLength(2)
      expect(worstMs).toBeLessThan(100)
    }, 20_000)
  }

  test('1 MB of random letters past the context: refused with 400, /health stays fast', async () => {
    let random = ''
    for (let i = 0; i < 1_000_000; i++) random += String.fromCharCode(97 + Math.floor(Math.random() * 26))
    const { result, worstMs } = await withHealthPolling(() =>
      t.fetch('/v1/chat/completions', {
        method: 'POST',
        body: JSON.stringify({ model: 'test/small', messages: [{ role: 'user', content: random }] }),
      }),
    )
    expect(result.status).toBe(400)
    expect(((await result.json()) as { error: { code: string } }).error.code).toBe('context_length_exceeded')
    expect(worstMs).toBeLessThan(100)
  }, 20_000)

  test("a special token's text in a message is counted as text, not a 500", async () => {
    const r = await t.client().chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: 'say <|endoftext|> and <|im_start|>' }],
      max_tokens: 5,
    })
    expect(r.usage!.prompt_tokens).toBeGreaterThan(5)
  })
})
