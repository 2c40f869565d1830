import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { encode } from 'gpt-tokenizer'
import OpenAI from 'openai'
import { startTropa, type Tropa } from '../helpers/start.ts'

let t: Tropa
let client: OpenAI
beforeAll(async () => {
  t = await startTropa()
  client = t.client()
})
afterAll(() => t.stop())

const messages = [{ role: 'user' as const, content: 'Tell me about routers.' }]

describe('chat completions through the official SDK', () => {
  test('non-streaming: our id, catalogue model, usage, node header', async () => {
    const { data, response } = await client.chat.completions
      .create({ model: 'test/chat', messages, max_tokens: 20 })
      .withResponse()
    expect(data.object).toBe('chat.completion')
    expect(data.id).toMatch(/^chatcmpl-[0-9A-Za-z]{24}$/)
    expect(data.id.slice('chatcmpl-'.length)).toBe(response.headers.get('x-request-id')!)
    expect(data.model).toBe('test/chat')
    expect(data.choices[0]!.message.role).toBe('assistant')
    expect(data.choices[0]!.message.content!.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(data.choices[0]!.finish_reason)
    expect(data.usage!.completion_tokens).toBeGreaterThan(0)
    expect(data.usage!.completion_tokens).toBeLessThanOrEqual(20)
    expect(data.usage!.total_tokens).toBe(data.usage!.prompt_tokens + data.usage!.completion_tokens)
    expect(t.nodes.map((n) => n.name)).toContain(response.headers.get('x-tropa-node')!)
    expect(response.headers.get('x-tropa-cost-rub')).toMatch(/^\d+\.\d{6}$/)
  })

  test('max_tokens cuts the answer with finish_reason length', async () => {
    const r = await client.chat.completions.create({ model: 'test/chat', messages, max_tokens: 2 })
    expect(r.choices[0]!.finish_reason).toBe('length')
    expect(r.usage!.completion_tokens).toBe(2)
  })

  test('streaming: chunks, our id and model, [DONE], no usage chunk unless asked', async () => {
    const res = await t.fetch('/v1/chat/completions', {
      method: 'POST',
      body: JSON.stringify({ model: 'test/chat', messages, stream: true, max_tokens: 12 }),
    })
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toContain('text/event-stream')
    const text = await res.text()
    const events = text.split('\n\n').filter(Boolean)
    expect(events.at(-1)).toBe('data: [DONE]')
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)))
    const id = `chatcmpl-${res.headers.get('x-request-id')}`
    for (const c of chunks) {
      expect(c.id).toBe(id)
      expect(c.model).toBe('test/chat')
      expect(c.object).toBe('chat.completion.chunk')
      expect(c.choices.length).toBe(1)
    }
  })

  test('streaming with include_usage: the usage chunk comes last and matches the text', async () => {
    const stream = await client.chat.completions.create({
      model: 'test/chat',
      messages,
      stream: true,
      stream_options: { include_usage: true },
    })
    let content = ''
    let usage: OpenAI.CompletionUsage | undefined | null
    let chunksAfterUsage = 0
    for await (const chunk of stream) {
      if (usage) chunksAfterUsage++
      content += chunk.choices[0]?.delta.content ?? ''
      if (chunk.usage) usage = chunk.usage
    }
    expect(usage).toBeDefined()
    expect(chunksAfterUsage).toBe(0)
    expect(usage!.completion_tokens).toBe(encode(content).length)
  })

  test('a tool-call round trip', async () => {
    const tools: OpenAI.ChatCompletionTool[] = [
      {
        type: 'function',
        function: {
          name: 'get_weather',
          description: 'weather in a city',
          parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } },
        },
      },
    ]
    const first = await client.chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: 'Weather in Kazan?' }],
      tools,
    })
    const call = first.choices[0]!.message.tool_calls?.[0]
    expect(first.choices[0]!.finish_reason).toBe('tool_calls')
    expect(call?.type).toBe('function')
    if (call?.type !== 'function') throw new Error('no function call')
    expect(call.function.name).toBe('get_weather')
    expect(JSON.parse(call.function.arguments)).toEqual({ city: 'sim', days: 1 })
    const second = await client.chat.completions.create({
      model: 'test/chat',
      messages: [
        { role: 'user', content: 'Weather in Kazan?' },
        first.choices[0]!.message,
        { role: 'tool', tool_call_id: call.id, content: '{"temp": -3}' },
      ],
      tools,
    })
    expect(second.choices[0]!.finish_reason).not.toBe('tool_calls')
    expect(second.choices[0]!.message.content!.length).toBeGreaterThan(0)
  })

  test('streamed tool calls arrive as OpenAI deltas', async () => {
    const stream = client.chat.completions.stream({
      model: 'test/chat',
      messages: [{ role: 'user', content: 'Weather?' }],
      tools: [
        {
          type: 'function',
          function: { name: 'lookup', parameters: { type: 'object', properties: { q: { type: 'string' } } } },
        },
      ],
    })
    const final = await stream.finalChatCompletion()
    const call = final.choices[0]!.message.tool_calls?.[0]
    expect(call?.type === 'function' && call.function.name).toBe('lookup')
    expect(call?.type === 'function' && JSON.parse(call.function.arguments)).toEqual({ q: 'sim' })
  })

  test('an image part passes through and counts in the prompt', async () => {
    const plain = await client.chat.completions.create({
      model: 'test/chat',
      messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }] }],
      max_tokens: 5,
    })
    const withImage = await client.chat.completions.create({
      model: 'test/chat',
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'What is this?' },
            { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } },
          ],
        },
      ],
      max_tokens: 5,
    })
    expect(withImage.usage!.prompt_tokens).toBe(plain.usage!.prompt_tokens + 85)
  })

  test('the same seed gives the same answer; unknown fields pass through', async () => {
    const body = { model: 'test/chat', messages, seed: 42, max_tokens: 16, some_vendor_field: { x: 1 } }
    const a = await client.chat.completions.create(body as OpenAI.ChatCompletionCreateParamsNonStreaming)
    const b = await client.chat.completions.create(body as OpenAI.ChatCompletionCreateParamsNonStreaming)
    expect(a.choices[0]!.message.content).toBe(b.choices[0]!.message.content)
  })
})

describe('catalogue', () => {
  test('lists models with context length and six-digit rouble prices', async () => {
    const list = await client.models.list()
    const chat = list.data.find((m) => m.id === 'test/chat') as unknown as Record<string, unknown>
    expect(chat).toEqual({
      id: 'test/chat',
      object: 'model',
      created: expect.any(Number),
      owned_by: 'test',
      context_length: 4096,
      pricing: { prompt: '0.000030', completion: '0.000060', cached_prompt: '0.000030' },
    })
  })

  test('one model by id (ids contain a slash)', async () => {
    const m = await client.models.retrieve('test/embed')
    expect(m.id).toBe('test/embed')
    const err = await client.models.retrieve('test/nope').catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.NotFoundError)
    expect(err.code).toBe('model_not_found')
  })
})
