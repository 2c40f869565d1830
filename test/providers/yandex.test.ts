import { afterEach, describe, expect, test } from 'bun:test'
import type { APIError, default as OpenAI } from 'openai'
import { costNano, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import type { SimNode, SimNodeOptions } from '../../src/simulator/index.ts'
import { leaveMidStream, usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// openai SDK -> Tropa -> a yandex route -> the simulated Foundation Models API.

const FOLDER = 'b1gtropatest'
const PRICE = {
  promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
  completionNano: parseRub(CHAT_PRICE.completion, 6)!,
}
const EMBED_PRICE = { promptNano: parseRub('0.000002', 6)!, completionNano: 0n }

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const route = (n: SimNode, upstream: string) => ({
  name: n.name,
  provider: 'yandex' as const,
  base_url: new URL(n.url).origin,
  api_key_env: 'YANDEX_KEY',
  folder_id: FOLDER,
  upstream_model: upstream,
  max_concurrency: 64,
})
const models = (nodes: SimNode[]): ModelFile[] => [
  {
    id: 'yandex/yandexgpt-sim',
    kind: 'chat',
    context_length: 8192,
    pricing: CHAT_PRICE,
    routes: nodes.map((n) => route(n, 'yandexgpt/latest')),
  },
  {
    id: 'yandex/text-search-doc',
    kind: 'embedding',
    context_length: 2048,
    dimensions: 256,
    pricing: { prompt: '0.000002', completion: '0.000000' },
    routes: nodes.map((n) => route(n, 'text-search-doc/latest')),
  },
]
const ya = (name: string, extra: Partial<SimNodeOptions> = {}): SimNodeOptions => ({
  name,
  protocol: 'yandex',
  timeScale: 0,
  seed: 1,
  ...extra,
})
const start = (nodes: SimNodeOptions[], key = 'AQVNtropatestkey') =>
  startTropa({ nodes, models, env: { YANDEX_KEY: key } })

const messages = [
  { role: 'system' as const, content: 'Ты краток.' },
  { role: 'user' as const, content: 'Расскажи про маршрутизаторы.' },
]
const totals = (tropa: Tropa) =>
  tropa.nodes.reduce(
    (s, n) => ({
      prompt: s.prompt + n.stats().promptTokens,
      completion: s.completion + n.stats().completionTokens,
    }),
    { prompt: 0, completion: 0 },
  )

describe('chat through a yandex route', () => {
  test('plain: the answer, the string token counts billed exactly at the model price', async () => {
    t = await start([ya('ya-1')])
    const { data, response } = await t
      .client()
      .chat.completions.create({ model: 'yandex/yandexgpt-sim', messages, max_tokens: 16, temperature: 0.5 })
      .withResponse()
    expect(data.model).toBe('yandex/yandexgpt-sim')
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(data.choices[0]!.finish_reason)
    const node = totals(t)
    expect(data.usage).toMatchObject({ prompt_tokens: node.prompt, completion_tokens: node.completion })
    const expected = costNano(node.prompt, node.completion, PRICE)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(nanoToRubNumber(expected).toFixed(6))
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]).toMatchObject({ costNano: expected, estimated: false, outcome: 'ok' })
  })

  test('max_tokens reaches the upstream (as a string): TRUNCATED_FINAL is finish_reason length', async () => {
    t = await start([ya('ya-1')])
    const r = await t
      .client()
      .chat.completions.create({ model: 'yandex/yandexgpt-sim', messages, max_tokens: 2 })
    expect(r.choices[0]!.finish_reason).toBe('length')
    expect(r.usage!.completion_tokens).toBe(2)
  })

  test('streamed: the cumulative lines become suffix chunks, the usage chunk has the exact cost', async () => {
    t = await start([ya('ya-1')])
    const plain = await t
      .client()
      .chat.completions.create({ model: 'yandex/yandexgpt-sim', messages, max_tokens: 12 })
    const stream = await t.client().chat.completions.create({
      model: 'yandex/yandexgpt-sim',
      messages,
      max_tokens: 12,
      stream: true,
      stream_options: { include_usage: true },
    })
    let text = ''
    let chunks = 0
    let finish: string | null = null
    let usage: (OpenAI.CompletionUsage & { cost_rub?: number }) | undefined
    for await (const c of stream) {
      if (c.choices[0]?.delta.content) chunks++
      text += c.choices[0]?.delta.content ?? ''
      finish = c.choices[0]?.finish_reason ?? finish
      if (c.usage) usage = c.usage
    }
    // The same request answers the same text (the node is deterministic; its plain answer is trimmed): no text repeated.
    expect(text.trimStart()).toBe(plain.choices[0]!.message.content!)
    expect(chunks).toBeGreaterThan(1)
    expect(['stop', 'length']).toContain(finish!)
    expect(usage).toMatchObject({
      prompt_tokens: plain.usage!.prompt_tokens,
      completion_tokens: plain.usage!.completion_tokens,
    })
    expect(usage!.cost_rub).toBe(
      nanoToRubNumber(costNano(usage!.prompt_tokens, usage!.completion_tokens, PRICE)),
    )
    const rows = await usageRows(t)
    expect(rows.map((r) => r.estimated)).toEqual([false, false])
  })

  test('tools: functions out, a tool call back (id, JSON arguments), the tool result taken in; streamed too', async () => {
    t = await start([ya('ya-1')])
    const tools: OpenAI.ChatCompletionTool[] = [
      {
        type: 'function',
        function: {
          name: 'weatherTool',
          description: 'Погода в городе',
          parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
        },
      },
    ]
    const client = t.client()
    const q = [{ role: 'user' as const, content: 'Какая погода в Петербурге?' }]
    const r = await client.chat.completions.create({ model: 'yandex/yandexgpt-sim', messages: q, tools })
    expect(r.choices[0]!.finish_reason).toBe('tool_calls')
    const call = r.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall
    expect(call.id).toMatch(/^call_/)
    expect(call.function.name).toBe('weatherTool')
    expect(typeof JSON.parse(call.function.arguments)).toBe('object')
    const r2 = await client.chat.completions.create({
      model: 'yandex/yandexgpt-sim',
      messages: [...q, r.choices[0]!.message, { role: 'tool', tool_call_id: call.id, content: '8°C' }],
      tools,
    })
    expect(r2.choices[0]!.finish_reason).not.toBe('tool_calls')
    expect(r2.choices[0]!.message.content!.length).toBeGreaterThan(0)
    // tool_choice none: no tools reach the API, the answer is text.
    const r3 = await client.chat.completions.create({
      model: 'yandex/yandexgpt-sim',
      messages: q,
      tools,
      tool_choice: 'none',
    })
    expect(r3.choices[0]!.finish_reason).not.toBe('tool_calls')

    const stream = await client.chat.completions.create({
      model: 'yandex/yandexgpt-sim',
      messages: q,
      tools,
      stream: true,
    })
    const calls: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = []
    let finish: string | null = null
    for await (const c of stream) {
      calls.push(...(c.choices[0]?.delta.tool_calls ?? []))
      finish = c.choices[0]?.finish_reason ?? finish
    }
    expect(finish).toBe('tool_calls')
    expect(calls).toHaveLength(1)
    expect(calls[0]).toMatchObject({ index: 0, type: 'function', function: { name: 'weatherTool' } })
    expect(typeof JSON.parse(calls[0]!.function!.arguments!)).toBe('object')
  })

  test('what YandexGPT cannot take (images) is refused with a clear 400 before any upstream call', async () => {
    t = await start([ya('ya-1')])
    const err = (await t
      .client()
      .chat.completions.create({
        model: 'yandex/yandexgpt-sim',
        messages: [
          {
            role: 'user',
            content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } }],
          },
        ],
      })
      .catch((e: unknown) => e)) as APIError
    expect(err.status).toBe(400)
    expect(err.message).toContain('text parts only')
    expect(t.nodes[0]!.stats().requests).toBe(0)
  })

  test('a request Yandex refuses (400) is the client 400, cleaned, with no failover', async () => {
    t = await start([ya('ya-1'), ya('ya-2', { seed: 2 })])
    // The reference: temperature is between 0 and 1.
    const err = (await t
      .client()
      .chat.completions.create({ model: 'yandex/yandexgpt-sim', messages, temperature: 1.5 })
      .catch((e: unknown) => e)) as APIError
    expect(err.status).toBe(400)
    expect(err.message).toContain('temperature')
    expect((err.error as { code?: string }).code).toBe('upstream_rejected')
    expect(totals(t).prompt).toBe(0)
    expect(await usageRows(t)).toHaveLength(0)
  })
})

describe('failures', () => {
  test('a node answering 5xx fails over to the other', async () => {
    t = await start([ya('ya-1', { faults: { errorRate: 1 } }), ya('ya-2', { seed: 2 })])
    for (let i = 0; i < 4; i++) {
      const { response } = await t
        .client()
        .chat.completions.create({ model: 'yandex/yandexgpt-sim', messages, max_tokens: 4 })
        .withResponse()
      expect(response.headers.get('x-tropa-node')).toBe('ya-2')
    }
  })

  test('a key the API refuses (401) fails the node over: 502 when no node takes it', async () => {
    t = await start([ya('ya-1')], '')
    const err = (await t
      .client()
      .chat.completions.create({ model: 'yandex/yandexgpt-sim', messages, max_tokens: 4 })
      .catch((e: unknown) => e)) as APIError
    expect([502, 503]).toContain(err.status!)
  })

  test('a client that leaves mid-stream stops the upstream stream and pays for what it was sent', async () => {
    t = await start([ya('ya-slow', { timeScale: 1, itlMs: 20, ignoreEos: true })])
    await leaveMidStream(t, { model: 'yandex/yandexgpt-sim', messages }, 200)
  })

  test('an IAM token (t1.) as the credential goes as Bearer', async () => {
    t = await start([ya('ya-1')], 't1.9euelZqSimIamToken')
    const r = await t
      .client()
      .chat.completions.create({ model: 'yandex/yandexgpt-sim', messages, max_tokens: 4 })
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
  })

  test('a stream killed mid-way ends with an error event, and the tokens sent are billed', async () => {
    t = await start([ya('ya-cut', { timeScale: 1, itlMs: 2, faults: { cutAfterTokens: 3 } })])
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ model: 'yandex/yandexgpt-sim', messages, stream: true, max_tokens: 40 }),
    })
    expect(res.status).toBe(200)
    const events = (await res.text()).split('\n\n').filter(Boolean)
    const last = JSON.parse(events.at(-1)!.slice(6)) as { error?: { code: string } }
    expect(last.error?.code).toBe('upstream_error')
    expect(events).not.toContain('data: [DONE]')
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    // What reached the client is billed: the node sent 3 tokens before the cut, and the last may
    // be lost with the connection.
    const received = events.filter((e) => e.includes('"content":')).length
    expect(received).toBeGreaterThanOrEqual(1)
    expect(received).toBeLessThanOrEqual(3)
    expect(rows[0]).toMatchObject({ estimated: true, completionTokens: received })
  })
})

describe('embeddings through a yandex route', () => {
  test('one textEmbedding call per input, assembled in order, numTokens summed, exact cost', async () => {
    t = await start([ya('ya-1')])
    const input = Array.from({ length: 9 }, (_, i) => `текст номер ${i} ${'слово '.repeat(i)}`)
    const { data, response } = await t
      .client()
      .embeddings.create({ model: 'yandex/text-search-doc', input })
      .withResponse()
    expect(data.data.map((d) => d.index)).toEqual([...input.keys()])
    expect(data.data[0]!.embedding).toHaveLength(256)
    // Each vector is the one for its own text.
    const one = await t.client().embeddings.create({ model: 'yandex/text-search-doc', input: input[5]! })
    expect(one.data[0]!.embedding).toEqual(data.data[5]!.embedding)
    expect(t.nodes[0]!.stats().embeddingRequests).toBe(10)
    const prompt = totals(t).prompt - one.usage.prompt_tokens
    expect(data.usage.prompt_tokens).toBe(prompt)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(
      nanoToRubNumber(costNano(prompt, 0, EMBED_PRICE)).toFixed(6),
    )
  })
})
