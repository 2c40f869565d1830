import { afterAll, beforeAll, beforeEach, expect, test } from 'bun:test'
import type OpenAI from 'openai'
import { startTropa, type Tropa } from '../helpers/start.ts'

// Fallbacks across models: the next model is tried only when every node of the one before failed
// (never on the client's error), at its own price, reserved again within the key's limit.
let t: Tropa
const PRIMARY = { prompt: '0.000010', completion: '0.000020' }
const BACKUP = { prompt: '0.000100', completion: '0.000200' }
const route = (n: { name: string; url: string }) => ({
  name: n.name,
  base_url: n.url,
  upstream_model: 'chat-up',
})

beforeAll(async () => {
  t = await startTropa({
    nodes: ['p-1', 'p-2', 'b-1', 'o-1'].map((name, i) => ({ name, timeScale: 0, seed: i })),
    upstream: { max_attempts: 2 },
    models: (nodes) => [
      {
        id: 'test/primary',
        kind: 'chat',
        context_length: 4096,
        pricing: PRIMARY,
        routes: [route(nodes[0]!), route(nodes[1]!)],
        fallbacks: ['test/backup'],
      },
      { id: 'test/backup', kind: 'chat', context_length: 4096, pricing: BACKUP, routes: [route(nodes[2]!)] },
      { id: 'test/other', kind: 'chat', context_length: 4096, pricing: PRIMARY, routes: [route(nodes[3]!)] },
    ],
  })
})
afterAll(() => t.stop())

const [p1, p2, b1, o1] = [0, 1, 2, 3]
const failPrimary = (fail: boolean) => {
  for (const i of [p1, p2]) t.nodes[i]!.setFaults({ errorRate: fail ? 1 : 0 })
}
beforeEach(() => {
  failPrimary(false)
  for (const n of t.nodes) n.resetStats()
})

const messages = [{ role: 'user' as const, content: 'hello there' }]
const rub = (p: string) => Number(p)
const costOf = (u: { prompt_tokens: number; completion_tokens: number }, price: typeof PRIMARY) =>
  u.prompt_tokens * rub(price.prompt) + u.completion_tokens * rub(price.completion)

test('every node of the model fails: the configured fallback answers, billed at its own price', async () => {
  failPrimary(true)
  const { data, response } = await t
    .client()
    .chat.completions.create({ model: 'test/primary', messages, max_tokens: 5 })
    .withResponse()
  expect(data.model).toBe('test/backup')
  expect(response.headers.get('x-tropa-fallback-from')).toBe('test/primary')
  const usage = data.usage as OpenAI.CompletionUsage & { cost_rub: number }
  expect(usage.cost_rub).toBeCloseTo(costOf(usage, BACKUP), 9)
  expect(t.nodes[p1]!.stats().requests + t.nodes[p2]!.stats().requests).toBeGreaterThan(0)
  expect(t.nodes[b1]!.stats().requests).toBe(1)
})

test('streamed: the fallback is chosen before the first byte, and its stream is the answer', async () => {
  failPrimary(true)
  const stream = await t.client().chat.completions.create({
    model: 'test/primary',
    messages,
    max_tokens: 5,
    stream: true,
    stream_options: { include_usage: true },
  })
  let model = ''
  let cost = 0
  for await (const chunk of stream) {
    model = chunk.model
    if (chunk.usage) cost = (chunk.usage as unknown as { cost_rub: number }).cost_rub
  }
  expect(model).toBe('test/backup')
  expect(cost).toBeGreaterThan(0)
})

test("the request's models list replaces the configured fallbacks", async () => {
  failPrimary(true)
  const res = await t.fetch('/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify({ model: 'test/primary', models: ['test/other'], messages, max_tokens: 3 }),
  })
  expect(res.status).toBe(200)
  expect(((await res.json()) as { model: string }).model).toBe('test/other')
  expect(t.nodes[o1]!.stats().requests).toBe(1)
  expect(t.nodes[b1]!.stats().requests).toBe(0)
  // `models` is Tropa's: it never reaches an upstream (the simulator would answer it as unknown).
})

test('no fallback on the client error: the 400 comes back and the fallback model is never called', async () => {
  const res = await t.fetch('/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify({ model: 'test/primary', messages, max_tokens: 10_000 }),
  })
  expect(res.status).toBe(400)
  expect(t.nodes[b1]!.stats().requests).toBe(0)
})

test('a healthy model answers itself', async () => {
  const data = await t.client().chat.completions.create({ model: 'test/primary', messages, max_tokens: 3 })
  expect(data.model).toBe('test/primary')
  expect(t.nodes[b1]!.stats().requests).toBe(0)
})

test("the chain stops at the key's limit: the dearer fallback is refused with 402, nothing billed", async () => {
  failPrimary(true)
  // The primary's worst case fits in this limit, the backup's (ten times the price) does not.
  const key = (await (
    await t.fetch('/v1/keys', {
      method: 'POST',
      key: t.masterKey,
      body: JSON.stringify({ name: 'tight', limit_rub: 0.02 }),
    })
  ).json()) as { key: string; key_id: string }
  const res = await t.fetch('/v1/chat/completions', {
    method: 'POST',
    key: key.key,
    body: JSON.stringify({ model: 'test/primary', messages, max_tokens: 200 }),
  })
  expect(res.status).toBe(402)
  expect(t.nodes[b1]!.stats().requests).toBe(0)
  const view = (await (await t.fetch(`/v1/keys/${key.key_id}`, { key: t.masterKey })).json()) as {
    spent_rub: number
  }
  expect(view.spent_rub).toBe(0)
})

test('an unknown model in models is a 404 before anything runs', async () => {
  const res = await t.fetch('/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify({ model: 'test/primary', models: ['nope/model'], messages }),
  })
  expect(res.status).toBe(404)
  expect(t.nodes[p1]!.stats().requests + t.nodes[p2]!.stats().requests).toBe(0)
})
