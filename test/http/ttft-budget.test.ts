import { afterEach, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const BUDGET = 'x-tropa-ttft-budget-ms'
// About 1,500 prompt tokens: a node never observed is predicted at 8,000 tokens/s, near 190 ms.
const LONG = 'the quarterly report covers revenue, costs and the outlook. '.repeat(150)
async function balance(tropa: Tropa): Promise<number> {
  await tropa.svc.ledger.flush()
  const r = await tropa.fetch('/v1/organization', { key: tropa.masterKey })
  return ((await r.json()) as { balance_rub: number }).balance_rub
}
const start = () => startTropa({ nodes: [1, 2].map((i) => ({ name: `sim-${i}`, timeScale: 0, seed: i })) })

describe('deadline-aware admission (x-tropa-ttft-budget-ms)', () => {
  test('a budget no node is predicted to meet is a 429 with retry-after, and no node sees the request', async () => {
    t = await start()
    const client = t.client()
    const before = await balance(t)
    for (const stream of [false, true]) {
      const err = await client.chat.completions
        .create(
          { model: 'test/chat', messages: [{ role: 'user', content: LONG }], max_tokens: 4, stream },
          { headers: { [BUDGET]: '5' } },
        )
        .then(
          () => undefined,
          (e: unknown) => e,
        )
      expect(err).toBeInstanceOf(OpenAI.RateLimitError)
      const e = err as InstanceType<typeof OpenAI.RateLimitError>
      expect(e.status).toBe(429)
      expect(e.code).toBe('ttft_budget_unmet')
      expect(Number(e.headers?.get('retry-after'))).toBeGreaterThanOrEqual(1)
      expect(e.message).toContain('TTFT budget of 5 ms')
    }
    expect(t.nodes.map((n) => n.stats().requests)).toEqual([0, 0])
    // Nothing charged: the reservation taken before routing was given back.
    expect(await balance(t)).toBe(before)
  })

  test('a budget the fleet can meet is served as usual, streamed or not', async () => {
    t = await start()
    const client = t.client()
    const opts = { headers: { [BUDGET]: '60000' } }
    const json = await client.chat.completions.create(
      { model: 'test/chat', messages: [{ role: 'user', content: LONG }], max_tokens: 4 },
      opts,
    )
    expect(json.choices[0]?.message.content?.length).toBeGreaterThan(0)
    const stream = await client.chat.completions.create(
      { model: 'test/chat', messages: [{ role: 'user', content: LONG }], max_tokens: 4, stream: true },
      opts,
    )
    let text = ''
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? ''
    expect(text.length).toBeGreaterThan(0)
    expect(t.nodes.reduce((s, n) => s + n.stats().chatRequests, 0)).toBe(2)
  })

  test('a budget that is not a whole number of ms from 1 to an hour is a 400', async () => {
    t = await start()
    const client = t.client()
    for (const v of ['0', '-5', '1.5', 'soon', '3600001']) {
      const err = await client.chat.completions
        .create(
          { model: 'test/chat', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 },
          { headers: { [BUDGET]: v } },
        )
        .then(
          () => undefined,
          (e: unknown) => e,
        )
      expect(err).toBeInstanceOf(OpenAI.BadRequestError)
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe(BUDGET)
    }
  })
})
