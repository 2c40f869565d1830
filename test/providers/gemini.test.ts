import { afterAll, afterEach, beforeAll, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { costNano, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import type { SimNode, SimNodeOptions } from '../../src/simulator/index.ts'
import { leaveMidStream, usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// OpenAI's SDK -> Tropa -> a `provider: "gemini"` route -> the simulated Gemini API (the front
// checked with @google/genai in gemini-sim.test.ts). The node's engine counts what it billed
// (stats), so the usage the client sees can be checked exactly against it.

const KEY = 'AIzaSyDsim-0123456789abcdefghijklmnopq'
const PRICE = {
  promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
  completionNano: parseRub(CHAT_PRICE.completion, 6)!,
}
const EMBED_PRICE = { prompt: '0.000002', completion: '0.000000' }

interface RouteOpts {
  key?: string
}
const geminiModels =
  (keys: Record<string, RouteOpts> = {}) =>
  (nodes: SimNode[]): ModelFile[] => {
    const routes = (upstream: string) =>
      nodes.map((n) => ({
        name: n.name,
        provider: 'gemini' as const,
        base_url: n.url.replace(/\/v1$/, ''),
        upstream_model: upstream,
        headers: { 'x-goog-api-key': keys[n.name]?.key ?? KEY },
        max_concurrency: 64,
      }))
    return [
      {
        id: 'google/gemini-sim',
        kind: 'chat',
        context_length: 8192,
        pricing: CHAT_PRICE,
        routes: routes('gemini-2.5-flash'),
      },
      {
        id: 'google/embed-sim',
        kind: 'embedding',
        context_length: 2048,
        dimensions: 256,
        pricing: EMBED_PRICE,
        routes: routes('text-embedding-004'),
      },
    ]
  }
const gemNodes = (n: number, extra: Partial<SimNodeOptions> = {}): SimNodeOptions[] =>
  Array.from({ length: n }, (_, i) => ({
    name: `gem-${i + 1}`,
    timeScale: 0,
    seed: i + 1,
    protocol: 'gemini',
    ...extra,
  }))

const totals = (nodes: SimNode[]) =>
  nodes.reduce(
    (a, n) => {
      const s = n.stats()
      return {
        prompt: a.prompt + s.promptTokens,
        completion: a.completion + s.completionTokens,
        cached: a.cached + s.cachedTokens,
      }
    },
    { prompt: 0, completion: 0, cached: 0 },
  )

const weatherTool: OpenAI.ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}

describe('chat through a gemini route', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({ nodes: gemNodes(1), models: geminiModels() })
  })
  afterAll(() => t.stop())

  test('plain: text, finish_reason length at max_tokens, exact usage -> cost in header, body and ledger', async () => {
    const before = totals(t.nodes)
    const { data, response } = await t
      .client()
      .chat.completions.create({
        model: 'google/gemini-sim',
        messages: [
          { role: 'system', content: 'You are terse.' },
          { role: 'user', content: 'Count to twenty, please.' },
        ],
        max_tokens: 7,
      })
      .withResponse()
    expect(data.object).toBe('chat.completion')
    expect(data.model).toBe('google/gemini-sim')
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(data.choices[0]!.finish_reason).toBe('length')
    const after = totals(t.nodes)
    const usage = data.usage as OpenAI.CompletionUsage & { cost_rub: number; estimated?: boolean }
    expect(usage.prompt_tokens).toBe(after.prompt - before.prompt)
    expect(usage.completion_tokens).toBe(7)
    expect(after.completion - before.completion).toBe(7)
    expect(usage.total_tokens).toBe(usage.prompt_tokens + 7)
    expect(usage.estimated).toBeUndefined()
    const expected = costNano(usage.prompt_tokens, 7, PRICE)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(nanoToRubNumber(expected).toFixed(6))
    expect(usage.cost_rub).toBe(nanoToRubNumber(expected))
    const row = (await usageRows(t)).at(-1)!
    expect(row).toMatchObject({
      model: 'google/gemini-sim',
      estimated: false,
      outcome: 'ok',
      costNano: expected,
    })
  })

  test('the system message reaches the model (systemInstruction): more prompt tokens', async () => {
    const ask = (messages: OpenAI.ChatCompletionMessageParam[]) =>
      t.client().chat.completions.create({ model: 'google/gemini-sim', messages, max_tokens: 3 })
    const bare = await ask([{ role: 'user', content: 'hello' }])
    const withSystem = await ask([
      { role: 'system', content: 'Answer in French, in one short sentence, always.' },
      { role: 'user', content: 'hello' },
    ])
    expect(withSystem.usage!.prompt_tokens).toBeGreaterThan(bare.usage!.prompt_tokens + 5)
  })

  test('a repeated long prompt: cached tokens reported as prompt_tokens_details.cached_tokens', async () => {
    const messages = [{ role: 'user' as const, content: 'lorem ipsum dolor sit amet '.repeat(20) }]
    await t.client().chat.completions.create({ model: 'google/gemini-sim', messages, max_tokens: 2 })
    const before = totals(t.nodes)
    const r = await t
      .client()
      .chat.completions.create({ model: 'google/gemini-sim', messages, max_tokens: 2 })
    const cached = totals(t.nodes).cached - before.cached
    expect(cached).toBeGreaterThan(0)
    expect(r.usage!.prompt_tokens_details?.cached_tokens).toBe(cached)
  })

  test('streamed: chunks, a finish chunk, the usage chunk with its exact cost, [DONE]', async () => {
    const before = totals(t.nodes)
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({
        model: 'google/gemini-sim',
        messages: [{ role: 'user', content: 'Tell a story' }],
        stream: true,
        stream_options: { include_usage: true },
      }),
    })
    expect(res.status).toBe(200)
    const events = (await res.text()).split('\n\n').filter(Boolean)
    expect(events.at(-1)).toBe('data: [DONE]')
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)) as OpenAI.ChatCompletionChunk)
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')
    expect(text.length).toBeGreaterThan(0)
    expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant')
    expect(chunks.every((c) => c.model === 'google/gemini-sim')).toBe(true)
    expect(chunks.filter((c) => c.choices[0]?.finish_reason).map((c) => c.choices[0]!.finish_reason)).toEqual(
      ['stop'],
    )
    const usage = chunks.at(-1)!.usage as OpenAI.CompletionUsage & { cost_rub: number }
    expect(chunks.at(-1)!.choices).toEqual([])
    const after = totals(t.nodes)
    expect(usage.prompt_tokens).toBe(after.prompt - before.prompt)
    expect(usage.completion_tokens).toBe(after.completion - before.completion)
    const expected = costNano(usage.prompt_tokens, usage.completion_tokens, PRICE)
    expect(usage.cost_rub).toBe(nanoToRubNumber(expected))
    const row = (await usageRows(t)).at(-1)!
    expect(row).toMatchObject({
      estimated: false,
      costNano: expected,
      completionTokens: usage.completion_tokens,
    })
  })

  test('tools round trip: a call (ids, JSON arguments, finish tool_calls), then the answer to its result', async () => {
    const client = t.client()
    const first = await client.chat.completions.create({
      model: 'google/gemini-sim',
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: [weatherTool],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    })
    const choice = first.choices[0]!
    expect(choice.finish_reason).toBe('tool_calls')
    const call = choice.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall
    expect(call.id).toMatch(/^call_/)
    expect(call.function.name).toBe('get_weather')
    expect(JSON.parse(call.function.arguments)).toEqual({ city: 'sim' })
    expect(first.usage!.completion_tokens).toBeGreaterThan(0)
    const second = await client.chat.completions.create({
      model: 'google/gemini-sim',
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        choice.message,
        { role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21, "sky": "clear"}' },
      ],
      tools: [weatherTool],
    })
    expect(second.choices[0]!.finish_reason).toBe('stop')
    expect(second.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(second.choices[0]!.message.tool_calls).toBeUndefined()
  })

  test('tools, streamed: the call arrives as one tool_calls delta with index 0', async () => {
    const stream = await t.client().chat.completions.create({
      model: 'google/gemini-sim',
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: [weatherTool],
      tool_choice: 'required',
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
    expect(calls[0]).toMatchObject({ index: 0, type: 'function', function: { name: 'get_weather' } })
    expect(JSON.parse(calls[0]!.function!.arguments!)).toEqual({ city: 'sim' })
  })

  test('an image as a data URL (inlineData) and a stop sequence are accepted', async () => {
    const r = await t.client().chat.completions.create({
      model: 'google/gemini-sim',
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'What is in this picture?' },
            { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==' } },
          ],
        },
      ],
      stop: ['\n\n', 'END'],
      temperature: 0.3,
      top_p: 0.9,
    })
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
  })

  test('what Gemini cannot do is a clear 400 before any upstream call: n > 1, a tool result with no call', async () => {
    const client = t.client()
    const requests = t.nodes[0]!.stats().requests
    const e1 = await client.chat.completions
      .create({ model: 'google/gemini-sim', messages: [{ role: 'user', content: 'hi' }], n: 2 })
      .catch((e) => e)
    expect(e1).toBeInstanceOf(OpenAI.BadRequestError)
    expect(e1.param).toBe('n')
    const e2 = await client.chat.completions
      .create({
        model: 'google/gemini-sim',
        messages: [
          { role: 'user', content: 'hi' },
          { role: 'tool', tool_call_id: 'call_nope', content: 'x' },
        ],
      })
      .catch((e) => e)
    expect(e2).toBeInstanceOf(OpenAI.BadRequestError)
    expect(e2.message).toContain('tool_call_id')
    expect(t.nodes[0]!.stats().requests).toBe(requests)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
  })

  test("Gemini's own 400 (an invalid function name) is the client's 400, cleaned, not billed, not failed over", async () => {
    const rows = (await usageRows(t)).length
    const err = await t
      .client()
      .chat.completions.create({
        model: 'google/gemini-sim',
        messages: [{ role: 'user', content: 'hi' }],
        tools: [{ ...weatherTool, function: { ...weatherTool.function, name: '9 bad name' } }],
      })
      .catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    expect(err.code).toBe('upstream_rejected')
    expect(err.message).toContain('upstream rejected the request')
    expect(err.message).toContain('Invalid function name')
    expect(err.message).not.toContain(KEY)
    expect((await usageRows(t)).length).toBe(rows)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
  })
})

describe('embeddings through a gemini route (batchEmbedContents)', () => {
  let t: Tropa
  beforeAll(async () => {
    t = await startTropa({ nodes: gemNodes(1), models: geminiModels() })
  })
  afterAll(() => t.stop())

  test('several inputs, floats and base64 alike; Gemini reports no tokens, so Tropa bills its own count', async () => {
    const client = t.client()
    const input = ['first text to embed', 'second text', 'third']
    const { data: floats, response } = await client.embeddings
      .create({ model: 'google/embed-sim', input, dimensions: 64, encoding_format: 'float' })
      .withResponse()
    expect(floats.data).toHaveLength(3)
    expect(floats.model).toBe('google/embed-sim')
    expect(floats.data.map((d) => d.index)).toEqual([0, 1, 2])
    for (const d of floats.data) expect(d.embedding).toHaveLength(64)
    const usage = floats.usage as OpenAI.CreateEmbeddingResponse.Usage & {
      estimated?: boolean
      cost_rub: number
    }
    expect(usage.estimated).toBe(true)
    expect(usage.prompt_tokens).toBeGreaterThan(0)
    const row = (await usageRows(t)).at(-1)!
    expect(row).toMatchObject({
      model: 'google/embed-sim',
      estimated: true,
      promptTokens: usage.prompt_tokens,
    })
    expect(response.headers.get('x-tropa-cost-rub')).toBe(
      nanoToRubNumber(
        costNano(usage.prompt_tokens, 0, {
          promptNano: parseRub(EMBED_PRICE.prompt, 6)!,
          completionNano: 0n,
        }),
      ).toFixed(6),
    )
    // The SDK asks for base64 by default and decodes it: the same vectors.
    const b64 = await client.embeddings.create({ model: 'google/embed-sim', input, dimensions: 64 })
    for (let i = 0; i < 3; i++) {
      const a = b64.data[i]!.embedding
      const b = floats.data[i]!.embedding
      expect(a).toHaveLength(64)
      for (let j = 0; j < 64; j++) expect(a[j]).toBeCloseTo(b[j]!, 5)
    }
  })

  test('token-array input is refused with a clear 400', async () => {
    const res = await t.fetch('/v1/embeddings', {
      method: 'POST',
      body: JSON.stringify({ model: 'google/embed-sim', input: [1, 2, 3] }),
    })
    expect(res.status).toBe(400)
    const body = (await res.json()) as { error: { param: string; message: string } }
    expect(body.error.param).toBe('input')
  })
})

describe('failover and broken streams on gemini routes', () => {
  let t: Tropa | undefined
  afterEach(async () => {
    await t?.stop()
    t = undefined
  })
  const body = {
    model: 'google/gemini-sim',
    messages: [{ role: 'user' as const, content: 'hello' }],
    max_tokens: 8,
  }

  test('a node with a wrong key (Gemini: 400 API_KEY_INVALID) fails over and is logged, never the client 400', async () => {
    const logged: { msg: string; fields?: Record<string, unknown> }[] = []
    t = await startTropa({
      nodes: gemNodes(2),
      models: geminiModels({ 'gem-1': { key: 'wrong-key' } }),
      log: (_level, msg, fields) => logged.push({ msg, fields }),
    })
    const client = t.client()
    for (let i = 0; i < 12; i++) {
      const r =
        i % 2 === 0
          ? await client.chat.completions.create(body)
          : await client.chat.completions.create({ ...body, stream: true }).then(async (s) => {
              let text = ''
              for await (const c of s) text += c.choices[0]?.delta.content ?? ''
              return { choices: [text] }
            })
      expect(r.choices).toHaveLength(1)
    }
    const bad = [...t.svc.deps.pool.nodes.values()].find((n) => n.name === 'gem-1')!
    expect(bad.failures).toBeGreaterThan(0)
    const failed = logged.find((l) => l.msg === 'upstream attempt failed' && l.fields?.node === 'gem-1')
    expect(String(failed?.fields?.detail)).toContain('API key not valid')
  })

  test('a node answering 500 / 503 fails over: no client request fails', async () => {
    t = await startTropa({ nodes: gemNodes(3), models: geminiModels() })
    t.nodes[0]!.setFaults({ errorRate: 1 })
    t.nodes[1]!.setFaults({ rate503: 1 })
    const client = t.client()
    for (let i = 0; i < 10; i++) {
      const r = await client.chat.completions.create(body)
      expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
    }
    const pool = [...t.svc.deps.pool.nodes.values()]
    expect(
      pool.find((n) => n.name === 'gem-1')!.failures + pool.find((n) => n.name === 'gem-2')!.failures,
    ).toBeGreaterThan(0)
  })

  test('a stream killed mid-way ends with one error event, no [DONE], and the sent tokens are billed', async () => {
    t = await startTropa({
      nodes: gemNodes(1, { itlMs: 2, timeScale: 1, faults: { cutAfterTokens: 3 } }),
      models: geminiModels(),
    })
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ ...body, stream: true, max_tokens: 40 }),
    })
    expect(res.status).toBe(200)
    const events = (await res.text()).split('\n\n').filter(Boolean)
    const last = JSON.parse(events.at(-1)!.slice(6)) as { error?: { code: string } }
    expect(last.error?.code).toBe('upstream_error')
    expect(events.some((e) => e === 'data: [DONE]')).toBe(false)
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]!.estimated).toBe(true)
    expect(rows[0]!.completionTokens).toBe(3)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
  })

  test('a client that disconnects mid-stream: the Gemini stream is cancelled, what was sent is billed', async () => {
    t = await startTropa({ nodes: gemNodes(1, { itlMs: 20, timeScale: 1 }), models: geminiModels() })
    await leaveMidStream(t, body, 60)
    expect(t.svc.identity.org(t.orgId).reservedNano).toBe(0n)
  })
})
