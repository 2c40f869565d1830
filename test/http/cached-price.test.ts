import { afterAll, beforeAll, expect, test } from 'bun:test'
import { toFile } from 'openai'
import { batchCostNano, costNano, formatRub } from '../../src/billing/money.ts'
import { usageRows } from '../helpers/ledger.ts'
import { startTropa, type Tropa } from '../helpers/start.ts'

// pricing.cached_prompt: prompt tokens the upstream reports as cached
// (usage.prompt_tokens_details.cached_tokens) bill at the cached price, live and in batches (at
// half); the catalogue shows the price, the ledger the cached tokens.
const PRICE = { promptNano: 30_000n, completionNano: 60_000n, cachedPromptNano: 3_000n }
let t: Tropa
beforeAll(async () => {
  t = await startTropa({
    nodes: [{ name: 'sim-1', timeScale: 0, seed: 1 }], // one node: its prefix cache sees every request
    models: (nodes) => [
      {
        id: 'test/cached',
        context_length: 8192,
        pricing: { prompt: '0.000030', completion: '0.000060', cached_prompt: '0.000003' },
        routes: nodes.map((n) => ({ name: n.name, base_url: n.url, upstream_model: 'm' })),
      },
    ],
  })
})
afterAll(() => t.stop())

const system = 'You are a careful assistant. '.repeat(60) // a long shared prefix
const ask = (q: string) =>
  t.client().chat.completions.create({
    model: 'test/cached',
    messages: [
      { role: 'system', content: system },
      { role: 'user', content: q },
    ],
    max_tokens: 8,
  })

test('the catalogue shows the cached prompt price', async () => {
  const m = (await t.client().models.retrieve('test/cached')) as unknown as {
    pricing: Record<string, string>
  }
  expect(m.pricing).toEqual({ prompt: '0.000030', completion: '0.000060', cached_prompt: '0.000003' })
})

test('a repeated prefix is billed at the cached price for the tokens the upstream reports cached', async () => {
  const first = await ask('first question')
  const second = await ask('second question')
  const cachedOf = (u: typeof first.usage) => u?.prompt_tokens_details?.cached_tokens ?? 0
  expect(cachedOf(first.usage)).toBe(0)
  const cached = cachedOf(second.usage)
  expect(cached).toBeGreaterThan(100)
  for (const r of [first, second]) {
    const u = r.usage!
    const expected = costNano(u.prompt_tokens, u.completion_tokens, PRICE, cachedOf(u))
    expect((u as unknown as { cost_rub: number }).cost_rub).toBe(Number(formatRub(expected)))
  }
  // Cheaper than the same tokens at the full prompt price, by exactly the difference.
  const u = second.usage!
  expect(
    costNano(u.prompt_tokens, u.completion_tokens, PRICE) -
      costNano(u.prompt_tokens, u.completion_tokens, PRICE, cached),
  ).toBe(BigInt(cached) * (PRICE.promptNano - PRICE.cachedPromptNano))
  const rows = await usageRows(t)
  const row = rows.find((r) => r.requestId === second.id.replace('chatcmpl-', ''))!
  expect(row.cachedTokens).toBe(cached)
  expect(row.costNano).toBe(costNano(u.prompt_tokens, u.completion_tokens, PRICE, cached))
})

test('a batch line with a cached prefix bills half of its cost at the cached price', async () => {
  const client = t.client()
  const line = JSON.stringify({
    custom_id: 'c1',
    method: 'POST',
    url: '/v1/chat/completions',
    body: {
      model: 'test/cached',
      messages: [
        { role: 'system', content: system },
        { role: 'user', content: 'a batch question' },
      ],
      max_tokens: 8,
    },
  })
  const file = await client.files.create({
    file: await toFile(Buffer.from(`${line}\n`), 'c.jsonl'),
    purpose: 'batch',
  })
  let b = await client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
  })
  for (let i = 0; i < 500 && !['completed', 'failed'].includes(b.status); i++) {
    await Bun.sleep(20)
    b = await client.batches.retrieve(b.id)
  }
  expect(b.status).toBe('completed')
  const out = JSON.parse((await (await client.files.content(b.output_file_id!)).text()).trim()) as {
    response: {
      body: {
        usage: {
          prompt_tokens: number
          completion_tokens: number
          prompt_tokens_details: { cached_tokens: number }
        }
      }
    }
  }
  const u = out.response.body.usage
  expect(u.prompt_tokens_details.cached_tokens).toBeGreaterThan(100)
  const row = (await usageRows(t)).find((r) => r.batchId === b.id)!
  expect(row.costNano).toBe(
    batchCostNano(
      costNano(u.prompt_tokens, u.completion_tokens, PRICE, u.prompt_tokens_details.cached_tokens),
    ),
  )
})
