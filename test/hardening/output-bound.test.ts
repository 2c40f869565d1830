import { afterAll, beforeAll, expect, test } from 'bun:test'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// Hardening, defect 3: the output bound reserved for is the one the upstream is sent, whichever
// of max_tokens and max_completion_tokens the client set; an upstream that reads only one of
// them cannot be made to generate tokens nobody pays for.
const seen: Record<string, unknown>[] = []
const upstream = Bun.serve({
  port: 0,
  hostname: '127.0.0.1',
  async fetch(req) {
    const body = (await req.json()) as Record<string, unknown>
    seen.push(body)
    // An upstream that honours only max_tokens, as the issue describes.
    const n = Number(body.max_tokens ?? 2000)
    return Response.json({
      id: 'up',
      object: 'chat.completion',
      created: 1,
      model: 'm',
      choices: [
        { index: 0, message: { role: 'assistant', content: 'w '.repeat(n) }, finish_reason: 'length' },
      ],
      usage: { prompt_tokens: 10, completion_tokens: n, total_tokens: 10 + n },
    })
  },
})

let t: Tropa
beforeAll(async () => {
  t = await startTropa({
    models: () => [
      {
        id: 'test/chat',
        context_length: 8192,
        pricing: CHAT_PRICE,
        routes: [{ name: 'one', base_url: `http://127.0.0.1:${upstream.port}/v1` }],
      },
    ],
  })
})
afterAll(async () => {
  await t.stop()
  upstream.stop(true)
})

const messages = [{ role: 'user' as const, content: 'hi' }]

test.each([
  [{ max_completion_tokens: 1, max_tokens: 2000 }, 1],
  [{ max_tokens: 1, max_completion_tokens: 2000 }, 1],
  [{ max_completion_tokens: 7 }, 7],
  [{ max_tokens: 9 }, 9],
])('%j: the upstream is sent %d and the client is billed for exactly that', async (bounds, expected) => {
  seen.length = 0
  const res = await t.fetch('/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify({ model: 'test/chat', messages, ...bounds }),
  })
  expect(res.status).toBe(200)
  const done = (await res.json()) as { usage: { completion_tokens: number; cost_rub: number } }
  expect(seen).toHaveLength(1)
  expect(seen[0]!.max_tokens).toBe(expected)
  if ('max_completion_tokens' in bounds) expect(seen[0]!.max_completion_tokens).toBe(expected)
  expect(done.usage.completion_tokens).toBe(expected)
  // 10 prompt tokens at 0.00003 plus the completion at 0.00006 per token.
  expect(done.usage.cost_rub).toBeCloseTo(10 * 0.00003 + expected * 0.00006, 9)
})
