import { afterEach, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI, { type APIError } from 'openai'
import { costNano, nanoToRubNumber, parseRub } from '../../src/billing/money.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import type { SimNode, SimNodeOptions } from '../../src/simulator/index.ts'
import { leaveMidStream, usageRows } from '../helpers/ledger.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'
import { testCa } from '../helpers/tls.ts'

// openai SDK -> Tropa -> a gigachat route -> the simulated GigaChat (OAuth + its own API).

const KEY = btoa('tropa-client:tropa-secret')
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

const origin = (n: SimNode) => new URL(n.url).origin
const route = (n: SimNode, upstream: string, keyEnv = 'GIGACHAT_KEY') => ({
  name: n.name,
  provider: 'gigachat' as const,
  base_url: `${origin(n)}/api/v1`,
  auth_url: `${origin(n)}/api/v2/oauth`,
  api_key_env: keyEnv,
  upstream_model: upstream,
  max_concurrency: 128,
})
const models = (nodes: SimNode[], keyEnv?: (n: SimNode) => string): ModelFile[] => [
  {
    id: 'gigachat/gigachat-sim',
    kind: 'chat',
    context_length: 8192,
    pricing: CHAT_PRICE,
    routes: nodes.map((n) => route(n, 'GigaChat', keyEnv?.(n))),
  },
  {
    id: 'gigachat/embeddings',
    kind: 'embedding',
    context_length: 512,
    dimensions: 256,
    pricing: { prompt: '0.000002', completion: '0.000000' },
    routes: nodes.map((n) => route(n, 'Embeddings', keyEnv?.(n))),
  },
]
const giga = (name: string, extra: Partial<SimNodeOptions> = {}): SimNodeOptions => ({
  name,
  protocol: 'gigachat',
  timeScale: 0,
  seed: 1,
  ...extra,
})
const start = (nodes: SimNodeOptions[], keyEnv?: (n: SimNode) => string) =>
  startTropa({
    nodes,
    models: (n) => models(n, keyEnv),
    env: { GIGACHAT_KEY: KEY, GIGACHAT_BAD_KEY: btoa('not-a-pair') },
  })

const messages = [{ role: 'user' as const, content: 'Расскажи про маршрутизаторы.' }]
const totals = (tropa: Tropa) =>
  tropa.nodes.reduce(
    (s, n) => ({
      prompt: s.prompt + n.stats().promptTokens,
      completion: s.completion + n.stats().completionTokens,
      auth: s.auth + n.stats().authRequests,
    }),
    { prompt: 0, completion: 0, auth: 0 },
  )

describe('chat through a gigachat route', () => {
  test('plain: the answer, the node usage billed exactly at the model price', async () => {
    t = await start([giga('giga-1')])
    const { data, response } = await t
      .client()
      .chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 16 })
      .withResponse()
    expect(data.model).toBe('gigachat/gigachat-sim')
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(data.choices[0]!.finish_reason)
    const node = totals(t)
    expect(node.auth).toBe(1)
    expect(data.usage!.prompt_tokens).toBe(node.prompt)
    expect(data.usage!.completion_tokens).toBe(node.completion)
    const expected = costNano(node.prompt, node.completion, PRICE)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(nanoToRubNumber(expected).toFixed(6))
    const rows = await usageRows(t)
    expect(rows).toHaveLength(1)
    expect(rows[0]).toMatchObject({ costNano: expected, estimated: false, outcome: 'ok' })
    // A second request reuses the token: no second exchange.
    await t.client().chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 4 })
    expect(totals(t).auth).toBe(1)
  })

  test('streamed: text chunks, finish_reason, the usage chunk with its exact cost', async () => {
    t = await start([giga('giga-1')])
    const stream = await t.client().chat.completions.create({
      model: 'gigachat/gigachat-sim',
      messages,
      max_tokens: 12,
      stream: true,
      stream_options: { include_usage: true },
    })
    let text = ''
    let finish: string | null = null
    let usage: (OpenAI.CompletionUsage & { cost_rub?: number }) | undefined
    for await (const c of stream) {
      text += c.choices[0]?.delta.content ?? ''
      finish = c.choices[0]?.finish_reason ?? finish
      if (c.usage) usage = c.usage
    }
    expect(text.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(finish!)
    const node = totals(t)
    expect(usage).toMatchObject({ prompt_tokens: node.prompt, completion_tokens: node.completion })
    expect(usage!.cost_rub).toBe(nanoToRubNumber(costNano(node.prompt, node.completion, PRICE)))
    const rows = await usageRows(t)
    expect(rows[0]).toMatchObject({ estimated: false, completionTokens: node.completion })
  })

  test('tools: functions out, a tool call back (id, JSON arguments), the tool result taken in', async () => {
    t = await start([giga('giga-1')])
    const tools: OpenAI.ChatCompletionTool[] = [
      {
        type: 'function',
        function: {
          name: 'weather',
          description: 'Погода в городе',
          parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
        },
      },
    ]
    const client = t.client()
    const q = [{ role: 'user' as const, content: 'Погода в Москве?' }]
    const r = await client.chat.completions.create({ model: 'gigachat/gigachat-sim', messages: q, tools })
    expect(r.choices[0]!.finish_reason).toBe('tool_calls')
    const call = r.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall
    expect(call.id).toMatch(/^call_/)
    expect(call.function.name).toBe('weather')
    expect(typeof JSON.parse(call.function.arguments)).toBe('object')
    const r2 = await client.chat.completions.create({
      model: 'gigachat/gigachat-sim',
      messages: [
        ...q,
        r.choices[0]!.message,
        { role: 'tool', tool_call_id: call.id, content: 'минус пять, снег' },
      ],
      tools,
    })
    expect(r2.choices[0]!.finish_reason).not.toBe('tool_calls')
    expect(r2.choices[0]!.message.content!.length).toBeGreaterThan(0)

    // Streamed, the call comes whole in one chunk with its id.
    const stream = await client.chat.completions.create({
      model: 'gigachat/gigachat-sim',
      messages: q,
      tools,
      tool_choice: { type: 'function', function: { name: 'weather' } },
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
    expect(calls[0]!.function!.name).toBe('weather')
    expect(typeof JSON.parse(calls[0]!.function!.arguments!)).toBe('object')
  })

  test('a request GigaChat refuses (422) is the client 400, cleaned; no failover', async () => {
    t = await start([giga('giga-1'), giga('giga-2', { seed: 2 })])
    const err = (await t
      .client()
      .chat.completions.create({ model: 'gigachat/gigachat-sim', messages, temperature: 0 })
      .catch((e: unknown) => e)) as APIError
    expect(err.status).toBe(400)
    expect(err.message).toContain('temperature')
    expect(err.message).not.toContain(KEY)
    expect((err.error as { code?: string }).code).toBe('upstream_rejected')
    expect(totals(t).prompt).toBe(0)
    expect(await usageRows(t)).toHaveLength(0)
  })
})

describe('failures', () => {
  test('a node answering 5xx fails over to the other', async () => {
    t = await start([giga('giga-1', { faults: { rate503: 1 } }), giga('giga-2', { seed: 2 })])
    for (let i = 0; i < 4; i++) {
      const { response } = await t
        .client()
        .chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 4 })
        .withResponse()
      expect(response.headers.get('x-tropa-node')).toBe('giga-2')
    }
  })

  test('an OAuth endpoint refusing the key is a node failure: the request fails over', async () => {
    t = await start([giga('giga-bad'), giga('giga-2', { seed: 2 })], (n) =>
      n.name === 'giga-bad' ? 'GIGACHAT_BAD_KEY' : 'GIGACHAT_KEY',
    )
    for (let i = 0; i < 4; i++) {
      const { response } = await t
        .client()
        .chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 4 })
        .withResponse()
      expect(response.headers.get('x-tropa-node')).toBe('giga-2')
    }
  })

  test('an OAuth endpoint that never answers is the node failing at its headers deadline: the request fails over', async () => {
    // The exchange's own timeout is 10 s; the route's first-byte deadline (500 ms) bounds the wait.
    let exchanges = 0
    const hung = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      idleTimeout: 0,
      fetch: () => {
        exchanges++
        return new Promise<Response>(() => {})
      },
    })
    try {
      t = await startTropa({
        nodes: [giga('giga-hung'), giga('giga-2', { seed: 2 })],
        models: (nodes) =>
          models(nodes).map((m) => ({
            ...m,
            // The hung node is the router's first choice.
            routes: (m.routes ?? []).map((r) =>
              r.name === 'giga-hung'
                ? { ...r, weight: 1000, auth_url: `http://127.0.0.1:${hung.port}/api/v2/oauth` }
                : r,
            ),
          })),
        env: { GIGACHAT_KEY: KEY },
        upstream: { first_byte_timeout_ms: 500 },
      })
      const client = new OpenAI({ baseURL: t.baseURL, apiKey: t.apiKey, maxRetries: 0, timeout: 5_000 })
      for (let i = 0; i < 3; i++) {
        const { response } = await client.chat.completions
          .create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 4 })
          .withResponse()
        expect(response.headers.get('x-tropa-node')).toBe('giga-2')
      }
      expect(exchanges).toBeGreaterThan(0)
    } finally {
      hung.stop(true)
    }
  })

  test('a token refused by the API (401) is refreshed once and the request retried on the same node', async () => {
    t = await start([giga('giga-1')])
    const client = t.client()
    await client.chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 4 })
    expect(totals(t).auth).toBe(1)
    const node = t.nodes[0]!
    expect((await fetch(`${origin(node)}/sim/revoke-tokens`, { method: 'POST' })).status).toBe(204)
    const r = await client.chat.completions.create({
      model: 'gigachat/gigachat-sim',
      messages,
      max_tokens: 4,
    })
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(totals(t).auth).toBe(2)
  })

  test('a client that leaves mid-stream stops the upstream stream and pays for what it was sent', async () => {
    t = await start([giga('giga-slow', { timeScale: 1, itlMs: 20, ignoreEos: true })])
    await leaveMidStream(t, { model: 'gigachat/gigachat-sim', messages }, 200)
  })

  test('a token refused again after the refresh fails the node over (one refresh per attempt, not a loop)', async () => {
    // giga-a's route takes its tokens from giga-b's OAuth endpoint: giga-a refuses every one.
    t = await startTropa({
      nodes: [giga('giga-a'), giga('giga-b', { seed: 2 })],
      models: (nodes) =>
        models(nodes).map((m) => ({
          ...m,
          routes: (m.routes ?? []).map((r) => ({
            ...r,
            ...(r.name === 'giga-a' && { weight: 1000 }),
            auth_url: `${origin(nodes[1]!)}/api/v2/oauth`,
          })),
        })),
      env: { GIGACHAT_KEY: KEY },
    })
    const { response } = await t
      .client()
      .chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 4 })
      .withResponse()
    expect(response.headers.get('x-tropa-node')).toBe('giga-b')
    const [a, b] = t.nodes
    expect(a!.stats().authRequests).toBe(0)
    // The first token, and one refresh after giga-a's 401 (giga-a, weighted, is tried first): no more.
    expect(b!.stats().authRequests).toBe(2)
    expect(a!.stats().chatRequests).toBe(0)
  })

  test('a stream killed mid-way ends with an error event, and the tokens sent are billed', async () => {
    t = await start([giga('giga-cut', { timeScale: 1, itlMs: 2, faults: { cutAfterTokens: 3 } })])
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ model: 'gigachat/gigachat-sim', messages, stream: true, max_tokens: 40 }),
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

describe('the token cache', () => {
  test('100 concurrent requests after the token expired make exactly one OAuth call', async () => {
    t = await start([giga('giga-1', { tokenLifetimeMs: 1000 })])
    const client = t.client()
    await client.chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 2 })
    expect(totals(t).auth).toBe(1)
    await Bun.sleep(1100)
    const all = await Promise.all(
      Array.from({ length: 100 }, () =>
        client.chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 2 }),
      ),
    )
    expect(all.every((r) => r.choices[0]!.message.content!.length > 0)).toBe(true)
    expect(totals(t).auth).toBe(2)
  })
})

describe('embeddings through a gigachat route', () => {
  test('vectors in order (the SDK default base64 too), usage summed over the items, exact cost', async () => {
    t = await start([giga('giga-1')])
    const input = ['первый текст', 'второй текст подлиннее', 'третий']
    const { data, response } = await t
      .client()
      .embeddings.create({ model: 'gigachat/embeddings', input })
      .withResponse()
    expect(data.data).toHaveLength(3)
    expect(data.data.map((d) => d.index)).toEqual([0, 1, 2])
    expect(data.data[0]!.embedding).toHaveLength(256)
    const prompt = totals(t).prompt
    expect(prompt).toBeGreaterThan(0)
    expect(data.usage.prompt_tokens).toBe(prompt)
    expect(response.headers.get('x-tropa-cost-rub')).toBe(
      nanoToRubNumber(costNano(prompt, 0, EMBED_PRICE)).toFixed(6),
    )
    const floats = await t
      .client()
      .embeddings.create({ model: 'gigachat/embeddings', input: 'одно', encoding_format: 'float' })
    expect(floats.data[0]!.embedding).toHaveLength(256)
  })
})

describe('tls_ca_file', () => {
  test('the OAuth exchange trusts the route CA: with it the token comes, without it the node fails', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tropa-giga-tls-'))
    const ca = testCa(dir)
    let simOrigin = ''
    // An HTTPS OAuth endpoint whose certificate only the test CA vouches for, passing on to the fake.
    const oauth = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      tls: { cert: ca.cert, key: ca.key },
      fetch: (req) =>
        fetch(`${simOrigin}/api/v2/oauth`, { method: 'POST', headers: req.headers, body: req.body }),
    })
    try {
      const withCa = (trusted: boolean) =>
        startTropa({
          nodes: [giga('giga-tls')],
          models: (nodes) => {
            simOrigin = origin(nodes[0]!)
            return models(nodes).map((m) => ({
              ...m,
              routes: (m.routes ?? []).map((r) => ({
                ...r,
                auth_url: `https://127.0.0.1:${oauth.port}/api/v2/oauth`,
                ...(trusted && { tls_ca_file: ca.caFile }),
              })),
            }))
          },
          env: { GIGACHAT_KEY: KEY },
        })
      t = await withCa(true)
      const r = await t
        .client()
        .chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 4 })
      expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0)
      expect(totals(t).auth).toBe(1)
      await t.stop()
      t = undefined
      t = await withCa(false)
      const err = (await t
        .client()
        .chat.completions.create({ model: 'gigachat/gigachat-sim', messages, max_tokens: 4 })
        .catch((e: unknown) => e)) as APIError
      expect([502, 503]).toContain(err.status!)
      expect(totals(t).auth).toBe(0)
    } finally {
      oauth.stop(true)
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
