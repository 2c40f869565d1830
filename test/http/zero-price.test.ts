import { afterAll, beforeAll, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// A model priced at zero passes when a key's limit or the organization's balance is spent (its
// worst case is nothing to reserve), as LiteLLM's users asked; a priced model is refused.
let t: Tropa
beforeAll(async () => {
  t = await startTropa({
    balanceRub: 0,
    models: (nodes) => [
      {
        id: 'test/chat',
        context_length: 4096,
        pricing: CHAT_PRICE,
        routes: nodes.map((n) => ({ name: n.name, base_url: n.url, upstream_model: 'm' })),
      },
      {
        id: 'test/free',
        context_length: 4096,
        pricing: { prompt: '0.000000', completion: '0.000000' },
        routes: nodes.map((n) => ({ name: n.name, base_url: n.url, upstream_model: 'm' })),
      },
    ],
  })
})
afterAll(() => t.stop())

const ask = (c: OpenAI, model: string) =>
  c.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 })

test('with no balance and a key limit of 0, the free model answers and is billed 0; a priced one gets 402', async () => {
  const res = await fetch(`${t.url}/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${t.masterKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'spent', limit_rub: 0 }),
  })
  const key = ((await res.json()) as { key: string }).key
  for (const k of [key, t.apiKey]) {
    const c = new OpenAI({ baseURL: t.baseURL, apiKey: k, maxRetries: 0 })
    const free = await ask(c, 'test/free')
    expect((free.usage as unknown as { cost_rub: number }).cost_rub).toBe(0)
    const err = await ask(c, 'test/chat').catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.APIError)
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(402)
  }
  const rows = (await usageRows(t)).filter((r) => r.model === 'test/free')
  expect(rows).toHaveLength(2)
  for (const r of rows) expect(r.costNano).toBe(0n)
})
