import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { costNano, formatRub, parseRub } from '../../src/billing/money.ts'
import type { Quote } from '../../src/pipeline/quote.ts'
import { reservedPromptTokens } from '../../src/pipeline/tokens.ts'
import { usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// `x-tropa-dry-run: 1` answers what a request would do without doing it: the reservation, whether
// the key's limit and the balance would admit it, the node and its predicted time to first
// token. Nothing is reserved, charged, rate-limited or sent upstream.
let t: Tropa
beforeAll(async () => {
  t = await startTropa()
})
afterAll(() => t.stop())

const PRICE = { promptNano: parseRub(CHAT_PRICE.prompt)!, completionNano: parseRub(CHAT_PRICE.completion)! }
const chat = {
  model: 'test/chat',
  messages: [{ role: 'user', content: 'how much would this cost?' }],
  max_tokens: 50,
}

async function key(body: Record<string, unknown>) {
  const res = await fetch(`${t.url}/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${t.masterKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'k', ...body }),
  })
  return ((await res.json()) as { key: string }).key
}

const dry = (path: string, body: unknown, apiKey = t.apiKey, extra: Record<string, string> = {}) =>
  fetch(`${t.url}${path}`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${apiKey}`,
      'content-type': 'application/json',
      'x-tropa-dry-run': '1',
      ...extra,
    },
    body: JSON.stringify(body),
  })

const upstreamCalls = () => t.nodes.reduce((s, n) => s + n.stats().requests, 0)

describe('x-tropa-dry-run: 1', () => {
  test('a chat request is quoted: the reservation at the model price, admitted, the node and its predicted TTFT; nothing reaches an upstream or the ledger', async () => {
    const rowsBefore = (await usageRows(t)).length
    const callsBefore = upstreamCalls()
    for (const stream of [false, true]) {
      const res = await dry('/v1/chat/completions', { ...chat, stream })
      expect(res.status).toBe(200)
      expect(res.headers.get('x-tropa-dry-run')).toBe('1')
      const q = (await res.json()) as Quote
      expect(q).toMatchObject({
        object: 'quote',
        model: 'test/chat',
        max_output_tokens: 50,
        admitted: true,
        refusal: null,
      })
      expect(q.reserve_rub).toBe(
        Number(formatRub(costNano(reservedPromptTokens(q.prompt_tokens), 50, PRICE))),
      )
      expect(t.nodes.map((n) => n.name)).toContain(q.node!)
      expect(q.predicted_ttft_ms).toBeGreaterThan(0)
    }
    // The same prompt, really sent, is counted as the quote counted it.
    const real = await t
      .client()
      .chat.completions.create(chat as OpenAI.ChatCompletionCreateParamsNonStreaming)
    expect(upstreamCalls()).toBe(callsBefore + 1)
    expect((await usageRows(t)).length).toBe(rowsBefore + 1)
    expect(real.usage?.prompt_tokens).toBeGreaterThan(0)
  })

  test('a request the key cannot afford is quoted as refused, with the code the real request gets', async () => {
    const poor = await key({ limit_rub: 0.000001 })
    const q = (await (await dry('/v1/chat/completions', chat, poor)).json()) as Quote
    expect(q.admitted).toBe(false)
    expect(q.refusal?.code).toBe('key_limit_reached')
    const err = await new OpenAI({ baseURL: t.baseURL, apiKey: poor, maxRetries: 0 }).chat.completions
      .create(chat as OpenAI.ChatCompletionCreateParamsNonStreaming)
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.APIError)
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(402)
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('key_limit_reached')
  })

  test('quotes do not use up a rate limit', async () => {
    const limited = await key({ rpm_limit: 1 })
    for (let i = 0; i < 3; i++) expect((await dry('/v1/chat/completions', chat, limited)).status).toBe(200)
    const ok = await new OpenAI({
      baseURL: t.baseURL,
      apiKey: limited,
      maxRetries: 0,
    }).chat.completions.create(chat as OpenAI.ChatCompletionCreateParamsNonStreaming)
    expect(ok.choices[0]?.message.content).toBeTruthy()
  })

  test('the Messages, Responses and legacy Completions APIs answer the same quote', async () => {
    const callsBefore = upstreamCalls()
    const rowsBefore = (await usageRows(t)).length
    const m = (await (
      await dry('/v1/messages', {
        model: 'test/chat',
        max_tokens: 50,
        messages: [{ role: 'user', content: 'hi' }],
      })
    ).json()) as Quote
    const r = (await (
      await dry('/v1/responses', { model: 'test/chat', input: 'hi', max_output_tokens: 50 })
    ).json()) as Quote
    const c = (await (
      await dry('/v1/completions', { model: 'test/chat', prompt: 'hi', max_tokens: 50 })
    ).json()) as Quote
    for (const q of [m, r, c])
      expect(q).toMatchObject({ object: 'quote', model: 'test/chat', admitted: true })
    expect(upstreamCalls()).toBe(callsBefore)
    expect((await usageRows(t)).length).toBe(rowsBefore)
  })
})
