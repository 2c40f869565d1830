import { afterEach, describe, expect, test } from 'bun:test'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI from 'openai'
import { ConfigError, loadConfig } from '../../src/config/load.ts'
import type { ModelFile } from '../../src/config/schema.ts'
import type { Log } from '../../src/services.ts'
import type { SimNode, SimNodeOptions } from '../../src/simulator/index.ts'
import { ANTHROPIC_SIM_KEY } from '../../src/simulator/protocols/anthropic.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// The openai SDK -> Tropa -> an anthropic route -> the simulated Messages API. Tropa speaks
// OpenAI to the client and Anthropic to the node; usage and cost are the node's own counts.

let t: Tropa | undefined
afterEach(async () => {
  await t?.stop()
  t = undefined
})

const MODEL = 'anthropic/claude-sim'

function anthropicModel(nodes: SimNode[], keys: Record<string, string> = {}): ModelFile[] {
  return [
    {
      id: MODEL,
      kind: 'chat',
      context_length: 8192,
      pricing: CHAT_PRICE,
      routes: nodes.map((n) => ({
        name: n.name,
        provider: 'anthropic',
        base_url: n.url.replace(/\/v1$/, ''),
        upstream_model: 'claude-sim-up',
        max_concurrency: 64,
        headers: { 'x-api-key': keys[n.name] ?? ANTHROPIC_SIM_KEY },
      })),
    },
  ]
}

const antNode = (name: string, extra: Partial<SimNodeOptions> = {}): SimNodeOptions => ({
  name,
  timeScale: 0,
  seed: 1,
  protocol: 'anthropic',
  ...extra,
})

async function start(nodes: SimNodeOptions[], keys: Record<string, string> = {}, log?: Log) {
  t = await startTropa({ nodes, models: (n) => anthropicModel(n, keys), ...(log && { log }) })
  return t
}

/** The exact cost at CHAT_PRICE, in roubles (nano-rouble arithmetic, as Tropa bills). */
const costOf = (p: number, c: number) => Number(BigInt(p) * 30_000n + BigInt(c) * 60_000n) / 1e9

const simTotals = (tr: Tropa) =>
  tr.nodes.reduce(
    (a, n) => ({
      prompt: a.prompt + n.stats().promptTokens,
      completion: a.completion + n.stats().completionTokens,
    }),
    { prompt: 0, completion: 0 },
  )

const weatherTool: OpenAI.ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}

describe('chat through an anthropic route', () => {
  test('plain: text, finish stop, usage and cost exactly the node counts', async () => {
    const tr = await start([antNode('ant-1')])
    const res = await tr.client().chat.completions.create({
      model: MODEL,
      max_tokens: 100,
      messages: [{ role: 'user', content: 'Say hello' }],
    })
    expect(res.model).toBe(MODEL)
    expect(res.object).toBe('chat.completion')
    expect(typeof res.choices[0]!.message.content).toBe('string')
    expect(res.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(res.choices[0]!.finish_reason).toBe('stop')
    const sim = simTotals(tr)
    const u = res.usage as OpenAI.CompletionUsage & { cost_rub: number }
    expect(u.prompt_tokens).toBe(sim.prompt)
    expect(u.completion_tokens).toBe(sim.completion)
    expect(u.total_tokens).toBe(sim.prompt + sim.completion)
    expect(u.cost_rub).toBe(costOf(sim.prompt, sim.completion))
  })

  test('max_tokens reaches the node: finish length at exactly that many tokens', async () => {
    const tr = await start([antNode('ant-1')])
    const res = await tr.client().chat.completions.create({
      model: MODEL,
      max_tokens: 3,
      messages: [{ role: 'user', content: 'Tell me a long story' }],
    })
    expect(res.choices[0]!.finish_reason).toBe('length')
    expect(res.usage!.completion_tokens).toBe(3)
  })

  test("max_output_tokens (the catalogue's cap) is the bound sent when the request sets none", async () => {
    t = await startTropa({
      nodes: [antNode('ant-1', { ignoreEos: true })],
      models: (nodes) => anthropicModel(nodes).map((m) => ({ ...m, max_output_tokens: 50 })),
    })
    const client = t.client()
    const res = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Tell me a long story' }],
    })
    // Every answer runs to its bound here (ignore_eos): the bound sent was 50, not the context left.
    expect(res.usage!.completion_tokens).toBe(50)
    expect(res.choices[0]!.finish_reason).toBe('length')
    const err = await client.chat.completions
      .create({ model: MODEL, max_tokens: 51, messages: [{ role: 'user', content: 'hi' }] })
      .catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    expect(err.param).toBe('max_tokens')
    expect(err.message).toContain('output limit of 50')
  })

  test('cache reads are prompt tokens too, reported as cached_tokens', async () => {
    const tr = await start([antNode('ant-1')])
    const ask = () =>
      tr.client().chat.completions.create({
        model: MODEL,
        max_tokens: 10,
        messages: [{ role: 'user', content: 'word '.repeat(300) }],
      })
    const a = await ask()
    const b = await ask()
    expect(b.usage!.prompt_tokens).toBe(a.usage!.prompt_tokens)
    expect(b.usage!.prompt_tokens_details?.cached_tokens).toBeGreaterThan(0)
    expect(tr.nodes[0]!.stats().cachedTokens).toBe(b.usage!.prompt_tokens_details!.cached_tokens!)
  })

  test('streamed: chunks, finish stop, the usage chunk at the node counts and its cost, [DONE]', async () => {
    const tr = await start([antNode('ant-1')])
    const stream = await tr.client().chat.completions.create({
      model: MODEL,
      max_tokens: 100,
      stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: 'user', content: 'Say hello' }],
    })
    let text = ''
    let finish: string | null = null
    let usage: (OpenAI.CompletionUsage & { cost_rub?: number }) | undefined
    const ids = new Set<string>()
    for await (const c of stream) {
      ids.add(c.id)
      expect(c.model).toBe(MODEL)
      text += c.choices[0]?.delta.content ?? ''
      finish = c.choices[0]?.finish_reason ?? finish
      if (c.usage) usage = c.usage
    }
    expect(ids.size).toBe(1)
    expect(text.length).toBeGreaterThan(0)
    expect(finish).toBe('stop')
    const sim = simTotals(tr)
    expect(usage?.prompt_tokens).toBe(sim.prompt)
    expect(usage?.completion_tokens).toBe(sim.completion)
    expect(usage?.cost_rub).toBe(costOf(sim.prompt, sim.completion))
    await tr.svc.ledger.flush()
    const rows = (await tr.svc.store.ledgerForOrg(tr.orgId, 0, Date.now() + 1000)).filter(
      (r) => r.kind === 'usage',
    )
    expect(rows).toHaveLength(1)
    expect(rows[0]!.estimated).toBe(false)
    expect(rows[0]!.promptTokens).toBe(sim.prompt)
    expect(rows[0]!.completionTokens).toBe(sim.completion)
  })

  test('the same text streamed and not', async () => {
    const tr = await start([antNode('ant-1')])
    const req = { model: MODEL, max_tokens: 50, messages: [{ role: 'user' as const, content: 'Go on' }] }
    const plain = await tr.client().chat.completions.create(req)
    let text = ''
    for await (const c of await tr.client().chat.completions.create({ ...req, stream: true }))
      text += c.choices[0]?.delta.content ?? ''
    expect(text).toBe(plain.choices[0]!.message.content!)
  })

  test('tools: tool_calls (plain and streamed), then the tool result answered', async () => {
    const tr = await start([antNode('ant-1')])
    const client = tr.client()
    const ask: OpenAI.ChatCompletionCreateParamsNonStreaming = {
      model: MODEL,
      max_tokens: 100,
      tools: [weatherTool],
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    }
    const res = await client.chat.completions.create(ask)
    expect(res.choices[0]!.finish_reason).toBe('tool_calls')
    const call = res.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall
    expect(call.type).toBe('function')
    expect(call.id).toStartWith('toolu_')
    expect(call.function.name).toBe('get_weather')
    const args = JSON.parse(call.function.arguments) as { city: unknown }
    expect(typeof args.city).toBe('string')

    // streamed: the deltas carry index, id and name first, then the argument fragments
    const deltas: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = []
    let finish: string | null = null
    for await (const c of await client.chat.completions.create({
      ...ask,
      stream: true,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    })) {
      deltas.push(...(c.choices[0]?.delta.tool_calls ?? []))
      finish = c.choices[0]?.finish_reason ?? finish
    }
    expect(finish).toBe('tool_calls')
    expect(deltas[0]).toMatchObject({ index: 0, type: 'function', function: { name: 'get_weather' } })
    expect(deltas.every((d) => d.index === 0)).toBe(true)
    expect(JSON.parse(deltas.map((d) => d.function?.arguments ?? '').join(''))).toEqual(args)

    const after = await client.chat.completions.create({
      ...ask,
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'tool', tool_call_id: call.id, content: 'sunny, 21C' },
      ],
    })
    expect(after.choices[0]!.finish_reason).toBe('stop')
    expect(after.choices[0]!.message.content!.length).toBeGreaterThan(0)
    const sim = simTotals(tr)
    expect(after.usage!.prompt_tokens).toBeGreaterThan(res.usage!.prompt_tokens)
    expect(res.usage!.prompt_tokens + after.usage!.prompt_tokens).toBeLessThan(sim.prompt)
  })

  test('system and developer messages reach the node as its system prompt', async () => {
    const tr = await start([antNode('ant-1')])
    const ask = (messages: OpenAI.ChatCompletionMessageParam[]) =>
      tr.client().chat.completions.create({ model: MODEL, max_tokens: 5, messages })
    const bare = await ask([{ role: 'user', content: 'hi' }])
    // A system role inside the messages would be a 400 from the Messages API: it is lifted out.
    const withSystem = await ask([
      { role: 'system', content: 'You are terse and exact in every answer you give.' },
      { role: 'developer', content: 'Answer in English.' },
      { role: 'user', content: 'hi' },
    ])
    expect(withSystem.usage!.prompt_tokens).toBeGreaterThan(bare.usage!.prompt_tokens + 5)
  })

  test('image parts: a data URL and an https URL both reach the node', async () => {
    const tr = await start([antNode('ant-1')])
    const png =
      'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='
    const ask = (content: OpenAI.ChatCompletionContentPart[]) =>
      tr.client().chat.completions.create({
        model: MODEL,
        max_tokens: 5,
        messages: [{ role: 'user', content }],
      })
    const text = await ask([{ type: 'text', text: 'What is this?' }])
    const images = await ask([
      { type: 'image_url', image_url: { url: png } },
      { type: 'image_url', image_url: { url: 'https://example.com/cat.png' } },
      { type: 'text', text: 'What is this?' },
    ])
    // The simulator counts 85 tokens an image.
    expect(images.usage!.prompt_tokens - text.usage!.prompt_tokens).toBe(170)
    const bad = await ask([{ type: 'image_url', image_url: { url: 'data:image/bmp;base64,AAAA' } }]).catch(
      (e) => e,
    )
    expect(bad).toBeInstanceOf(OpenAI.BadRequestError)
  })

  test('stop: the text ends before the stop sequence, finish stop (plain and streamed)', async () => {
    const tr = await start([antNode('ant-1')])
    const req = { model: MODEL, max_tokens: 60, messages: [{ role: 'user' as const, content: 'Go on' }] }
    const full = (await tr.client().chat.completions.create(req)).choices[0]!.message.content!
    const stop = ` ${full.split(' ')[3]}`
    const cut = await tr.client().chat.completions.create({ ...req, stop })
    expect(cut.choices[0]!.message.content).toBe(full.slice(0, full.indexOf(stop)))
    expect(cut.choices[0]!.finish_reason).toBe('stop')
    let text = ''
    for await (const c of await tr.client().chat.completions.create({ ...req, stop: [stop], stream: true }))
      text += c.choices[0]?.delta.content ?? ''
    expect(text).toBe(full.slice(0, full.indexOf(stop)))
  })
})

describe('what Anthropic cannot do', () => {
  test('n > 1, logprobs, response_format json: a 400 naming the field; the node is not blamed', async () => {
    const tr = await start([antNode('ant-1')])
    const base = { model: MODEL, max_tokens: 5, messages: [{ role: 'user' as const, content: 'hi' }] }
    for (const [extra, param] of [
      [{ n: 2 }, 'n'],
      [{ logprobs: true }, 'logprobs'],
      [{ response_format: { type: 'json_object' } }, 'response_format'],
      [{ n: 3 }, 'n'],
      [{ temperature: 1.5 }, 'temperature'],
    ] as const) {
      const err = await tr
        .client()
        .chat.completions.create({ ...base, ...extra } as OpenAI.ChatCompletionCreateParamsNonStreaming)
        .catch((e) => e)
      expect(err).toBeInstanceOf(OpenAI.BadRequestError)
      expect(err.code).toBe('invalid_value')
      expect(err.param).toBe(param)
    }
    // Five refusals in a row did not eject the node (it never saw them), and it serves the next.
    const metrics = await (await fetch(`${tr.url}/metrics`)).text()
    expect(metrics).toContain('tropa_upstream_ejected{node="ant-1"} 0')
    const ok = await tr.client().chat.completions.create(base)
    expect(ok.choices[0]!.message.content!.length).toBeGreaterThan(0)
    await tr.svc.ledger.flush()
    const rows = (await tr.svc.store.ledgerForOrg(tr.orgId, 0, Date.now() + 1000)).filter(
      (r) => r.kind === 'usage',
    )
    expect(rows).toHaveLength(1)
  })

  test('config: an embedding model on an anthropic route, or a route with no key, is refused at start', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tropa-ant-'))
    const path = join(dir, 'c.json')
    writeFileSync(
      path,
      JSON.stringify({
        models: [
          {
            id: 'anthropic/embed',
            kind: 'embedding',
            context_length: 512,
            dimensions: 256,
            pricing: { prompt: '0.000001', completion: '0.000000' },
            routes: [{ provider: 'anthropic', base_url: 'https://api.anthropic.com', api_key_env: 'K' }],
          },
          {
            id: 'anthropic/chat',
            context_length: 512,
            pricing: { prompt: '0.000001', completion: '0.000001' },
            routes: [{ provider: 'anthropic', base_url: 'https://api.anthropic.com' }],
          },
          {
            id: 'anthropic/chat-v1',
            context_length: 512,
            pricing: { prompt: '0.000001', completion: '0.000001' },
            routes: [{ provider: 'anthropic', base_url: 'https://api.anthropic.com/v1/', api_key_env: 'K' }],
          },
          {
            id: 'anthropic/chat-2',
            context_length: 512,
            pricing: { prompt: '0.000001', completion: '0.000001' },
            routes: [
              { provider: 'anthropic', base_url: 'https://api.anthropic.com', headers: { 'X-Api-Key': 'k' } },
            ],
          },
        ],
      }),
    )
    let problems: readonly string[] = []
    try {
      loadConfig({ configPath: path }, { K: 'sk-ant-k' })
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err
      problems = err.problems
    }
    expect(problems.some((p) => p.includes('Anthropic has no embeddings API'))).toBe(true)
    expect(problems.filter((p) => p.includes('needs api_key_env'))).toEqual([
      expect.stringContaining('(anthropic/chat)'),
    ])
    expect(problems.some((p) => p.includes('(anthropic/chat-v1)') && p.includes('ends in /v1'))).toBe(true)
    expect(problems).toHaveLength(3)
  })
})

describe('upstream errors', () => {
  test('a 400 from the Messages API: the client gets a 400 with its message, cleaned', async () => {
    const tr = await start([antNode('ant-1')])
    const err = await tr
      .client()
      .chat.completions.create({
        model: MODEL,
        max_tokens: 5,
        stop: ['   '],
        messages: [{ role: 'user', content: 'hi' }],
      })
      .catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    expect(err.code).toBe('upstream_rejected')
    expect(err.message).toContain('stop_sequences')
    expect(err.message).not.toContain(ANTHROPIC_SIM_KEY)
  })

  // One failing node beside a good one in each case: the attempts a request may make are capped.
  for (const [label, keys, faults] of [
    ['a wrong key (401)', { bad: 'sk-ant-wrong-key' }, {}],
    ['500 api_error', {}, { errorRate: 1 }],
    ['529 overloaded_error', {}, { rate503: 1 }],
  ] as const) {
    test(`a node answering ${label} is failed over`, async () => {
      const failed: string[] = []
      const log: Log = (_l, msg, fields) => {
        if (msg === 'upstream attempt failed') failed.push(String(fields?.node))
      }
      const tr = await start([antNode('bad'), antNode('good')], keys, log)
      tr.nodes[0]!.setFaults(faults)
      for (let i = 0; i < 10; i++) {
        const r = await tr.fetch('/v1/chat/completions', {
          method: 'POST',
          body: JSON.stringify({
            model: MODEL,
            max_tokens: 5,
            stream: i % 2 === 1,
            messages: [{ role: 'user', content: `hi ${i}` }],
          }),
        })
        expect(r.status).toBe(200)
        expect(r.headers.get('x-tropa-node')).toBe('good')
        await r.arrayBuffer()
      }
      expect(failed.length).toBeGreaterThan(0)
      expect(new Set(failed)).toEqual(new Set(['bad']))
    })
  }

  test('an upstream killed mid-stream: one error event, no [DONE], the sent tokens billed', async () => {
    const tr = await start([antNode('cut', { timeScale: 1, itlMs: 2, faults: { cutAfterTokens: 3 } })])
    const res = await tr.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({
        model: MODEL,
        max_tokens: 40,
        stream: true,
        messages: [{ role: 'user', content: 'Tell me a story' }],
      }),
    })
    expect(res.status).toBe(200)
    const events = (await res.text()).split('\n\n').filter(Boolean)
    const last = JSON.parse(events.at(-1)!.slice(6)) as { error?: { code: string } }
    expect(last.error?.code).toBe('upstream_error')
    expect(events.some((e) => e === 'data: [DONE]')).toBe(false)
    expect(events.filter((e) => e.includes('"content":"') && !e.includes('"content":""'))).toHaveLength(3)
    await tr.svc.ledger.flush()
    const rows = (await tr.svc.store.ledgerForOrg(tr.orgId, 0, Date.now() + 1000)).filter(
      (r) => r.kind === 'usage',
    )
    expect(rows).toHaveLength(1)
    expect(rows[0]!.estimated).toBe(true)
    expect(rows[0]!.completionTokens).toBe(3)
  })

  test('an error event from the Messages API: first, it fails over; mid-stream, the client stream ends with an error', async () => {
    const ev = (type: string, data: Record<string, unknown>) =>
      `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`
    const start = ev('message_start', {
      message: {
        id: 'msg_f',
        type: 'message',
        role: 'assistant',
        model: 'x',
        content: [],
        usage: { input_tokens: 5, output_tokens: 1 },
      },
    })
    const overloaded = ev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } })
    const fake = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      fetch(req) {
        const first = new URL(req.url).pathname.startsWith('/first')
        const body = first
          ? overloaded
          : start +
            ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }) +
            ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hello there' } }) +
            overloaded
        return new Response(body, { headers: { 'content-type': 'text/event-stream' } })
      },
    })
    try {
      const route = (name: string, base: string) => ({
        name,
        provider: 'anthropic' as const,
        base_url: base,
        upstream_model: 'x',
        hedge: false,
        headers: { 'x-api-key': ANTHROPIC_SIM_KEY },
      })
      const fakeUrl = `http://127.0.0.1:${fake.port}`
      const failed: string[] = []
      t = await startTropa({
        log: (_l, msg, fields) => {
          if (msg === 'upstream attempt failed') failed.push(String(fields?.node))
        },
        nodes: [antNode('good')],
        models: (nodes) => [
          {
            id: MODEL,
            context_length: 8192,
            pricing: CHAT_PRICE,
            routes: [
              route('error-first', `${fakeUrl}/first`),
              route('good', nodes[0]!.url.replace(/\/v1$/, '')),
            ],
          },
          {
            id: 'anthropic/mid',
            context_length: 8192,
            pricing: CHAT_PRICE,
            routes: [route('error-mid', `${fakeUrl}/mid`)],
          },
        ],
      })
      const tr = t
      const post = (model: string) =>
        tr.fetch('/v1/chat/completions', {
          method: 'POST',
          body: JSON.stringify({
            model,
            max_tokens: 20,
            stream: true,
            messages: [{ role: 'user', content: 'hi' }],
          }),
        })
      for (let i = 0; i < 10; i++) {
        const r = await post(MODEL)
        expect(r.status).toBe(200)
        expect(r.headers.get('x-tropa-node')).toBe('good')
        expect(await r.text()).toContain('data: [DONE]')
      }
      expect(failed).toContain('error-first')
      const r = await post('anthropic/mid')
      const events = (await r.text()).split('\n\n').filter(Boolean)
      expect(events.some((e) => e.includes('"content":"Hello there"'))).toBe(true)
      expect(JSON.parse(events.at(-1)!.slice(6)).error.code).toBe('upstream_error')
      expect(events.includes('data: [DONE]')).toBe(false)
      await tr.svc.ledger.flush()
      const rows = (await tr.svc.store.ledgerForOrg(tr.orgId, 0, Date.now() + 1000)).filter(
        (row) => row.kind === 'usage' && row.model === 'anthropic/mid',
      )
      expect(rows).toHaveLength(1)
      expect(rows[0]!.estimated).toBe(true)
      expect(rows[0]!.completionTokens).toBeGreaterThan(0)
    } finally {
      fake.stop(true)
    }
  })

  test('a node that sends no headers in time is failed over (first-byte timeout)', async () => {
    const hung = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      idleTimeout: 0,
      fetch: (req) =>
        new Promise<Response>((resolve) =>
          req.signal.addEventListener('abort', () => resolve(new Response(null, { status: 499 }))),
        ),
    })
    try {
      t = await startTropa({
        upstream: { first_byte_timeout_ms: 300 },
        nodes: [antNode('good')],
        models: (nodes) => [
          {
            id: MODEL,
            context_length: 8192,
            pricing: CHAT_PRICE,
            routes: [
              {
                name: 'hung',
                provider: 'anthropic',
                base_url: `http://127.0.0.1:${hung.port}`,
                upstream_model: 'x',
                hedge: false,
                headers: { 'x-api-key': ANTHROPIC_SIM_KEY },
              },
              {
                name: 'good',
                provider: 'anthropic',
                base_url: nodes[0]!.url.replace(/\/v1$/, ''),
                upstream_model: 'x',
                hedge: false,
                headers: { 'x-api-key': ANTHROPIC_SIM_KEY },
              },
            ],
          },
        ],
      })
      for (let i = 0; i < 4; i++) {
        const stream = i % 2 === 0
        const r = await t.fetch('/v1/chat/completions', {
          method: 'POST',
          body: JSON.stringify({
            model: MODEL,
            max_tokens: 5,
            stream,
            messages: [{ role: 'user', content: 'hi' }],
          }),
        })
        expect(r.status).toBe(200)
        expect(r.headers.get('x-tropa-node')).toBe('good')
        await r.arrayBuffer()
      }
    } finally {
      hung.stop(true)
    }
  })

  test('an upstream that only pings after message_start: the idle deadline ends the stream', async () => {
    const ping = new TextEncoder().encode('event: ping\ndata: {"type":"ping"}\n\n'.repeat(100))
    const start = `event: message_start\ndata: ${JSON.stringify({
      type: 'message_start',
      message: {
        id: 'msg_p',
        type: 'message',
        role: 'assistant',
        model: 'x',
        content: [],
        usage: { input_tokens: 3, output_tokens: 1 },
      },
    })}\n\n`
    const pinger = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      idleTimeout: 0,
      fetch: () => {
        let timer: ReturnType<typeof setInterval> | undefined
        return new Response(
          new ReadableStream({
            start(c) {
              c.enqueue(new TextEncoder().encode(start))
              timer = setInterval(() => c.enqueue(ping), 5)
            },
            cancel() {
              clearInterval(timer)
            },
          }),
          { headers: { 'content-type': 'text/event-stream' } },
        )
      },
    })
    try {
      t = await startTropa({
        upstream: { idle_timeout_ms: 500 },
        nodes: [antNode('unused')],
        models: () => [
          {
            id: MODEL,
            context_length: 8192,
            pricing: CHAT_PRICE,
            routes: [
              {
                name: 'pinger',
                provider: 'anthropic',
                base_url: `http://127.0.0.1:${pinger.port}`,
                upstream_model: 'x',
                headers: { 'x-api-key': ANTHROPIC_SIM_KEY },
              },
            ],
          },
        ],
      })
      const r = await t.fetch('/v1/chat/completions', {
        method: 'POST',
        body: JSON.stringify({
          model: MODEL,
          max_tokens: 5,
          stream: true,
          messages: [{ role: 'user', content: 'hi' }],
        }),
      })
      expect(r.status).toBe(200)
      const events = (await r.text()).split('\n\n').filter(Boolean)
      expect(JSON.parse(events.at(-1)!.slice(6)).error.code).toBe('upstream_timeout')
      // and the router is still answering
      expect((await fetch(`${t.url}/health`)).status).toBe(200)
    } finally {
      pinger.stop(true)
    }
  })
})
