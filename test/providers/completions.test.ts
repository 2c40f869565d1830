import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import net from 'node:net'
import OpenAI, { toFile } from 'openai'
import { costNano, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import type { SimNode } from '../../src/simulator/index.ts'
import { ANTHROPIC_SIM_KEY } from '../../src/simulator/protocols/anthropic.ts'
import { loadTokenizer } from '../../src/tokenizer.ts'
import { leaveMidStream, usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, newApiKey, startTropa, type Tropa } from '../helpers/start.ts'

// POST /v1/completions (legacy), through the official openai SDK's client.completions. A model
// whose routes are all OpenAI-compatible gets the request passed through to the nodes'
// /v1/completions (the simulator serves it as vLLM does); any other is served by translation to
// chat. Either way billed exactly what the node counted.

const PRICE = {
  promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
  completionNano: parseRub(CHAT_PRICE.completion, 6)!,
}
const prompt = 'Write a line about rivers'

let t: Tropa
let eos: Tropa
/** One OpenAI-compatible node and one Anthropic one: test/ant, and test/mixed on both. */
let tr: Tropa
beforeAll(async () => {
  // Loaded before the first test's clock starts (it takes seconds on a busy machine).
  await loadTokenizer()
  t = await startTropa()
  // Every answer runs to its max_tokens: shows the bound Tropa sent.
  eos = await startTropa({ nodes: [{ name: 'eos', timeScale: 0, ignoreEos: true }] })
  tr = await startTropa({
    nodes: [
      { name: 'oa', timeScale: 0, seed: 1 },
      { name: 'ant', timeScale: 0, seed: 1, protocol: 'anthropic' },
    ],
    models: translatedModels,
  })
}, 60_000)
afterAll(async () => {
  await t.stop()
  await eos.stop()
  await tr.stop()
})

function translatedModels(nodes: SimNode[]): ModelFile[] {
  const [oa, ant] = nodes as [SimNode, SimNode]
  const antRoute = {
    name: ant.name,
    provider: 'anthropic' as const,
    base_url: ant.url.replace(/\/v1$/, ''),
    upstream_model: 'claude-sim-up',
    headers: { 'x-api-key': ANTHROPIC_SIM_KEY },
  }
  return [
    { id: 'test/ant', kind: 'chat', context_length: 4096, pricing: CHAT_PRICE, routes: [antRoute] },
    {
      id: 'test/mixed',
      kind: 'chat',
      context_length: 4096,
      pricing: CHAT_PRICE,
      routes: [{ name: oa.name, base_url: oa.url, upstream_model: 'chat-up' }, antRoute],
    },
  ]
}

const costOf = (u: unknown) => (u as { cost_rub: number }).cost_rub

/** What the simulated nodes have served, summed. */
const served = (x: Tropa) =>
  x.nodes.reduce(
    (a, n) => {
      const s = n.stats()
      return {
        requests: a.requests + s.requests,
        completions: a.completions + s.completionRequests,
        chats: a.chats + s.chatRequests,
        prompt: a.prompt + s.promptTokens,
        completion: a.completion + s.completionTokens,
      }
    },
    { requests: 0, completions: 0, chats: 0, prompt: 0, completion: 0 },
  )
const delta = (x: Tropa, before: ReturnType<typeof served>) => {
  const now = served(x)
  return {
    requests: now.requests - before.requests,
    completions: now.completions - before.completions,
    chats: now.chats - before.chats,
    prompt: now.prompt - before.prompt,
    completion: now.completion - before.completion,
  }
}

/** The request's one ledger row, checked against the usage the client was shown. */
async function billedExactly(x: Tropa, requestId: string | null, usage: OpenAI.CompletionUsage) {
  const expected = costNano(usage.prompt_tokens, usage.completion_tokens, PRICE)
  expect(costOf(usage)).toBe(nanoToRubNumber(expected))
  const mine = (await usageRows(x)).filter((r) => r.requestId === requestId)
  expect(mine).toHaveLength(1)
  expect(mine[0]!.promptTokens).toBe(usage.prompt_tokens)
  expect(mine[0]!.completionTokens).toBe(usage.completion_tokens)
  expect(mine[0]!.costNano).toBe(expected)
  return mine[0]!
}

/** A stream's chunks, and its usage chunk. */
async function drain(stream: AsyncIterable<OpenAI.Completion>) {
  const chunks: OpenAI.Completion[] = []
  for await (const c of stream) chunks.push(c)
  return { chunks, usage: chunks.at(-1)?.usage ?? undefined }
}

describe('POST /v1/completions passed through (every route OpenAI-compatible)', () => {
  test('plain: the node’s /v1/completions answers, billed exactly its counts', async () => {
    const before = served(t)
    const { data, response } = await t
      .client()
      .completions.create({ model: 'test/chat', prompt, max_tokens: 12, seed: 4 })
      .withResponse()
    expect(data.object).toBe('text_completion')
    expect(data.id).toBe(`cmpl-${response.headers.get('x-request-id')}`)
    expect(data.model).toBe('test/chat')
    expect(data.choices).toHaveLength(1)
    expect(data.choices[0]!.index).toBe(0)
    expect(data.choices[0]!.logprobs).toBeNull()
    expect(data.choices[0]!.text.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(data.choices[0]!.finish_reason)
    const d = delta(t, before)
    expect(d).toEqual({
      requests: 1,
      completions: 1,
      chats: 0,
      prompt: data.usage!.prompt_tokens,
      completion: data.usage!.completion_tokens,
    })
    // The raw prompt, no chat template: its own tokens.
    expect(data.usage!.prompt_tokens).toBe(5)
    const expected = costNano(data.usage!.prompt_tokens, data.usage!.completion_tokens, PRICE)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(nanoToRubNumber(expected).toFixed(6))
    await billedExactly(t, response.headers.get('x-request-id'), data.usage!)
  })

  test('max_tokens absent: the legacy default of 16 is sent', async () => {
    const c = await eos.client().completions.create({ model: 'test/chat', prompt })
    expect(c.usage!.completion_tokens).toBe(16)
    expect(c.choices[0]!.finish_reason).toBe('length')
  })

  test('streamed with include_usage: the node’s chunks with Tropa’s id and model, the usage chunk with its cost', async () => {
    const before = served(t)
    const { data: stream, response } = await t
      .client()
      .completions.create({
        model: 'test/chat',
        prompt,
        max_tokens: 20,
        seed: 9,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    const { chunks, usage } = await drain(stream)
    const id = `cmpl-${response.headers.get('x-request-id')}`
    for (const c of chunks) {
      expect(c.id).toBe(id)
      expect(c.object).toBe('text_completion')
      expect(c.model).toBe('test/chat')
    }
    const text = chunks.map((c) => c.choices[0]?.text ?? '').join('')
    expect(text.length).toBeGreaterThan(0)
    expect(chunks.some((c) => c.choices[0]?.finish_reason != null)).toBe(true)
    expect(chunks.at(-1)!.choices).toEqual([])
    const d = delta(t, before)
    expect(d.completions).toBe(1)
    expect([d.prompt, d.completion]).toEqual([usage!.prompt_tokens, usage!.completion_tokens])
    await billedExactly(t, response.headers.get('x-request-id'), usage!)
    // The same request plain: the same text.
    const plain = await t.client().completions.create({ model: 'test/chat', prompt, max_tokens: 20, seed: 9 })
    expect(plain.choices[0]!.text).toBe(text)
  })

  test('streamed without include_usage: no usage chunk, billed the node’s counts', async () => {
    const before = served(t)
    const res = await t.fetch('/v1/completions', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', prompt, max_tokens: 6, stream: true }),
    })
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toStartWith('text/event-stream')
    const events = (await res.text()).split('\n\n').filter(Boolean)
    expect(events.at(-1)).toBe('data: [DONE]')
    for (const e of events.slice(0, -1)) {
      const c = JSON.parse(e.slice(6)) as { object: string; usage?: unknown; choices: unknown[] }
      expect(c.object).toBe('text_completion')
      expect(c.usage ?? null).toBeNull()
      expect(c.choices).toHaveLength(1)
    }
    const d = delta(t, before)
    const row = (await usageRows(t)).find((r) => r.requestId === res.headers.get('x-request-id'))!
    expect(row.outcome).toBe('ok')
    expect([row.promptTokens, row.completionTokens]).toEqual([d.prompt, d.completion])
    expect(row.costNano).toBe(costNano(d.prompt, d.completion, PRICE))
  })

  test('three prompts, n = 2: six choices, billed exactly (plain and streamed)', async () => {
    const prompts = ['the first prompt', 'a second one, longer than the first', 'third']
    let before = served(t)
    const { data, response } = await t
      .client()
      .completions.create({ model: 'test/chat', prompt: prompts, n: 2, max_tokens: 7, seed: 3 })
      .withResponse()
    expect(data.choices.map((c) => c.index).sort()).toEqual([0, 1, 2, 3, 4, 5])
    for (const c of data.choices) expect(c.text.length).toBeGreaterThan(0)
    let d = delta(t, before)
    expect([d.prompt, d.completion]).toEqual([data.usage!.prompt_tokens, data.usage!.completion_tokens])
    expect(data.usage!.completion_tokens).toBeGreaterThan(6)
    await billedExactly(t, response.headers.get('x-request-id'), data.usage!)

    before = served(t)
    const { data: stream, response: sr } = await t
      .client()
      .completions.create({
        model: 'test/chat',
        prompt: prompts,
        n: 2,
        max_tokens: 7,
        seed: 3,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    const { chunks, usage } = await drain(stream)
    const texts = new Map<number, string>()
    for (const c of chunks)
      for (const ch of c.choices) texts.set(ch.index, (texts.get(ch.index) ?? '') + ch.text)
    for (const c of data.choices) expect(texts.get(c.index)).toBe(c.text)
    d = delta(t, before)
    expect([d.prompt, d.completion]).toEqual([usage!.prompt_tokens, usage!.completion_tokens])
    expect(usage!.completion_tokens).toBe(data.usage!.completion_tokens)
    await billedExactly(t, sr.headers.get('x-request-id'), usage!)
  })

  test('token-array prompts: counted as their length, billed exactly', async () => {
    const one = await t
      .client()
      .completions.create({
        model: 'test/chat',
        prompt: [9906, 11, 1917, 0, 3, 4, 5, 6, 7, 8],
        max_tokens: 5,
      })
      .withResponse()
    expect(one.data.choices).toHaveLength(1)
    expect(one.data.usage!.prompt_tokens).toBe(10)
    await billedExactly(t, one.response.headers.get('x-request-id'), one.data.usage!)
    const two = await t
      .client()
      .completions.create({
        model: 'test/chat',
        prompt: [
          [1, 2, 3],
          [4, 5],
        ],
        max_tokens: 5,
      })
      .withResponse()
    expect(two.data.choices.map((c) => c.index).sort()).toEqual([0, 1])
    expect(two.data.usage!.prompt_tokens).toBe(5)
    await billedExactly(t, two.response.headers.get('x-request-id'), two.data.usage!)
  })

  test('echo, logprobs, suffix and best_of reach the node', async () => {
    const c = await t.client().completions.create({
      model: 'test/chat',
      prompt,
      max_tokens: 6,
      echo: true,
      logprobs: 2,
      suffix: '.',
      best_of: 3,
      n: 2,
    })
    expect(c.choices).toHaveLength(2)
    for (const ch of c.choices) {
      expect(ch.text.startsWith(prompt)).toBe(true)
      expect(ch.logprobs!.tokens!.length).toBeGreaterThan(0)
      expect(ch.logprobs!.tokens!.join('')).toBe(ch.text.slice(prompt.length))
    }
    // What the node refuses (best_of under n) is its 400, nothing billed.
    const before = (await usageRows(t)).length
    const err = await t
      .client()
      .completions.create({ model: 'test/chat', prompt, n: 2, best_of: 1 })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    expect((err as Error).message).toContain('best_of must be greater than or equal to n')
    expect(await usageRows(t)).toHaveLength(before)
  })

  test('the worst case (prompts x n x max_tokens) over the key’s limit: 402 before any upstream call', async () => {
    // 3 prompts x 4 choices x 2000 tokens at 0.00006 is 1.44 roubles, over the key's 1.
    const { key } = await newApiKey(t, { name: 'limited', limit_rub: 1 })
    const before = served(t)
    const rows = (await usageRows(t)).length
    const err = await t
      .client(key)
      .completions.create({ model: 'test/chat', prompt: ['a', 'b', 'c'], n: 4, max_tokens: 2000 })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.APIError)
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(402)
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('key_limit_reached')
    expect(delta(t, before).requests).toBe(0)
    expect(await usageRows(t)).toHaveLength(rows)
    // One prompt, one choice (0.12 roubles at worst) fits.
    const ok = await t.client(key).completions.create({ model: 'test/chat', prompt: 'a', max_tokens: 2000 })
    expect(ok.choices).toHaveLength(1)
  })

  test('a node failing before the first byte fails over to another, billed once', async () => {
    const f = await startTropa({
      nodes: [
        { name: 'bad', timeScale: 0, faults: { errorRate: 1 } },
        { name: 'cut', timeScale: 0, faults: { cutAfterTokens: 0 } },
        { name: 'good', timeScale: 0 },
      ],
    })
    try {
      for (let i = 0; i < 6; i++) {
        const { data, response } = await f
          .client()
          .completions.create({ model: 'test/chat', prompt, max_tokens: 5, seed: i })
          .withResponse()
        expect(response.headers.get('x-tropa-node')).toBe('good')
        await billedExactly(f, response.headers.get('x-request-id'), data.usage!)
        const { data: stream, response: sr } = await f
          .client()
          .completions.create({
            model: 'test/chat',
            prompt,
            max_tokens: 5,
            seed: i,
            stream: true,
            stream_options: { include_usage: true },
          })
          .withResponse()
        const { chunks, usage } = await drain(stream)
        expect(sr.headers.get('x-tropa-node')).toBe('good')
        expect(chunks.map((c) => c.choices[0]?.text ?? '').join('')).toBe(data.choices[0]!.text)
        await billedExactly(f, sr.headers.get('x-request-id'), usage!)
      }
      expect(await usageRows(f)).toHaveLength(12)
      for (const r of await usageRows(f)) expect(r.node).toBe('good')
      // Failover happened: the failing nodes were tried.
      expect(f.nodes[0]!.stats().requests + f.nodes[1]!.stats().requests).toBeGreaterThan(0)
    } finally {
      await f.stop()
    }
  })

  test('a client that leaves mid-stream: the node stops, the client pays for what it was sent', async () => {
    const slow = await startTropa({ nodes: [{ name: 'slow', itlMs: 20, timeScale: 1, ignoreEos: true }] })
    try {
      await leaveMidStream(slow, { model: 'test/chat', prompt }, 200, '/v1/completions')
      expect(slow.nodes[0]!.stats().aborted).toBe(1)
      expect(slow.nodes[0]!.stats().completionRequests).toBe(1)
    } finally {
      await slow.stop()
    }
  })
})

describe('POST /v1/completions translated to chat (a route not OpenAI-compatible)', () => {
  test('an anthropic route: the prompt as a chat message, billed exactly the node’s counts', async () => {
    let before = served(tr)
    const { data, response } = await tr
      .client()
      .completions.create({ model: 'test/ant', prompt, max_tokens: 12, seed: 4 })
      .withResponse()
    expect(data.object).toBe('text_completion')
    expect(data.id).toBe(`cmpl-${response.headers.get('x-request-id')}`)
    expect(data.model).toBe('test/ant')
    expect(data.choices[0]!.text.length).toBeGreaterThan(0)
    let d = delta(tr, before)
    expect([d.chats, d.completions]).toEqual([1, 0])
    expect([d.prompt, d.completion]).toEqual([data.usage!.prompt_tokens, data.usage!.completion_tokens])
    await billedExactly(tr, response.headers.get('x-request-id'), data.usage!)

    before = served(tr)
    const { data: stream, response: sr } = await tr
      .client()
      .completions.create({
        model: 'test/ant',
        prompt,
        max_tokens: 12,
        seed: 4,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    const { chunks, usage } = await drain(stream)
    for (const c of chunks)
      expect([c.id, c.object]).toEqual([`cmpl-${sr.headers.get('x-request-id')}`, 'text_completion'])
    expect(chunks.map((c) => c.choices[0]?.text ?? '').join('')).toBe(data.choices[0]!.text)
    d = delta(tr, before)
    expect([d.chats, d.completions]).toEqual([1, 0])
    await billedExactly(tr, sr.headers.get('x-request-id'), usage!)
  })

  test('a model mixing openai and anthropic routes is translated on both', async () => {
    const before = served(tr)
    for (let i = 0; i < 6; i++) {
      const c = await tr.client().completions.create({ model: 'test/mixed', prompt, max_tokens: 4, seed: i })
      expect(c.object).toBe('text_completion')
    }
    const d = delta(tr, before)
    expect([d.chats, d.completions]).toEqual([6, 0])
  })

  const refused: [string, Record<string, unknown>, string][] = [
    ['two prompts', { prompt: ['a', 'b'] }, 'prompt'],
    ['a token array', { prompt: [1, 2, 3] }, 'prompt'],
    ['arrays of token arrays', { prompt: [[1, 2]] }, 'prompt'],
    ['n > 1', { prompt, n: 2 }, 'n'],
    ['best_of > 1', { prompt, best_of: 3 }, 'best_of'],
    ['suffix', { prompt, suffix: 'end' }, 'suffix'],
    ['echo', { prompt, echo: true }, 'echo'],
    ['logprobs', { prompt, logprobs: 2 }, 'logprobs'],
  ]
  for (const model of ['test/ant', 'test/mixed'])
    for (const [what, extra, param] of refused)
      test(`${model}, ${what}: 400 naming ${param}, nothing sent or billed`, async () => {
        const before = served(tr)
        const rows = (await usageRows(tr)).length
        const err = await tr
          .client()
          .completions.create({ model, ...extra } as unknown as OpenAI.CompletionCreateParamsNonStreaming)
          .catch((e: unknown) => e)
        expect(err).toBeInstanceOf(OpenAI.BadRequestError)
        const e = err as InstanceType<typeof OpenAI.BadRequestError>
        expect(e.type).toBe('invalid_request_error')
        expect(e.param).toBe(param)
        expect(delta(tr, before).requests).toBe(0)
        expect(await usageRows(tr)).toHaveLength(rows)
      })

  test('a client that leaves mid-stream: billed for what it was sent through the translation', async () => {
    const slow = await startTropa({
      nodes: [{ name: 'slow', itlMs: 20, timeScale: 1, ignoreEos: true, protocol: 'anthropic' }],
      models: (nodes) => translatedModels([nodes[0]!, nodes[0]!]).slice(0, 1),
    })
    try {
      // (its stats' chat request: the node's engine stopped generating, leaveMidStream checks)
      await leaveMidStream(slow, { model: 'test/ant', prompt }, 200, '/v1/completions')
      expect(slow.nodes[0]!.stats().chatRequests).toBe(1)
    } finally {
      await slow.stop()
    }
  })
})

describe('POST /v1/completions: fallbacks', () => {
  test('a failed model falls back as chat does; a request only a pass-through carries skips translating fallbacks', async () => {
    const f = await startTropa({
      nodes: [
        { name: 'down', timeScale: 0, faults: { errorRate: 1 } },
        { name: 'oa', timeScale: 0 },
        { name: 'ant', timeScale: 0, protocol: 'anthropic' },
      ],
      models: (nodes) => {
        const [down, oa, ant] = nodes as [SimNode, SimNode, SimNode]
        const route = (n: SimNode) => ({ name: n.name, base_url: n.url, upstream_model: 'chat-up' })
        return [
          {
            id: 'test/first',
            kind: 'chat',
            context_length: 4096,
            pricing: CHAT_PRICE,
            routes: [route(down)],
            fallbacks: ['test/ant', 'test/second'],
          },
          { id: 'test/second', kind: 'chat', context_length: 4096, pricing: CHAT_PRICE, routes: [route(oa)] },
          ...translatedModels([oa, ant]).slice(0, 1),
        ]
      },
    })
    try {
      const text = await f
        .client()
        .completions.create({ model: 'test/first', prompt, max_tokens: 4 })
        .withResponse()
      expect(text.response.headers.get('x-tropa-fallback-from')).toBe('test/first')
      expect(text.response.headers.get('x-tropa-node')).toBe('ant')
      expect(text.data.model).toBe('test/ant')
      const tokens = await f
        .client()
        .completions.create({ model: 'test/first', prompt: [1, 2, 3], max_tokens: 4 })
        .withResponse()
      expect(tokens.response.headers.get('x-tropa-fallback-from')).toBe('test/first')
      expect(tokens.response.headers.get('x-tropa-node')).toBe('oa')
      expect(tokens.data.model).toBe('test/second')
      expect(tokens.data.usage!.prompt_tokens).toBe(3)
      expect(f.nodes[0]!.stats().requests).toBeGreaterThan(0)
      expect((await usageRows(f)).map((r) => r.model)).toEqual(['test/ant', 'test/second'])
    } finally {
      await f.stop()
    }
  }, 30_000)
})

describe('POST /v1/completions: errors in OpenAI’s shape', () => {
  const refused: [string, Record<string, unknown>, string][] = [
    ['no prompt', {}, 'prompt'],
    ['a prompt that is an object', { prompt: { text: 'x' } }, 'prompt'],
    ['token ids mixed with texts', { prompt: ['a', 1] }, 'prompt'],
  ]
  for (const [what, extra, param] of refused)
    test(`${what}: 400 naming ${param}, nothing billed`, async () => {
      const before = (await usageRows(t)).length
      const err = await t
        .client()
        .completions.create({
          model: 'test/chat',
          ...extra,
        } as unknown as OpenAI.CompletionCreateParamsNonStreaming)
        .catch((e: unknown) => e)
      expect(err).toBeInstanceOf(OpenAI.BadRequestError)
      const e = err as InstanceType<typeof OpenAI.BadRequestError>
      expect(e.status).toBe(400)
      expect(e.type).toBe('invalid_request_error')
      expect(e.param).toBe(param)
      expect(e.message.length).toBeGreaterThan(10)
      expect(await usageRows(t)).toHaveLength(before)
    })

  test('an unknown model is 404, an embedding model 400, no key 401', async () => {
    const unknown = await t
      .client()
      .completions.create({ model: 'test/nope', prompt })
      .catch((e: unknown) => e)
    expect(unknown).toBeInstanceOf(OpenAI.NotFoundError)
    const embed = await t
      .client()
      .completions.create({ model: 'test/embed', prompt })
      .catch((e: unknown) => e)
    expect(embed).toBeInstanceOf(OpenAI.BadRequestError)
    const anon = await t
      .client('sk-wrong')
      .completions.create({ model: 'test/chat', prompt })
      .catch((e: unknown) => e)
    expect(anon).toBeInstanceOf(OpenAI.AuthenticationError)
  })

  test('a prompt past the context, or leaving no room for max_tokens: 400 context_length_exceeded', async () => {
    for (const body of [
      { prompt: ['short', 'word '.repeat(5000)], max_tokens: 5 },
      { prompt: 'word '.repeat(4000), max_tokens: 200 },
      { prompt: 'word '.repeat(5000), max_tokens: 5 },
    ]) {
      const err = await t
        .client()
        .completions.create({ model: 'test/chat', ...body })
        .catch((e: unknown) => e)
      expect(err).toBeInstanceOf(OpenAI.BadRequestError)
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('context_length_exceeded')
    }
  })
})

describe('/v1/completions lines in a batch', () => {
  const jsonl = (rows: unknown[]) => `${rows.map((r) => JSON.stringify(r)).join('\n')}\n`
  const line = (i: number, body: Record<string, unknown> = {}) => ({
    custom_id: `c-${i}`,
    method: 'POST',
    url: '/v1/completions',
    body: { model: 'test/chat', prompt: `completion number ${i}`, max_tokens: 10, seed: i, ...body },
  })
  async function runBatch(x: Tropa, rows: unknown[]) {
    const client = x.client()
    const file = await client.files.create({
      file: await toFile(Buffer.from(jsonl(rows)), 'c.jsonl'),
      purpose: 'batch',
    })
    const created = await client.batches.create({
      input_file_id: file.id,
      endpoint: '/v1/completions',
      completion_window: '24h',
    })
    // (a worker thread loads its own tokenizer first: seconds on a busy machine)
    const until = Date.now() + 45_000
    for (;;) {
      const b = await client.batches.retrieve(created.id)
      if (['completed', 'failed', 'expired', 'cancelled'].includes(b.status)) return b
      if (Date.now() > until) throw new Error(`batch stuck in ${b.status}`)
      await Bun.sleep(50)
    }
  }

  test('passed through to the nodes’ /v1/completions, at exactly half the live price', async () => {
    const rows = Array.from({ length: 10 }, (_, i) => line(i))
    rows.push(line(10, { prompt: ['one prompt', 'another prompt'], n: 2 }), line(11, { prompt: [5, 6, 7] }))
    const before = served(t)
    const b = await runBatch(t, rows)
    expect(b.status).toBe('completed')
    expect(b.request_counts).toEqual({ total: 12, completed: 12, failed: 0 })
    const d = delta(t, before)
    expect([d.completions, d.chats]).toEqual([12, 0])
    const out = (await (await t.client().files.content(b.output_file_id!)).text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
    expect(out).toHaveLength(12)
    await t.svc.ledger.flush()
    const all = await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)
    for (const o of out) {
      expect(o.error).toBeNull()
      const body = o.response.body as OpenAI.Completion
      expect(body.object).toBe('text_completion')
      expect(body.id).toStartWith('cmpl-')
      expect(body.model).toBe('test/chat')
      const i = Number((o.custom_id as string).slice(2))
      expect(body.choices).toHaveLength(i === 10 ? 4 : 1)
      if (i === 11) expect(body.usage!.prompt_tokens).toBe(3)
      // The same request live: the same answer, twice the price.
      const { data, response } = await t
        .client()
        .completions.create(rows[i]!.body as unknown as OpenAI.CompletionCreateParamsNonStreaming)
        .withResponse()
      expect(data.choices.map((c) => c.text)).toEqual(body.choices.map((c) => c.text))
      await t.svc.ledger.flush()
      const rowsNow = await t.svc.store.ledgerForOrg(t.orgId, 0, Date.now() + 1000)
      const live = rowsNow.find((r) => r.requestId === response.headers.get('x-request-id'))!
      const batched = all.find((r) => r.batchId === b.id && r.requestId === o.response.request_id)!
      expect([batched.promptTokens, batched.completionTokens]).toEqual([
        body.usage!.prompt_tokens,
        body.usage!.completion_tokens,
      ])
      expect(batched.costNano * 2n).toBe(live.costNano)
    }
  }, 60_000)

  test('a line mixing token ids with texts fails validation with its param', async () => {
    const b = await runBatch(t, [line(1), line(2, { prompt: ['a', 1] })])
    expect(b.status).toBe('failed')
    expect((b.errors?.data ?? []).map((e) => [e.line, e.code, e.param])).toEqual([
      [2, 'invalid_value', 'body.prompt'],
    ])
  }, 30_000)

  test('translated on a model with a route that is not OpenAI-compatible; what it cannot carry fails validation', async () => {
    const ant = (i: number, body: Record<string, unknown> = {}) => line(i, { model: 'test/ant', ...body })
    const bad = await runBatch(tr, [ant(1), ant(2, { prompt: ['a', 'b'] }), ant(3, { echo: true })])
    expect(bad.status).toBe('failed')
    expect((bad.errors?.data ?? []).map((e) => [e.line, e.code, e.param])).toEqual([
      [2, 'invalid_value', 'body.prompt'],
      [3, 'invalid_value', 'body.echo'],
    ])
    const before = served(tr)
    const ok = await runBatch(tr, [ant(1), ant(2)])
    expect(ok.status).toBe('completed')
    const d = delta(tr, before)
    expect([d.chats, d.completions]).toEqual([2, 0])
    const out = (await (await tr.client().files.content(ok.output_file_id!)).text()).trim().split('\n')
    for (const l of out) expect(JSON.parse(l).response.body.object).toBe('text_completion')
  }, 60_000)
})

describe('POST /v1/completions: a client that stops reading', () => {
  test('backpressure holds on the pass-through: the stream is cut and billed for what was relayed', async () => {
    const LONG = 150_000
    const fast = await startTropa({
      nodes: [
        {
          name: 'fast',
          ignoreEos: true,
          itlMs: 0.1,
          iterationOverheadMs: 0,
          decodeMsPerSeq: 0,
          prefillTokensPerSec: 10_000_000,
        },
      ],
      models: (nodes) => [
        {
          id: 'test/long',
          context_length: 200_000,
          pricing: CHAT_PRICE,
          routes: nodes.map((n) => ({ name: n.name, base_url: n.url, upstream_model: 'chat-up' })),
        },
      ],
    })
    // server.stream_write_timeout_ms, shortened for the test
    ;(fast.svc.deps as { streamWriteTimeoutMs: number }).streamWriteTimeoutMs = 1000
    try {
      const body = JSON.stringify({
        model: 'test/long',
        prompt: 'tell me everything',
        stream: true,
        max_tokens: LONG,
      })
      const socket = net.connect(Number(new URL(fast.url).port), '127.0.0.1')
      socket.write(
        `POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${fast.apiKey}\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      )
      socket.pause() // reads nothing
      let row: Awaited<ReturnType<typeof usageRows>>[number] | undefined
      const until = Date.now() + 30_000
      while (!row && Date.now() < until) {
        await Bun.sleep(200)
        row = (await usageRows(fast))[0]
      }
      socket.destroy()
      expect(row?.outcome).toBe('client_stalled')
      expect(row!.completionTokens).toBeGreaterThan(0)
      expect(row!.completionTokens).toBeLessThan(LONG)
      expect(fast.nodes[0]!.stats().aborted).toBe(1)
    } finally {
      await fast.stop()
    }
  }, 40_000)
})
