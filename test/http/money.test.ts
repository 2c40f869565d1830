import { afterEach, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { costNano, nanoToRubNumber, parseRub, rubNumberToNano } from '../../src/billing/money.ts'
import { countChatPrompt, loadTokenizer, reservedPromptTokens } from '../../src/pipeline/tokens.ts'
import { CHAT_PRICE, newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const PRICE = {
  promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
  completionNano: parseRub(CHAT_PRICE.completion, 6)!,
}
const MAX_TOKENS = 20
const messages = [{ role: 'user' as const, content: 'Count to twenty, please.' }]
async function worstCaseNano() {
  await loadTokenizer()
  return costNano(reservedPromptTokens(countChatPrompt(messages, undefined)), MAX_TOKENS, PRICE)
}

/** Fleet with small real delays so that hundreds of requests overlap. */
const overlapping = () => ({
  nodes: [1, 2, 3].map((i) => ({ name: `sim-${i}`, itlMs: 2, iterationOverheadMs: 1, seed: i })),
})

interface Outcome {
  status: number
  code?: string
}

/** One request as a client would make it: streaming or not, some streams abandoned after the first chunk. */
async function oneRequest(tropa: Tropa, key: string, i: number): Promise<Outcome> {
  const stream = i % 2 === 1
  const abandon = stream && i % 10 === 1
  const controller = new AbortController()
  try {
    const res = await tropa.fetch('/v1/chat/completions', {
      method: 'POST',
      key,
      signal: controller.signal,
      body: JSON.stringify({ model: 'test/chat', messages, max_tokens: MAX_TOKENS, stream, seed: i }),
    })
    if (res.status !== 200) {
      const body = (await res.json()) as { error: { code: string } }
      return { status: res.status, code: body.error.code }
    }
    if (abandon) {
      const reader = res.body!.getReader()
      await reader.read()
      controller.abort()
      return { status: 200, code: 'abandoned' }
    }
    await res.text()
    return { status: 200 }
  } catch (err) {
    if (abandon) return { status: 200, code: 'abandoned' }
    throw err
  }
}

async function keyRecord(tropa: Tropa, keyId: string) {
  await tropa.svc.ledger.flush()
  const r = await tropa.fetch(`/v1/keys/${keyId}`, { key: tropa.masterKey })
  return (await r.json()) as { spent_rub: number; limit_rub: number | null }
}

async function orgBalance(tropa: Tropa) {
  await tropa.svc.ledger.flush()
  const r = await tropa.fetch('/v1/organization', { key: tropa.masterKey })
  return rubNumberToNano(((await r.json()) as { balance_rub: number }).balance_rub)!
}

/** Chat requests the simulators saw, less hedged copies (a second node asked for a late first token). */
const chatRequestsAtSimulators = (tropa: Tropa) =>
  tropa.nodes.reduce((s, n) => s + n.stats().chatRequests, 0) - (tropa.svc.deps.hedges?.used ?? 0)

describe('hard limits under concurrency', () => {
  test('300 concurrent requests on a key that fits about 30: never over the limit, ledger = spent = balance drop', async () => {
    t = await startTropa(overlapping())
    const worst = await worstCaseNano()
    const limitNano = worst * 30n
    const key = await newApiKey(t, { name: 'tight', limit_rub: nanoToRubNumber(limitNano) })
    const balanceBefore = await orgBalance(t)

    const outcomes = await Promise.all(Array.from({ length: 300 }, (_, i) => oneRequest(t!, key.key, i)))
    await Bun.sleep(100) // abandoned streams settle when their cancel lands
    const ok = outcomes.filter((o) => o.status === 200).length
    const refused = outcomes.filter((o) => o.status === 402)
    expect(ok + refused.length).toBe(300)
    expect(refused.every((o) => o.code === 'key_limit_reached')).toBe(true)
    expect(ok).toBeGreaterThanOrEqual(30)
    // every refused request was refused before reaching any upstream
    expect(chatRequestsAtSimulators(t)).toBe(ok)

    const rec = await keyRecord(t, key.key_id)
    const spentNano = rubNumberToNano(rec.spent_rub)!
    expect(spentNano).toBeLessThanOrEqual(limitNano)
    const ledger = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter(
      (r) => r.keyId === key.key_id,
    )
    expect(ledger).toHaveLength(ok)
    const ledgerSum = ledger.reduce((s, r) => s + r.costNano, 0n)
    expect(nanoToRubNumber(ledgerSum)).toBe(rec.spent_rub)
    expect(balanceBefore - (await orgBalance(t))).toBe(ledgerSum)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)

    // Now sequentially: the key is refused only once less than one worst case of room is left.
    for (;;) {
      const before = rubNumberToNano((await keyRecord(t, key.key_id)).spent_rub)!
      const o = await oneRequest(t, key.key, 0)
      if (o.status === 402) {
        expect(limitNano - before).toBeLessThan(worst)
        break
      }
      expect(o.status).toBe(200)
    }
  })

  test("an organization's balance running out under several keys: never negative, refused ones never reach upstream", async () => {
    const worst = await worstCaseNano()
    t = await startTropa({ ...overlapping(), balanceRub: nanoToRubNumber(worst * 40n) })
    const keys = await Promise.all([1, 2, 3, 4].map((i) => newApiKey(t!, { name: `k${i}` })))
    const before = await orgBalance(t)
    const outcomes = await Promise.all(
      Array.from({ length: 240 }, (_, i) => oneRequest(t!, keys[i % 4]!.key, i)),
    )
    await Bun.sleep(100)
    const ok = outcomes.filter((o) => o.status === 200).length
    const refused = outcomes.filter((o) => o.status === 402)
    expect(ok + refused.length).toBe(240)
    expect(refused.length).toBeGreaterThan(0)
    expect(refused.every((o) => o.code === 'insufficient_balance')).toBe(true)
    expect(chatRequestsAtSimulators(t)).toBe(ok)
    const after = await orgBalance(t)
    expect(after).toBeGreaterThanOrEqual(0n)
    const usage = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).filter(
      (r) => r.kind === 'usage',
    )
    expect(usage).toHaveLength(ok)
    expect(before - after).toBe(usage.reduce((s, r) => s + r.costNano, 0n))
    let spentSum = 0n
    for (const k of keys) spentSum += rubNumberToNano((await keyRecord(t, k.key_id)).spent_rub)!
    expect(spentSum).toBe(before - after)
  })
})

describe('402 and the SDK', () => {
  test('the SDK raises an APIError with status 402 and the code', async () => {
    t = await startTropa()
    const key = await newApiKey(t, { name: 'zero', limit_rub: 0 })
    const err = await t
      .client(key.key)
      .chat.completions.create({ model: 'test/chat', messages })
      .catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.APIError)
    expect(err.status).toBe(402)
    expect(err.code).toBe('key_limit_reached')
    expect(err.error).toMatchObject({ type: 'insufficient_quota', code: 'key_limit_reached' })
    expect(chatRequestsAtSimulators(t)).toBe(0)
  })

  test('lowering a limit below what was spent makes the next request 402; raising it lets it through', async () => {
    t = await startTropa()
    const key = await newApiKey(t, { name: 'adjustable', limit_rub: 1 })
    await t.client(key.key).chat.completions.create({ model: 'test/chat', messages, max_tokens: 5 })
    const patch = (limit: number) =>
      t!.fetch(`/v1/keys/${key.key_id}`, {
        method: 'PATCH',
        key: t!.masterKey,
        body: JSON.stringify({ limit_rub: limit }),
      })
    await patch(0.000001)
    const err = await t
      .client(key.key)
      .chat.completions.create({ model: 'test/chat', messages, max_tokens: 5 })
      .catch((e) => e)
    expect(err.status).toBe(402)
    await patch(1)
    expect(
      (await t.client(key.key).chat.completions.create({ model: 'test/chat', messages, max_tokens: 5 }))
        .choices,
    ).toHaveLength(1)
  })
})

describe('the cost of a request', () => {
  test('non-streaming: x-tropa-cost-rub and usage.cost_rub equal the catalogue price times usage, and the ledger row', async () => {
    t = await startTropa()
    const { data, response } = await t
      .client()
      .chat.completions.create({ model: 'test/chat', messages, max_tokens: 7 })
      .withResponse()
    const expected = costNano(data.usage!.prompt_tokens, data.usage!.completion_tokens, PRICE)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(nanoToRubNumber(expected).toFixed(6))
    expect((data.usage as unknown as { cost_rub: number }).cost_rub).toBe(nanoToRubNumber(expected))
    await t.svc.ledger.flush()
    const row = (await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)).find(
      (r) => r.kind === 'usage',
    )!
    expect(row.costNano).toBe(expected)
    expect(row).toMatchObject({ model: 'test/chat', estimated: false, outcome: 'ok', batchId: null })
    expect(row.requestId).toBe(response.headers.get('x-request-id')!)
  })

  test('streaming with include_usage: the usage chunk carries cost_rub', async () => {
    t = await startTropa()
    const stream = await t.client().chat.completions.create({
      model: 'test/chat',
      messages,
      stream: true,
      stream_options: { include_usage: true },
    })
    let usage: (OpenAI.CompletionUsage & { cost_rub?: number }) | null | undefined
    for await (const c of stream) usage = c.usage ?? usage
    expect(usage!.cost_rub).toBe(
      nanoToRubNumber(costNano(usage!.prompt_tokens, usage!.completion_tokens, PRICE)),
    )
  })

  test('usage by key, model and day for the master key', async () => {
    t = await startTropa()
    for (let i = 0; i < 3; i++)
      await t.client().chat.completions.create({ model: 'test/chat', messages, max_tokens: 3 })
    await t.client().embeddings.create({ model: 'test/embed', input: 'abc' })
    const r = await t.fetch('/v1/usage', { key: t.masterKey })
    expect(r.status).toBe(200)
    const u = (await r.json()) as {
      data: { key_id: string; model: string; day: string; requests: number; cost_rub: number }[]
    }
    const chat = u.data.find((d) => d.model === 'test/chat')!
    expect(chat.requests).toBe(3)
    expect(chat.day).toBe(new Date().toISOString().slice(0, 10))
    expect(u.data.find((d) => d.model === 'test/embed')!.requests).toBe(1)
    expect((await t.fetch('/v1/usage', { key: t.apiKey })).status).toBe(403)
  })
})

describe('rate limits', () => {
  test('rpm_limit: past it 429 with Retry-After; other keys unaffected', async () => {
    t = await startTropa()
    const limited = await newApiKey(t, { name: 'rpm', rpm_limit: 3 })
    const c = t.client(limited.key)
    for (let i = 0; i < 3; i++)
      await c.chat.completions.create({ model: 'test/chat', messages, max_tokens: 2 })
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      key: limited.key,
      body: JSON.stringify({ model: 'test/chat', messages }),
    })
    expect(res.status).toBe(429)
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('rate_limit_exceeded')
    const err = await c.chat.completions.create({ model: 'test/chat', messages }).catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.RateLimitError)
    expect(
      (await t.client().chat.completions.create({ model: 'test/chat', messages, max_tokens: 2 })).choices,
    ).toHaveLength(1)
    const rec = (await (await t.fetch(`/v1/keys/${limited.key_id}`, { key: t.masterKey })).json()) as {
      rpm_limit: number
    }
    expect(rec.rpm_limit).toBe(3)
  })

  test('tpm_limit counts prompt and completion tokens', async () => {
    t = await startTropa()
    // The prompt (about 15 tokens) fits under 20; with the answer's tokens the minute is over it.
    const limited = await newApiKey(t, { name: 'tpm', tpm_limit: 20 })
    const c = t.client(limited.key)
    const r = await c.chat.completions.create({ model: 'test/chat', messages, max_tokens: 30 })
    expect(r.usage!.prompt_tokens).toBeLessThanOrEqual(20)
    const err = await c.chat.completions
      .create({ model: 'test/chat', messages, max_tokens: 30 })
      .catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.RateLimitError)
  })
})
