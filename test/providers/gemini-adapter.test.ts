import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type OpenAI from 'openai'
import { ConfigError, loadConfig, OPENAI_ROUTE } from '../../src/config/load.ts'
import { UpstreamFailed } from '../../src/errors.ts'
import { GeminiAdapter } from '../../src/upstream/providers/gemini/adapter.ts'
import { Watchdog } from '../../src/upstream/watchdog.ts'
import { CHAT_PRICE, startTropa, type Tropa } from '../helpers/start.ts'

// The gemini adapter against a scripted Gemini server that records what it was sent and answers
// what a test asks: the exact request mapping, the reply fields the simulator never produces
// (thought signatures, thinking tokens, blocked prompts), and hostile or broken streams.

interface Seen {
  url: string
  headers: Headers
  body: Record<string, unknown>
}
let seen: Seen | undefined
let answer: (url: URL) => Response = () => new Response('{}')
const server = Bun.serve({
  port: 0,
  hostname: '127.0.0.1',
  async fetch(req) {
    seen = { url: req.url, headers: req.headers, body: (await req.json()) as Record<string, unknown> }
    return answer(new URL(req.url))
  },
})
const root = `http://127.0.0.1:${server.port}`

const sse = (events: string[]) =>
  new Response(
    new ReadableStream({
      start(c) {
        for (const e of events) c.enqueue(new TextEncoder().encode(e))
        c.close()
      },
    }),
    { headers: { 'content-type': 'text/event-stream' } },
  )
const gemError = (code: number, status: string, message: string) =>
  Response.json({ error: { code, message, status } }, { status: code })

let t: Tropa
beforeAll(async () => {
  t = await startTropa({
    nodes: [],
    models: () => [
      {
        id: 'google/scripted',
        kind: 'chat',
        context_length: 8192,
        pricing: CHAT_PRICE,
        routes: [
          {
            name: 'scripted',
            provider: 'gemini',
            base_url: `${root}/`,
            upstream_model: 'gemini-2.5-pro',
            headers: { 'x-goog-api-key': 'AIza-test' },
          },
        ],
      },
    ],
  })
})
afterAll(async () => {
  await t.stop()
  server.stop(true)
})

const chat = (extra: Record<string, unknown>) =>
  t.fetch('/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify({ model: 'google/scripted', messages: [{ role: 'user', content: 'hi' }], ...extra }),
  })

describe('the request Gemini gets', () => {
  test('system, developer, images, tool calls with a thought signature, tool results, tools, tool_choice, generation config', async () => {
    answer = () =>
      Response.json({
        candidates: [{ content: { role: 'model', parts: [{ text: 'ok' }] }, finishReason: 'STOP', index: 0 }],
        usageMetadata: { promptTokenCount: 10, candidatesTokenCount: 1, totalTokenCount: 11 },
      })
    const schema = { type: 'object', properties: { a: { type: 'string' } } }
    const res = await chat({
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'developer', content: [{ type: 'text', text: 'Use metric units.' }] },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Look:' },
            { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } },
            { type: 'image_url', image_url: { url: 'https://example.com/cat.JPG?x=1' } },
          ],
        },
        {
          role: 'assistant',
          content: 'Checking.',
          tool_calls: [
            {
              id: 'call_a~ts~SIG1',
              type: 'function',
              function: { name: 'get_weather', arguments: '{"city":"Paris"}' },
            },
            { id: 'call_b', type: 'function', function: { name: 'get_time', arguments: '' } },
          ],
        },
        { role: 'tool', tool_call_id: 'call_a~ts~SIG1', content: '{"temp_c":21}' },
        { role: 'tool', tool_call_id: 'call_b', content: 'noon' },
      ],
      tools: [
        { type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: schema } },
        { type: 'function', function: { name: 'get_time' } },
      ],
      tool_choice: 'required',
      max_tokens: 50,
      temperature: 0.5,
      top_p: 0.9,
      seed: 3,
      stop: 'END',
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
    })
    expect(res.status).toBe(200)
    expect(seen!.url).toBe(`${root}/v1beta/models/gemini-2.5-pro:generateContent`)
    expect(seen!.headers.get('x-goog-api-key')).toBe('AIza-test')
    expect(seen!.headers.get('authorization')).toBeNull()
    expect(seen!.body).toEqual({
      systemInstruction: { parts: [{ text: 'Be brief.' }, { text: 'Use metric units.' }] },
      contents: [
        {
          role: 'user',
          parts: [
            { text: 'Look:' },
            { inlineData: { mimeType: 'image/png', data: 'iVBORw0KGgo=' } },
            { fileData: { fileUri: 'https://example.com/cat.JPG?x=1', mimeType: 'image/jpeg' } },
          ],
        },
        {
          role: 'model',
          parts: [
            { text: 'Checking.' },
            { functionCall: { name: 'get_weather', args: { city: 'Paris' } }, thoughtSignature: 'SIG1' },
            { functionCall: { name: 'get_time', args: {} } },
          ],
        },
        {
          role: 'user',
          parts: [
            { functionResponse: { name: 'get_weather', response: { temp_c: 21 } } },
            { functionResponse: { name: 'get_time', response: { output: 'noon' } } },
          ],
        },
      ],
      tools: [
        {
          functionDeclarations: [
            { name: 'get_weather', description: 'Weather', parametersJsonSchema: schema },
            { name: 'get_time' },
          ],
        },
      ],
      toolConfig: { functionCallingConfig: { mode: 'ANY' } },
      generationConfig: {
        maxOutputTokens: 50,
        temperature: 0.5,
        topP: 0.9,
        seed: 3,
        stopSequences: ['END'],
        responseMimeType: 'application/json',
        responseJsonSchema: schema,
      },
    })
  })

  test('tool_choice none / a named function; json_object', async () => {
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }]
    await chat({ tools, tool_choice: 'none', response_format: { type: 'json_object' } })
    expect(seen!.body.toolConfig).toEqual({ functionCallingConfig: { mode: 'NONE' } })
    expect((seen!.body.generationConfig as Record<string, unknown>).responseMimeType).toBe('application/json')
    await chat({ tools, tool_choice: { type: 'function', function: { name: 'f' } } })
    expect(seen!.body.toolConfig).toEqual({
      functionCallingConfig: { mode: 'ANY', allowedFunctionNames: ['f'] },
    })
    await chat({ tools, tool_choice: 'auto' })
    expect(seen!.body.toolConfig).toEqual({ functionCallingConfig: { mode: 'AUTO' } })
  })

  test('an http image URL that does not parse is a 400 naming it, not a 500', async () => {
    const res = await chat({
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://[::1' } }] }],
    })
    expect(res.status).toBe(400)
    const body = (await res.json()) as { error: { param: string } }
    expect(body.error.param).toBe('messages[0].content[0].image_url.url')
  })

  test('the route key goes in x-goog-api-key, the path under /v1beta/models', async () => {
    answer = () =>
      Response.json({
        candidates: [{ content: { role: 'model', parts: [{ text: 'ok' }] }, finishReason: 'STOP', index: 0 }],
      })
    const adapter = new GeminiAdapter(new Watchdog())
    const route = {
      ...OPENAI_ROUTE,
      node: 'direct',
      provider: 'gemini',
      baseUrl: root,
      upstreamModel: 'gemini-x',
      apiKey: 'AIza-KEY',
    }
    const reply = await adapter.send(
      {
        route: route as never,
        path: '/chat/completions',
        body: '{"model":"gemini-x","messages":[{"role":"user","content":"hi"}]}',
        stream: false,
      },
      new AbortController(),
      Date.now() + 5000,
    )
    const body = (await reply.response.json()) as {
      choices: { message: { content: string } }[]
      usage?: unknown
    }
    expect(body.choices[0]!.message.content).toBe('ok')
    expect(body.usage).toBeUndefined()
    expect(seen!.headers.get('x-goog-api-key')).toBe('AIza-KEY')
    expect(seen!.url).toBe(`${root}/v1beta/models/gemini-x:generateContent`)
  })
})

describe('the reply Gemini sends', () => {
  test('a function call with a thought signature, thinking and cached tokens', async () => {
    answer = () =>
      Response.json({
        candidates: [
          {
            content: {
              role: 'model',
              parts: [
                { text: 'thinking about it', thought: true },
                { functionCall: { name: 'get_weather', args: { city: 'Oslo' } }, thoughtSignature: 'SIG2' },
              ],
            },
            finishReason: 'STOP',
            index: 0,
          },
        ],
        usageMetadata: {
          promptTokenCount: 40,
          candidatesTokenCount: 4,
          thoughtsTokenCount: 6,
          cachedContentTokenCount: 32,
          totalTokenCount: 50,
        },
        modelVersion: 'gemini-2.5-pro',
        responseId: 'abc',
      })
    const r = await t.client().chat.completions.create({
      model: 'google/scripted',
      messages: [{ role: 'user', content: 'Weather in Oslo?' }],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }],
    })
    const c = r.choices[0]!
    expect(c.finish_reason).toBe('tool_calls')
    expect(c.message.content).toBeNull()
    const call = c.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall
    expect(call.id.endsWith('~ts~SIG2')).toBe(true)
    expect(JSON.parse(call.function.arguments)).toEqual({ city: 'Oslo' })
    expect(r.usage).toMatchObject({
      prompt_tokens: 40,
      completion_tokens: 10,
      total_tokens: 50,
      prompt_tokens_details: { cached_tokens: 32 },
    })
    expect(r.model).toBe('google/scripted')
  })

  test('finish reasons: MAX_TOKENS -> length, SAFETY -> content_filter, a blocked prompt -> content_filter', async () => {
    for (const [reason, want] of [
      ['MAX_TOKENS', 'length'],
      ['SAFETY', 'content_filter'],
      ['RECITATION', 'content_filter'],
    ] as const) {
      answer = () =>
        Response.json({
          candidates: [
            { content: { role: 'model', parts: [{ text: 'x' }] }, finishReason: reason, index: 0 },
          ],
          usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 1, totalTokenCount: 4 },
        })
      const r = await t
        .client()
        .chat.completions.create({ model: 'google/scripted', messages: [{ role: 'user', content: 'hi' }] })
      expect(r.choices[0]!.finish_reason).toBe(want)
    }
    answer = () =>
      Response.json({
        promptFeedback: { blockReason: 'SAFETY' },
        usageMetadata: { promptTokenCount: 3, totalTokenCount: 3 },
      })
    const r = await t
      .client()
      .chat.completions.create({ model: 'google/scripted', messages: [{ role: 'user', content: 'hi' }] })
    expect(r.choices[0]!.finish_reason).toBe('content_filter')
    expect(r.usage).toMatchObject({ prompt_tokens: 3, completion_tokens: 0 })
  })

  test('a streamed reply with CRLF events, a blank text, a function call and usage on every chunk: the last usage bills', async () => {
    answer = (url) => {
      expect(url.pathname).toBe('/v1beta/models/gemini-2.5-pro:streamGenerateContent')
      expect(url.searchParams.get('alt')).toBe('sse')
      const ev = (o: unknown) => `data: ${JSON.stringify(o)}\r\n\r\n`
      const content = (parts: unknown[]) => ({ content: { role: 'model', parts }, index: 0 })
      return sse([
        ev({
          candidates: [content([{ text: 'Hel' }])],
          usageMetadata: { promptTokenCount: 7, totalTokenCount: 7 },
        }),
        ev({
          candidates: [content([{ text: 'lo' }])],
          usageMetadata: { promptTokenCount: 7, totalTokenCount: 7 },
        }),
        ev({
          candidates: [
            { ...content([{ functionCall: { name: 'f', args: { a: 1 } } }]), finishReason: 'STOP' },
          ],
          usageMetadata: { promptTokenCount: 7, candidatesTokenCount: 5, totalTokenCount: 12 },
        }),
      ])
    }
    const stream = await t.client().chat.completions.create({
      model: 'google/scripted',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
      stream_options: { include_usage: true },
    })
    let text = ''
    let finish: string | null = null
    let usage: OpenAI.CompletionUsage | undefined | null
    const calls: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = []
    for await (const c of stream) {
      text += c.choices[0]?.delta.content ?? ''
      calls.push(...(c.choices[0]?.delta.tool_calls ?? []))
      finish = c.choices[0]?.finish_reason ?? finish
      usage = c.usage ?? usage
    }
    expect(text).toBe('Hello')
    expect(finish).toBe('tool_calls')
    expect(calls).toHaveLength(1)
    expect(calls[0]!.function).toEqual({ name: 'f', arguments: '{"a":1}' })
    expect(usage).toMatchObject({ prompt_tokens: 7, completion_tokens: 5, total_tokens: 12 })
  })

  const streamed = async () => {
    const res = await chat({ stream: true })
    expect(res.status).toBe(200)
    return (await res.text()).split('\n\n').filter(Boolean)
  }

  test('a stream that ends before a finishReason is broken: an error event, no [DONE]', async () => {
    answer = () => sse([`data: {"candidates":[{"content":{"parts":[{"text":"Hel"}]},"index":0}]}\n\n`])
    const events = await streamed()
    expect(events.includes('data: [DONE]')).toBe(false)
    expect((JSON.parse(events.at(-1)!.slice(6)) as { error?: unknown }).error).toBeDefined()
  })

  test('an error event mid-stream reaches the client as an error event', async () => {
    answer = () =>
      sse([
        `data: {"candidates":[{"content":{"parts":[{"text":"Hel"}]},"index":0}]}\n\n`,
        `data: {"error":{"code":500,"message":"internal","status":"INTERNAL"}}\n\n`,
      ])
    const events = await streamed()
    expect(events.includes('data: [DONE]')).toBe(false)
    expect((JSON.parse(events.at(-1)!.slice(6)) as { error?: unknown }).error).toBeDefined()
  })

  test('an endless event with no end fails the stream at 1 MiB instead of growing a buffer', async () => {
    let sent = 0
    let cancelled = false
    answer = () =>
      new Response(
        new ReadableStream({
          start(c) {
            c.enqueue(
              new TextEncoder().encode(
                'data: {"candidates":[{"content":{"parts":[{"text":"Hel"}]},"index":0}]}\n\n',
              ),
            )
            c.enqueue(new TextEncoder().encode('data: {"candidates":[{"content":{"parts":[{"text":"'))
          },
          pull(c) {
            // Without the cap this would never end: bytes keep coming, so no idle timeout fires.
            sent += 64 * 1024
            c.enqueue(new Uint8Array(64 * 1024).fill(120))
          },
          cancel() {
            cancelled = true
          },
        }),
        { headers: { 'content-type': 'text/event-stream' } },
      )
    const events = await streamed()
    expect(events.includes('data: [DONE]')).toBe(false)
    expect((JSON.parse(events.at(-1)!.slice(6)) as { error?: unknown }).error).toBeDefined()
    // (the sockets read ahead a few MiB; without the cap it runs to the idle timeout, tens of MiB)
    expect(sent).toBeLessThan(16 * 1024 * 1024)
    await Bun.sleep(50)
    expect(cancelled).toBe(true)
  })

  test('a malformed reply is a node failure (502), not a 500', async () => {
    answer = () => new Response('not json', { headers: { 'content-type': 'application/json' } })
    const res = await chat({})
    expect(res.status).toBe(502)
  })
})

describe("Gemini's errors", () => {
  test('400 INVALID_ARGUMENT: the client 400, cleaned', async () => {
    answer = () =>
      gemError(
        400,
        'INVALID_ARGUMENT',
        '* GenerateContentRequest.generation_config.temperature: bad key=AIzaSecret123456789012345',
      )
    const res = await chat({})
    expect(res.status).toBe(400)
    const body = (await res.json()) as { error: { code: string; message: string } }
    expect(body.error.code).toBe('upstream_rejected')
    expect(body.error.message).toContain('temperature')
    expect(body.error.message).not.toContain('AIzaSecret')
  })

  test('node problems fail over (a single node: 502/503): wrong key, unsupported location, 403, 429, 500, 503', async () => {
    const cases = [
      () =>
        Response.json(
          {
            error: {
              code: 400,
              message: 'API key not valid. Please pass a valid API key.',
              status: 'INVALID_ARGUMENT',
              details: [{ '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: 'API_KEY_INVALID' }],
            },
          },
          { status: 400 },
        ),
      () => gemError(400, 'FAILED_PRECONDITION', 'User location is not supported for the API use.'),
      () => gemError(403, 'PERMISSION_DENIED', 'denied'),
      () => gemError(429, 'RESOURCE_EXHAUSTED', 'quota'),
      () => gemError(500, 'INTERNAL', 'oops'),
      () => gemError(503, 'UNAVAILABLE', 'overloaded'),
    ]
    for (const c of cases) {
      answer = c
      const res = await chat({})
      expect([502, 503]).toContain(res.status)
    }
  })

  test('classifyGemini directly: the wrong key is UpstreamFailed with its message kept for the log', async () => {
    const { classifyGemini } = await import('../../src/upstream/providers/gemini/adapter.ts')
    const call = { route: { node: 'n1' } } as never
    const err = classifyGemini(
      call,
      400,
      '{"error":{"code":400,"message":"API key not valid.","status":"INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"}]}}',
    )
    expect(err).toBeInstanceOf(UpstreamFailed)
    expect((err as UpstreamFailed).detail).toContain('API key not valid')
  })
})

describe('gemini routes in the config', () => {
  const load = (baseUrl: string, env: Record<string, string> = { GEMINI_API_KEY: 'AIza-env' }) => {
    const dir = mkdtempSync(join(tmpdir(), 'tropa-gemini-config-'))
    const path = join(dir, 'tropa.json')
    writeFileSync(
      path,
      JSON.stringify({
        models: [
          {
            id: 'google/gemini-2.5-flash',
            context_length: 1_000_000,
            pricing: CHAT_PRICE,
            routes: [{ provider: 'gemini', base_url: baseUrl, api_key_env: 'GEMINI_API_KEY' }],
          },
        ],
      }),
    )
    try {
      return loadConfig({ configPath: path }, env)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }

  test('the API root and api_key_env load; the model name defaults to the id after the provider', () => {
    const route = load('https://generativelanguage.googleapis.com/').models[0]!.routes[0]!
    expect(route).toMatchObject({
      provider: 'gemini',
      baseUrl: 'https://generativelanguage.googleapis.com',
      upstreamModel: 'gemini-2.5-flash',
      apiKey: 'AIza-env',
      metricsUrl: '',
    })
  })

  test('a base_url with the version in it is refused with the fix', () => {
    for (const url of [
      'https://generativelanguage.googleapis.com/v1beta',
      'https://generativelanguage.googleapis.com/v1/',
      'https://generativelanguage.googleapis.com/v1beta/models',
    ]) {
      let err: unknown
      try {
        load(url)
      } catch (e) {
        err = e
      }
      expect(err).toBeInstanceOf(ConfigError)
      expect((err as ConfigError).problems.join('\n')).toContain('must be the API root')
    }
  })
})
