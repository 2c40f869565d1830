import { afterEach, describe, expect, test } from 'bun:test'
import OpenAI from 'openai'
import { costNano, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import type { SimNode, SimNodeOptions } from '../../src/simulator/index.ts'
import {
  SIM_AZURE_API_KEY,
  SIM_FILTER_OUTPUT,
  SIM_FILTER_PROMPT,
} from '../../src/simulator/protocols/azure.ts'
import { usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// The openai SDK -> Tropa -> an azure route -> the simulated Azure OpenAI resource.

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const PRICE = {
  promptNano: parseRub(CHAT_PRICE.prompt, 6)!,
  completionNano: parseRub(CHAT_PRICE.completion, 6)!,
}
const EMBED_PRICE = { promptNano: parseRub('0.000002', 6)!, completionNano: 0n }
const messages = [{ role: 'user' as const, content: 'hello from the azure test' }]
const env = { AZURE_KEY: SIM_AZURE_API_KEY, AZURE_WRONG: 'not-the-key' }
const origin = (n: SimNode) => `http://127.0.0.1:${n.port}`

/** Every node is an Azure resource; route options per node name may override the defaults. */
const azureModels =
  (overrides: (n: SimNode) => Record<string, unknown> | undefined = () => undefined) =>
  (nodes: SimNode[]): ModelFile[] => {
    const route = (n: SimNode, deployment: string) => ({
      name: n.name,
      provider: 'azure' as const,
      base_url: origin(n),
      upstream_model: deployment,
      api_version: '2024-10-21',
      api_key_env: 'AZURE_KEY',
      max_concurrency: 64,
      ...overrides(n),
    })
    return [
      {
        id: 'azure/gpt-sim',
        kind: 'chat',
        context_length: 4096,
        pricing: CHAT_PRICE,
        routes: nodes.map((n) => route(n, 'gpt-4o-dep')),
      },
      {
        id: 'azure/embed-sim',
        kind: 'embedding',
        context_length: 2048,
        dimensions: 256,
        pricing: { prompt: '0.000002', completion: '0.000000' },
        routes: nodes.map((n) => route(n, 'embed-dep')),
      },
    ]
  }

const azureNodes = (n: number, extra: Partial<SimNodeOptions> = {}): SimNodeOptions[] =>
  Array.from({ length: n }, (_, i) => ({
    name: `az-${i + 1}`,
    timeScale: 0,
    seed: i + 1,
    protocol: 'azure',
    ...extra,
  }))

describe('azure route: chat', () => {
  test('plain: Tropa’s id and model, exact usage -> cost, one ledger row', async () => {
    t = await startTropa({ nodes: azureNodes(1), models: azureModels(), env })
    const { data, response } = await t
      .client()
      .chat.completions.create({ model: 'azure/gpt-sim', messages, max_tokens: 20 })
      .withResponse()
    expect(data.model).toBe('azure/gpt-sim')
    expect(data.id).toBe(`chatcmpl-${response.headers.get('x-request-id')}`)
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0)
    const expected = costNano(data.usage!.prompt_tokens, data.usage!.completion_tokens, PRICE)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(nanoToRubNumber(expected).toFixed(6))
    expect((data.usage as unknown as { cost_rub: number }).cost_rub).toBe(nanoToRubNumber(expected))
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]).toMatchObject({ model: 'azure/gpt-sim', node: 'az-1', estimated: false, outcome: 'ok' })
    expect(rows[0]!.costNano).toBe(expected)
  })

  test('streamed: Azure’s empty-choices first event relayed, every chunk carries Tropa’s id and model, usage -> cost', async () => {
    t = await startTropa({ nodes: azureNodes(1), models: azureModels(), env })
    const { data: stream, response } = await t
      .client()
      .chat.completions.create({
        model: 'azure/gpt-sim',
        messages,
        max_tokens: 30,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse()
    const id = `chatcmpl-${response.headers.get('x-request-id')}`
    const chunks: OpenAI.ChatCompletionChunk[] = []
    for await (const c of stream) chunks.push(c)
    // The upstream's own completion id and deployment name never reach the client.
    for (const c of chunks) {
      expect(c.id).toBe(id)
      expect(c.model).toBe('azure/gpt-sim')
    }
    expect(chunks[0]!.choices).toEqual([]) // Azure's prompt_filter_results event
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')
    expect(text.length).toBeGreaterThan(0)
    expect(chunks.some((c) => c.choices[0]?.finish_reason === 'stop')).toBe(true)
    const usage = chunks.at(-1)!.usage!
    const expected = costNano(usage.prompt_tokens, usage.completion_tokens, PRICE)
    expect((usage as unknown as { cost_rub: number }).cost_rub).toBe(nanoToRubNumber(expected))
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]!.costNano).toBe(expected)
    expect(rows[0]!.estimated).toBe(false)
  })

  test('tools: a tool call comes back, plain and streamed', async () => {
    t = await startTropa({ nodes: azureNodes(1), models: azureModels(), env })
    const tools: OpenAI.ChatCompletionTool[] = [
      {
        type: 'function',
        function: {
          name: 'get_weather',
          parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
        },
      },
    ]
    const c = await t.client().chat.completions.create({ model: 'azure/gpt-sim', messages, tools })
    expect(c.choices[0]!.finish_reason).toBe('tool_calls')
    const call = c.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall
    expect(call.function.name).toBe('get_weather')
    expect(typeof JSON.parse(call.function.arguments).city).toBe('string')
    const s = await t
      .client()
      .chat.completions.create({ model: 'azure/gpt-sim', messages, tools, stream: true })
    let args = ''
    let finish: string | null | undefined
    for await (const ch of s) {
      args += ch.choices[0]?.delta.tool_calls?.[0]?.function?.arguments ?? ''
      finish = ch.choices[0]?.finish_reason ?? finish
    }
    expect(finish).toBe('tool_calls')
    expect(typeof JSON.parse(args).city).toBe('string')
  })

  test('embeddings: exact usage -> cost', async () => {
    t = await startTropa({ nodes: azureNodes(1), models: azureModels(), env })
    const { data, response } = await t
      .client()
      .embeddings.create({ model: 'azure/embed-sim', input: ['one two', 'three'] })
      .withResponse()
    expect(data.data).toHaveLength(2)
    expect(data.model).toBe('azure/embed-sim')
    const expected = costNano(data.usage.prompt_tokens, 0, EMBED_PRICE)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(nanoToRubNumber(expected).toFixed(6))
  })
})

describe('azure route: content filter', () => {
  test('finish_reason content_filter passes through, plain and streamed; a filtered prompt is the client’s 400', async () => {
    t = await startTropa({ nodes: azureNodes(1), models: azureModels(), env })
    const filtered = [{ role: 'user' as const, content: `tell me ${SIM_FILTER_OUTPUT}` }]
    const c = await t.client().chat.completions.create({ model: 'azure/gpt-sim', messages: filtered })
    expect(c.choices[0]!.finish_reason).toBe('content_filter')
    const s = await t
      .client()
      .chat.completions.create({ model: 'azure/gpt-sim', messages: filtered, stream: true })
    let finish: string | null | undefined
    for await (const ch of s) finish = ch.choices[0]?.finish_reason ?? finish
    expect(finish).toBe('content_filter')
    const err = await t
      .client()
      .chat.completions.create({
        model: 'azure/gpt-sim',
        messages: [{ role: 'user', content: SIM_FILTER_PROMPT }],
      })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    const e = err as InstanceType<typeof OpenAI.BadRequestError>
    expect(e.message).toContain('content management policy')
    expect(e.status).toBe(400)
    expect(e.message).toContain('upstream rejected the request')
    expect(await usageRows(t)).toHaveLength(2) // the two answers, not the refusal
  })
})

describe('azure route: inbound /v1/completions', () => {
  test('streamed: Azure’s prompt-filter event is left out, text chunks and a priced usage chunk', async () => {
    t = await startTropa({ nodes: azureNodes(1), models: azureModels(), env })
    const s = await t.client().completions.create({
      model: 'azure/gpt-sim',
      prompt: 'hello',
      max_tokens: 12,
      stream: true,
      stream_options: { include_usage: true },
    })
    const chunks: OpenAI.Completion[] = []
    for await (const c of s) chunks.push(c)
    expect(chunks[0]!.choices).toHaveLength(1)
    expect(chunks.every((c) => c.object === 'text_completion' && c.model === 'azure/gpt-sim')).toBe(true)
    const usage = chunks.at(-1)!.usage!
    const expected = costNano(usage.prompt_tokens, usage.completion_tokens, PRICE)
    expect((usage as unknown as { cost_rub: number }).cost_rub).toBe(nanoToRubNumber(expected))
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]!.costNano).toBe(expected)
  })
})

describe('azure route: errors', () => {
  test('Azure’s 400 is the client’s 400, cleaned, in OpenAI’s shape; nothing billed', async () => {
    // A resource that refuses the route's api-version answers 400 "API version not supported".
    t = await startTropa({
      nodes: azureNodes(1),
      models: azureModels(() => ({ api_version: 'latest' })),
      env,
    })
    const err = await t
      .client()
      .chat.completions.create({ model: 'azure/gpt-sim', messages })
      .catch((e: unknown) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).message).toContain(
      'API version not supported',
    )
    expect(await usageRows(t)).toHaveLength(0)
  })

  test('401 (a wrong key), 404 (no such resource path) and 503 fail over to the healthy resource', async () => {
    t = await startTropa({
      nodes: azureNodes(4),
      // three of the four fail: a request may meet all three before the healthy one
      upstream: { max_attempts: 4 },
      // az-1 has a wrong key (401); az-2's base_url is a path the resource does not serve (404)
      models: azureModels((n) =>
        n.name === 'az-1'
          ? { api_key_env: 'AZURE_WRONG' }
          : n.name === 'az-2'
            ? { base_url: `${origin(n)}/nope` }
            : undefined,
      ),
      env,
    })
    t.nodes[2]!.setFaults({ rate503: 1 })
    const client = t.client()
    for (let i = 0; i < 12; i++) {
      const r = await client.chat.completions.create({
        model: 'azure/gpt-sim',
        messages,
        stream: i % 2 === 1,
      })
      if (i % 2 === 1) {
        let n = 0
        for await (const c of r as AsyncIterable<OpenAI.ChatCompletionChunk>) n += c.choices.length
        expect(n).toBeGreaterThan(0)
      } else expect((r as OpenAI.ChatCompletion).choices).toHaveLength(1)
    }
    const rows = await usageRows(t)
    expect(rows).toHaveLength(12)
    expect(rows.every((r) => r.node === 'az-4')).toBe(true)
    const failures = (name: string) =>
      [...t!.svc.deps.pool.nodes.values()].find((n) => n.name === name)!.failures
    expect(failures('az-1') + failures('az-2') + failures('az-3')).toBeGreaterThan(0)
  })

  test('a resource that breaks or stalls after its prompt-filter event, before any token, is failed over', async () => {
    // Fakes of a resource that sends Azure's opening event and then breaks, or goes silent.
    // (both key orders Azure has used: choices first, and id first with usage null)
    const openings = {
      break: `data: ${JSON.stringify({ choices: [], created: 0, id: '', model: '', object: '', prompt_filter_results: [] })}\n\n`,
      stall: `data: ${JSON.stringify({ id: '', object: '', created: 0, model: '', prompt_filter_results: [], choices: [], usage: null })}\n\n`,
    }
    const fake = (after: 'break' | 'stall') =>
      Bun.serve({
        port: 0,
        hostname: '127.0.0.1',
        idleTimeout: 0,
        fetch: () =>
          new Response(
            new ReadableStream<Uint8Array>({
              start(c) {
                c.enqueue(new TextEncoder().encode(openings[after]))
                if (after === 'break') setTimeout(() => c.error(new Error('resource died')), 20)
              },
            }),
            { headers: { 'content-type': 'text/event-stream' } },
          ),
      })
    const broken = fake('break')
    const stalled = fake('stall')
    try {
      t = await startTropa({
        nodes: azureNodes(1),
        upstream: { first_byte_timeout_ms: 300 },
        models: (nodes) => [
          {
            id: 'azure/gpt-sim',
            kind: 'chat',
            context_length: 4096,
            pricing: CHAT_PRICE,
            routes: [
              ...[broken, stalled].map((f, i) => ({
                name: `fake-${i}`,
                provider: 'azure' as const,
                base_url: `http://127.0.0.1:${f.port}`,
                upstream_model: 'gpt-4o-dep',
                api_version: '2024-10-21',
              })),
              {
                name: 'az-1',
                provider: 'azure' as const,
                base_url: origin(nodes[0]!),
                upstream_model: 'gpt-4o-dep',
                api_version: '2024-10-21',
                api_key_env: 'AZURE_KEY',
              },
            ],
          },
        ],
        env,
      })
      for (let i = 0; i < 6; i++) {
        const s = await t.client().chat.completions.create({ model: 'azure/gpt-sim', messages, stream: true })
        let text = ''
        for await (const c of s) text += c.choices[0]?.delta.content ?? ''
        expect(text.length).toBeGreaterThan(0)
      }
      const rows = await usageRows(t)
      expect(rows).toHaveLength(6)
      expect(rows.every((r) => r.node === 'az-1' && r.outcome === 'ok')).toBe(true)
      const failures = (name: string) =>
        [...t!.svc.deps.pool.nodes.values()].find((n) => n.name === name)!.failures
      expect(failures('fake-0') + failures('fake-1')).toBeGreaterThan(0)
    } finally {
      await broken.stop(true)
      await stalled.stop(true)
    }
  })

  test('a resource killed mid-stream: one error event, the sent tokens billed', async () => {
    t = await startTropa({
      nodes: azureNodes(1, { timeScale: 1, itlMs: 2, faults: { cutAfterTokens: 3 } }),
      models: azureModels(),
      env,
    })
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ model: 'azure/gpt-sim', messages, stream: true, max_tokens: 40 }),
    })
    expect(res.status).toBe(200)
    const events = (await res.text()).split('\n\n').filter(Boolean)
    const last = JSON.parse(events.at(-1)!.slice(6)) as { error?: { code: string } }
    expect(last.error?.code).toBe('upstream_error')
    expect(events.includes('data: [DONE]')).toBe(false)
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]!.estimated).toBe(true)
    expect(rows[0]!.completionTokens).toBe(3)
  })
})
